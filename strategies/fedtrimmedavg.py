"""``fedtrimmedavg``: a thin adapter over Flower's Message-API ``FedTrimmedAvg``."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.serverapp.strategy import FedTrimmedAvg

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.malicious import AggregationRule
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyContext


@STRATEGIES.register("fedtrimmedavg", "Flower FedTrimmedAvg: trimmed mean, cut fraction beta")
class FedTrimmedAvgEntry:
    needs = frozenset({Capability.INDIVIDUAL_UPDATES})  # a robust rule reads each reply

    @dataclass
    class Params:
        beta: float = param(0.2, ge=0, lt=0.5)

    @staticmethod
    def build(params: FedTrimmedAvgEntry.Params, context: StrategyContext) -> FedTrimmedAvg:
        return FedTrimmedAvg(beta=params.beta, **context.sampling.kwargs())

    @staticmethod
    def aggregation_rule(params: FedTrimmedAvgEntry.Params) -> AggregationRule:
        """Published to clients: each coordinate's mean after cutting ``beta`` from each end."""
        return AggregationRule("coordinate-wise", trim=params.beta)
