"""``centered-clipping``: centered clipping around the previous aggregate (Karimireddy, He & Jaggi
2021, "Learning from history for Byzantine robust optimization").

Starting from the previous round's aggregate update ``v`` (zero in the first round), ``L`` times:
``v <- v + (1/n) sum_i (u_i - v) min(1, tau / ||u_i - v||)``. An update far from the centre moves
it by at most ``tau / n``, so a few arbitrarily bad updates shift the aggregate by a bounded amount.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import RecordDict
from flwr.serverapp.strategy import Strategy

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry
from flowerbed.strategies.preaggregation import PreAggregationParams, pre_aggregated
from flowerbed.strategies.robust_common import Combined, RobustFedAvg, clip_rows, norms


class CenteredClipping(RobustFedAvg):
    def __init__(self, tau: float, iterations: int, *, seed: int = 0, **kwargs: object) -> None:
        super().__init__(seed=seed, **kwargs)
        self.tau = tau
        self.iterations = iterations
        self.centre: np.ndarray | None = None  # the previous round's aggregate update

    def combine(self, server_round: int, updates: np.ndarray, contents: list[RecordDict]) -> Combined:  # fmt: skip
        same = self.centre is not None and self.centre.shape == updates.shape[1:]
        v = self.centre.copy() if same and self.centre is not None else np.zeros(updates.shape[1])
        for _ in range(self.iterations):
            v = v + clip_rows(updates - v, self.tau).mean(axis=0)
        self.centre = v
        over = float(np.mean(norms(updates - v) > self.tau))
        return Combined(v, report={"clipped-fraction": over})


@STRATEGIES.register(
    "centered-clipping",
    "centered clipping of updates around the last aggregate (Karimireddy et al. 2021)",
)
class CenteredClippingEntry(StrategyEntry):
    needs = frozenset({Capability.INDIVIDUAL_UPDATES})

    @dataclass
    class Params(PreAggregationParams):
        tau: float = param(1.0, gt=0)  # clipping radius around the centre
        iterations: int = param(3, ge=1)  # L, clipping iterations per round

    params: Params

    def strategy(self) -> Strategy:
        strategy = CenteredClipping(
            self.params.tau,
            self.params.iterations,
            seed=self.ctx.seed,
            **self.ctx.sampling.kwargs(),
        )
        return pre_aggregated(strategy, self.params, self.ctx.seed)
