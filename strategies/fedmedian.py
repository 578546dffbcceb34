"""``fedmedian``: a thin adapter over Flower's Message-API ``FedMedian``."""

from __future__ import annotations

from flwr.serverapp.strategy import FedMedian

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.registry import NoParams
from flowerbed.clients.malicious import AggregationRule
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry


@STRATEGIES.register("fedmedian", "Flower FedMedian: coordinate-wise median (robust)")
class FedMedianEntry(StrategyEntry):
    needs = frozenset({Capability.INDIVIDUAL_UPDATES})  # a robust rule reads each reply

    def strategy(self) -> FedMedian:
        return FedMedian(**self.ctx.sampling.kwargs())

    @staticmethod
    def aggregation_rule(params: NoParams) -> AggregationRule:
        """Published to clients: each coordinate's median (a trim of one half)."""
        return AggregationRule("coordinate-wise", trim=0.5)
