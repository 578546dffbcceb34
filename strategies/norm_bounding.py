"""``norm-bounding``: FedAvg of norm-bounded updates, optionally with Gaussian noise (Sun et al.
2019, "Can you really backdoor federated learning?").

Each client update ``u_i`` is scaled to L2 norm at most ``M``; the server adds the uniform mean of
the clipped updates to the global model, plus ``N(0, sigma^2 I)`` ("weak DP", ``noise_std``):
``w' = w + (1/n) sum_i u_i min(1, M / ||u_i||) + N(0, sigma^2 I)``. A boosted (model-replacement)
update loses its boost; noise blurs what a bounded backdoor update can still write.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import RecordDict

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry
from flowerbed.strategies.robust_common import (
    Combined,
    RobustFedAvg,
    clip_rows,
    noise_rng,
    norms,
)

NOISE_SALT = 53_001


class NormBoundedFedAvg(RobustFedAvg):
    def __init__(
        self, norm_bound: float, noise_std: float, *, seed: int = 0, **kwargs: object
    ) -> None:
        super().__init__(seed=seed, **kwargs)
        self.norm_bound = norm_bound
        self.noise_std = noise_std

    def combine(self, server_round: int, updates: np.ndarray, contents: list[RecordDict]) -> Combined:  # fmt: skip
        clipped = clip_rows(updates, self.norm_bound)
        update = clipped.mean(axis=0)
        if self.noise_std > 0:
            rng = noise_rng(self.seed, server_round, NOISE_SALT)
            update = update + rng.normal(0.0, self.noise_std, size=update.shape)
        over = float(np.mean(norms(updates) > self.norm_bound))
        return Combined(update, report={"clipped-fraction": over})


@STRATEGIES.register(
    "norm-bounding",
    "FedAvg of updates clipped to L2 norm M, optional Gaussian noise (Sun et al. 2019)",
)
class NormBoundingEntry(StrategyEntry):
    needs = frozenset({Capability.INDIVIDUAL_UPDATES})

    @dataclass
    class Params:
        norm_bound: float = param(1.0, gt=0)  # M, the largest update norm that passes unscaled
        noise_std: float = param(0.0, ge=0)  # sigma of the Gaussian noise on the aggregate

    params: Params

    def strategy(self) -> NormBoundedFedAvg:
        return NormBoundedFedAvg(
            self.params.norm_bound,
            self.params.noise_std,
            seed=self.ctx.seed,
            **self.ctx.sampling.kwargs(),
        )
