"""Thin adapters over Flower's Message-API strategies (FedAvg, FedProx, FedAdam, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, FedMedian, FedProx, FedTrimmedAvg

from flowerbed.clients.core.params import param
from flowerbed.strategies import STRATEGIES


def sampling_kwargs(cfg: dict[str, Any]) -> dict[str, Any]:
    """Client sampling from the experiment's ``clients`` section (Flower's FedAvg arguments)."""
    clients = cfg["clients"]
    num = clients["num"]
    min_nodes = min(clients["min_clients"], num)
    return {
        "fraction_train": clients["fraction"],
        "fraction_evaluate": clients["fraction_evaluate"],
        "min_train_nodes": min_nodes,
        "min_evaluate_nodes": min_nodes if clients["fraction_evaluate"] > 0 else 0,
        "min_available_nodes": num,
    }


@STRATEGIES.register("fedavg", "Flower FedAvg: example-weighted mean of client models")
class FedAvgEntry:
    @staticmethod
    def build(cfg: dict[str, Any]) -> FedAvg:
        return FedAvg(**sampling_kwargs(cfg))


@STRATEGIES.register("fedprox", "Flower FedProx: FedAvg + proximal term mu/2 ||w - w_global||^2")
class FedProxEntry:
    @dataclass
    class Params:
        proximal_mu: float = param(0.01, ge=0)

    @staticmethod
    def build(cfg: dict[str, Any]) -> FedProx:
        return FedProx(proximal_mu=cfg["strategy"]["params"]["proximal_mu"], **sampling_kwargs(cfg))


@STRATEGIES.register("fedadam", "Flower FedAdam: server-side Adam on the mean update")
class FedAdamEntry:
    @dataclass
    class Params:
        eta: float = param(0.01, gt=0)
        eta_l: float = param(0.0316, gt=0)
        beta_1: float = param(0.9, ge=0, lt=1)
        beta_2: float = param(0.99, ge=0, lt=1)
        tau: float = param(0.001, gt=0)

    @staticmethod
    def build(cfg: dict[str, Any]) -> FedAdam:
        return FedAdam(**cfg["strategy"]["params"], **sampling_kwargs(cfg))


@STRATEGIES.register("fedavgm", "Flower FedAvgM: FedAvg with server momentum")
class FedAvgMEntry:
    @dataclass
    class Params:
        server_learning_rate: float = param(1.0, gt=0)
        server_momentum: float = param(0.9, ge=0, lt=1)

    @staticmethod
    def build(cfg: dict[str, Any]) -> FedAvgM:
        return FedAvgM(**cfg["strategy"]["params"], **sampling_kwargs(cfg))


@STRATEGIES.register("fedmedian", "Flower FedMedian: coordinate-wise median (robust)")
class FedMedianEntry:
    @staticmethod
    def build(cfg: dict[str, Any]) -> FedMedian:
        return FedMedian(**sampling_kwargs(cfg))


@STRATEGIES.register("fedtrimmedavg", "Flower FedTrimmedAvg: trimmed mean, cut fraction beta")
class FedTrimmedAvgEntry:
    @dataclass
    class Params:
        beta: float = param(0.2, ge=0, lt=0.5)

    @staticmethod
    def build(cfg: dict[str, Any]) -> FedTrimmedAvg:
        return FedTrimmedAvg(beta=cfg["strategy"]["params"]["beta"], **sampling_kwargs(cfg))
