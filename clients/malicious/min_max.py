"""``min-max``: the AGR-agnostic MinMax attack (Shejwalkar & Houmansadr, NDSS 2021).

Every colluder sends ``mu + gamma * p`` with the largest ``gamma`` such that its largest distance
to a benign update is at most the largest distance between two benign updates:
``max_i ||m - u_i|| <= max_{i,j} ||u_i - u_j||`` (search and directions in ``shift.py``). The
benign updates are the colluders' own (partial knowledge; see ``flowerbed.clients.malicious``).
"""

from __future__ import annotations

import numpy as np

from flowerbed.clients.malicious import MALICIOUS
from flowerbed.clients.malicious.shift import BoundedShift, pairwise_sq


@MALICIOUS.register("min-max", "Model poisoning: MinMax, the largest shift within the benign max distance")  # fmt: skip
class MinMax(BoundedShift):
    def bound(self, benign: np.ndarray) -> float:
        return float(pairwise_sq(benign).max())

    def spread(self, benign: np.ndarray, crafted: np.ndarray) -> float:
        return float(((benign - crafted) ** 2).sum(1).max())
