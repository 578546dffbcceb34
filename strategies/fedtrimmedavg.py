"""``fedtrimmedavg``: a thin adapter over Flower's Message-API ``FedTrimmedAvg``."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.serverapp.strategy import FedTrimmedAvg

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.malicious import AggregationRule
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry


@STRATEGIES.register("fedtrimmedavg", "Flower FedTrimmedAvg: trimmed mean, cut fraction beta")
class FedTrimmedAvgEntry(StrategyEntry):
    needs = frozenset({Capability.INDIVIDUAL_UPDATES})  # a robust rule reads each reply

    @dataclass
    class Params:
        beta: float = param(0.2, ge=0, lt=0.5)

    params: Params

    def strategy(self) -> FedTrimmedAvg:
        return FedTrimmedAvg(beta=self.params.beta, **self.ctx.sampling.kwargs())

    @staticmethod
    def aggregation_rule(params: FedTrimmedAvgEntry.Params) -> AggregationRule:
        """Published to clients: each coordinate's mean after cutting ``beta`` from each end."""
        return AggregationRule("coordinate-wise", trim=params.beta)
