"""``fedadam``: a thin adapter over Flower's Message-API ``FedAdam``."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from flwr.serverapp.strategy import FedAdam

from flowerbed.clients.core.params import param
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry


@STRATEGIES.register("fedadam", "Flower FedAdam: server-side Adam on the mean update")
class FedAdamEntry(StrategyEntry):
    @dataclass
    class Params:
        eta: float = param(0.01, gt=0)
        eta_l: float = param(0.0316, gt=0)
        beta_1: float = param(0.9, ge=0, lt=1)
        beta_2: float = param(0.99, ge=0, lt=1)
        tau: float = param(0.001, gt=0)

    params: Params

    def strategy(self) -> FedAdam:
        return FedAdam(**asdict(self.params), **self.ctx.sampling.kwargs())
