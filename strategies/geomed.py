"""``geomed``: the geometric median of the updates by smoothed Weiszfeld (RFA, Pillutla, Kakade &
Harchaoui 2022, "Robust aggregation for federated learning").

``v = argmin_z sum_i max(nu, ||z - u_i||)``, approximated from the mean by ``R`` Weiszfeld steps
``beta_i = 1 / max(nu, ||v - u_i||)``, ``v <- sum_i beta_i u_i / sum_i beta_i``. Its breakdown
point is 1/2: fewer than half the updates cannot move it arbitrarily far.
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
from flowerbed.strategies.robust_common import Combined, RobustFedAvg, norms


def smoothed_weiszfeld(points: np.ndarray, iterations: int, nu: float) -> tuple[np.ndarray, int]:
    """The smoothed geometric median of the rows and the Weiszfeld steps taken (it stops early
    once a step moves the estimate by less than 1e-10 of its norm)."""
    v = points.mean(axis=0)
    for step in range(1, iterations + 1):
        beta = 1.0 / np.maximum(nu, norms(points - v))
        new = beta @ points / beta.sum()
        moved = float(np.linalg.norm(new - v))
        v = new
        if moved <= 1e-10 * max(float(np.linalg.norm(v)), 1e-30):
            return v, step
    return v, iterations


class GeometricMedian(RobustFedAvg):
    def __init__(self, iterations: int, nu: float, *, seed: int = 0, **kwargs: object) -> None:
        super().__init__(seed=seed, **kwargs)
        self.iterations = iterations
        self.nu = nu

    def combine(self, server_round: int, updates: np.ndarray, contents: list[RecordDict]) -> Combined:  # fmt: skip
        v, steps = smoothed_weiszfeld(updates, self.iterations, self.nu)
        return Combined(v, report={"weiszfeld-steps": steps})


@STRATEGIES.register("geomed", "geometric median of updates by smoothed Weiszfeld (RFA, Pillutla et al. 2022)")  # fmt: skip
class GeomedEntry(StrategyEntry):
    needs = frozenset({Capability.INDIVIDUAL_UPDATES})

    @dataclass
    class Params(PreAggregationParams):
        iterations: int = param(10, ge=1)  # R, Weiszfeld steps at most
        nu: float = param(1e-6, gt=0)  # smoothing: distances below nu count as nu

    params: Params

    def strategy(self) -> Strategy:
        strategy = GeometricMedian(
            self.params.iterations, self.params.nu, seed=self.ctx.seed, **self.ctx.sampling.kwargs()
        )
        return pre_aggregated(strategy, self.params, self.ctx.seed)
