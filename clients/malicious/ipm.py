"""``ipm``: inner-product manipulation (Xie, Koyejo & Gupta, UAI 2020).

Every colluder sends ``-epsilon * mu``, the honest mean update negated and scaled: a small
``epsilon`` (0.1) passes Krum and the median while turning the aggregate's inner product with
the true gradient negative; a large one (100) breaks the mean. ``mu`` is estimated from the
colluders' benign updates (partial knowledge; see ``flowerbed.clients.malicious``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowerbed.clients.core.params import param
from flowerbed.clients.malicious import MALICIOUS, Malicious, View


@MALICIOUS.register(
    "ipm", "Model poisoning: inner-product manipulation, -epsilon * mean benign update"
)
class IPM(Malicious):
    colluding = True

    @dataclass
    class Params:
        epsilon: float = param(0.1, gt=0)

    params: Params

    def craft(self, view: View) -> np.ndarray:
        return -self.params.epsilon * view.benign.mean(0)
