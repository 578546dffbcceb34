"""``fedprox``: a thin adapter over Flower's Message-API ``FedProx``."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.serverapp.strategy import FedProx

from flowerbed.clients.core.params import param
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry


@STRATEGIES.register("fedprox", "Flower FedProx: FedAvg + proximal term mu/2 ||w - w_global||^2")
class FedProxEntry(StrategyEntry):
    @dataclass
    class Params:
        proximal_mu: float = param(0.01, ge=0)

    params: Params

    def strategy(self) -> FedProx:
        return FedProx(proximal_mu=self.params.proximal_mu, **self.ctx.sampling.kwargs())
