"""``fedavgm``: a thin adapter over Flower's Message-API ``FedAvgM``."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from flwr.serverapp.strategy import FedAvgM

from flowerbed.clients.core.params import param
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry


@STRATEGIES.register("fedavgm", "Flower FedAvgM: FedAvg with server momentum")
class FedAvgMEntry(StrategyEntry):
    @dataclass
    class Params:
        server_learning_rate: float = param(1.0, gt=0)
        server_momentum: float = param(0.9, ge=0, lt=1)

    params: Params

    def strategy(self) -> FedAvgM:
        return FedAvgM(**asdict(self.params), **self.ctx.sampling.kwargs())
