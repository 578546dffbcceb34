"""``fedprox``: a thin adapter over Flower's Message-API ``FedProx``."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.serverapp.strategy import FedProx

from flowerbed.clients.core.params import param
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyContext


@STRATEGIES.register("fedprox", "Flower FedProx: FedAvg + proximal term mu/2 ||w - w_global||^2")
class FedProxEntry:
    @dataclass
    class Params:
        proximal_mu: float = param(0.01, ge=0)

    @staticmethod
    def build(params: FedProxEntry.Params, context: StrategyContext) -> FedProx:
        return FedProx(proximal_mu=params.proximal_mu, **context.sampling.kwargs())
