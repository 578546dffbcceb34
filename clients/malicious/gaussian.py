"""``gaussian``: the client sends Gaussian noise instead of its update, ``N(mean, std^2 I)``
(the Gaussian attack of ByzFL and FLPoison; Blanchard et al. 2017)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowerbed.clients.core.params import param
from flowerbed.clients.malicious import MALICIOUS, Malicious, View


@MALICIOUS.register("gaussian", "Model poisoning: send Gaussian noise N(mean, std^2) as the update")
class Gaussian(Malicious):
    @dataclass
    class Params:
        mean: float = param(0.0, gt=float("-inf"), lt=float("inf"))
        std: float = param(1.0, gt=0)

    params: Params

    def craft(self, view: View) -> np.ndarray:
        return view.rng.normal(self.params.mean, self.params.std, size=view.own.shape)
