"""``min-sum``: the AGR-agnostic MinSum attack (Shejwalkar & Houmansadr, NDSS 2021).

Every colluder sends ``mu + gamma * p`` with the largest ``gamma`` such that its summed squared
distance to the benign updates is at most the largest such sum of a benign update:
``sum_i ||m - u_i||^2 <= max_i sum_j ||u_i - u_j||^2`` (search and directions in ``shift.py``).
The benign updates are the colluders' own (partial knowledge; see ``flowerbed.clients.malicious``).
"""

from __future__ import annotations

import numpy as np

from flowerbed.clients.malicious import MALICIOUS
from flowerbed.clients.malicious.shift import BoundedShift, pairwise_sq


@MALICIOUS.register("min-sum", "Model poisoning: MinSum, the largest shift within the benign summed distance")  # fmt: skip
class MinSum(BoundedShift):
    def bound(self, benign: np.ndarray) -> float:
        return float(pairwise_sq(benign).sum(1).max())

    def spread(self, benign: np.ndarray, crafted: np.ndarray) -> float:
        return float(((benign - crafted) ** 2).sum())
