"""``sign-flip``: the client sends its update negated and scaled, ``-scale * Δ`` (the sign-flipping
attack of ByzFL and FLPoison; Damaskinos et al. 2018, Allen-Zhu et al. 2020)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowerbed.clients.core.params import param
from flowerbed.clients.malicious import MALICIOUS, Malicious, View


@MALICIOUS.register(
    "sign-flip", "Model poisoning: send the trained update negated, -scale * update"
)
class SignFlip(Malicious):
    @dataclass
    class Params:
        scale: float = param(1.0, gt=0)

    params: Params

    def craft(self, view: View) -> np.ndarray:
        return -self.params.scale * view.own
