"""``fedavg``: a thin adapter over Flower's Message-API ``FedAvg``."""

from __future__ import annotations

from flwr.serverapp.strategy import FedAvg

from flowerbed.clients.core.registry import NoParams
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyContext


@STRATEGIES.register("fedavg", "Flower FedAvg: example-weighted mean of client models")
class FedAvgEntry:
    @staticmethod
    def build(params: NoParams, context: StrategyContext) -> FedAvg:
        return FedAvg(**context.sampling.kwargs())
