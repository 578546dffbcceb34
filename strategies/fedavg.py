"""``fedavg``: a thin adapter over Flower's Message-API ``FedAvg``."""

from __future__ import annotations

from flwr.serverapp.strategy import FedAvg

from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry


@STRATEGIES.register("fedavg", "Flower FedAvg: example-weighted mean of client models")
class FedAvgEntry(StrategyEntry):
    def strategy(self) -> FedAvg:
        return FedAvg(**self.ctx.sampling.kwargs())
