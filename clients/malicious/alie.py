"""``alie``: "A Little Is Enough" (Baruch, Baruch & Goldberg, NeurIPS 2019).

Every colluder sends ``mu - z * sigma``: the coordinate-wise mean and standard deviation of the
honest updates shifted by ``z`` standard deviations, small enough to stay within the honest
spread, so median, trimmed mean and Krum keep it. The paper's ``z``: with n clients of which m
malicious, ``s = floor(n/2 + 1) - m`` honest clients must sit farther from the mean than the
malicious ones for a majority, so ``z = Phi^{-1}((n - s) / n)``. n is the round's sampled clients.

Partial knowledge: ``mu`` and ``sigma`` are estimated from the colluders' benign updates (their
own data), not from the honest clients' updates (see ``flowerbed.clients.malicious``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from flowerbed.clients.core.params import param
from flowerbed.clients.malicious import MALICIOUS, Malicious, View


def alie_z(n: int, m: int) -> float:
    """Baruch et al.'s largest z that still wins a majority: ``Phi^{-1}((n - s) / n)``,
    ``s = floor(n / 2 + 1) - m`` (at least 0.0)."""
    s = math.floor(n / 2 + 1) - m
    return max(float(norm.ppf((n - s) / n)), 0.0) if 0 < s < n else 0.0


@MALICIOUS.register("alie", "Model poisoning: A Little Is Enough, mean - z * std of benign updates")
class ALIE(Malicious):
    colluding = True

    @dataclass
    class Params:
        #: standard deviations of the shift (unset: Baruch et al.'s z from n and m)
        z: float | None = param(None, ge=0)

    params: Params

    def z(self) -> float:
        if self.params.z is not None:
            return self.params.z
        return alie_z(self.ctx.sampled_clients, len(self.ctx.colluders))

    def craft(self, view: View) -> np.ndarray:
        return view.benign.mean(0) - self.z() * view.benign.std(0)
