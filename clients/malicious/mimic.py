"""``mimic``: every colluder sends one and the same benign update (Karimireddy, He & Jaggi,
ICLR 2022), over-representing one client's data to exploit heterogeneity.

The mimicked update is the benign update lying farthest along the top principal direction of the
benign updates (the paper's choice, which maximises the heterogeneity it injects), chosen among
the colluders' own benign updates (partial knowledge; see ``flowerbed.clients.malicious``).
"""

from __future__ import annotations

import numpy as np

from flowerbed.clients.malicious import MALICIOUS, Malicious, View


@MALICIOUS.register("mimic", "Model poisoning: all colluders send the most heterogeneous benign update")  # fmt: skip
class Mimic(Malicious):
    colluding = True

    def craft(self, view: View) -> np.ndarray:
        centred = view.benign - view.benign.mean(0)
        if len(centred) < 2 or not np.any(centred):
            return view.benign[0]
        top = np.linalg.svd(centred, full_matrices=False)[2][0]
        return view.benign[int(np.argmax(np.abs(centred @ top)))]
