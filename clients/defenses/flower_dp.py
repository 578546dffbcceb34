"""Flower's differential privacy, as defenses: client mods and the server's DP strategy wrappers.

``local-dp``: Flower's ``LocalDpMod`` clips the update and adds Laplace noise on the client.
``central-dp``: Flower's central DP. With ``clipping: client`` the client clips its update with
Flower's ``fixedclipping_mod`` (or ``adaptiveclipping_mod``) and the server wrapper adds the noise;
with ``clipping: server`` the client does nothing and the server clips and noises. The server half
also reports the user-level epsilon of DP-FedAvg (``dp.epsilon``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from flwr.app import Message
from flwr.clientapp.mod import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from opacus.accountants import RDPAccountant

from flowerbed.clients.core.params import param
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.defenses import DEFENSES, Defense


class Clipping(StrEnum):
    client = "client"
    server = "server"


@DEFENSES.register(
    "local-dp", "Flower LocalDpMod: client-side clipping + Laplace noise (epsilon, delta)"
)
class LocalDp(Defense):
    @dataclass
    class Params:
        clipping_norm: float = param(1.0, gt=0)
        sensitivity: float = param(1.0, gt=0)
        epsilon: float = param(1.0, gt=0)
        delta: float = param(1e-5, ge=0, lt=1)

    def mods(self) -> list[Any]:
        p = self.params
        return [LocalDpMod(p.clipping_norm, p.sensitivity, p.epsilon, p.delta)]


@DEFENSES.register(
    "central-dp", "Flower central DP wrappers: fixed/adaptive clipping on client or server"
)
class CentralDp(Defense):
    server_position = "inner"

    @dataclass
    class Params:
        noise_multiplier: float = param(0.5, ge=0)
        clipping_norm: float = param(1.0, gt=0)
        clipping: Clipping = Clipping.server
        adaptive: bool = False
        delta: float = param(1e-5, gt=0, lt=1)

    def mods(self) -> list[Any]:
        if self.params.clipping != Clipping.client:
            return []
        return [adaptiveclipping_mod if self.params.adaptive else fixedclipping_mod]

    @classmethod
    def wrap_strategy(cls, strategy: Any, cfg: dict[str, Any], params: dict[str, Any], writer: Any) -> Any:  # fmt: skip
        n = sampled_clients(cfg)
        noise = params["noise_multiplier"]
        client = params["clipping"] == Clipping.client
        if params["adaptive"]:
            wrapper = (DifferentialPrivacyClientSideAdaptiveClipping if client
                       else DifferentialPrivacyServerSideAdaptiveClipping)  # fmt: skip
            wrapped = wrapper(strategy, noise, n, initial_clipping_norm=params["clipping_norm"])
        else:
            wrapper = (DifferentialPrivacyClientSideFixedClipping if client
                       else DifferentialPrivacyServerSideFixedClipping)  # fmt: skip
            wrapped = wrapper(strategy, noise, params["clipping_norm"], n)
        return CentralDpAccounting(wrapped, cfg, params, writer, n)


def sampled_clients(cfg: dict[str, Any]) -> int:
    """How many clients a round samples (Flower's FedAvg rule for ``clients.fraction``)."""
    clients = cfg["clients"]
    return max(
        int(clients["num"] * clients["fraction"]), min(clients["min_clients"], clients["num"])
    )


class CentralDpAccounting(StrategyWrapper):
    """User-level epsilon of DP-FedAvg: one Gaussian mechanism per round, subsampled at n/N.

    Flower's own accountant needs the optional ``flwr[dp]`` extra; Opacus's RDP accountant gives
    the same subsampled-Gaussian bound, so flowerbed reports ``dp.epsilon`` from it.
    """

    def __init__(self, inner: Any, cfg: dict, params: dict, writer: Any, sampled: int) -> None:
        super().__init__(inner)
        self.writer, self.params = writer, params
        self.rate = sampled / cfg["clients"]["num"]
        self.accountant = RDPAccountant()

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        result = self.inner.aggregate_train(server_round, replies)
        self.accountant.step(
            noise_multiplier=self.params["noise_multiplier"], sample_rate=self.rate
        )
        if self.params["noise_multiplier"] > 0:
            epsilon = self.accountant.get_epsilon(delta=self.params["delta"])
            self.writer.log(server_round, "dp", {"epsilon": epsilon})
        return result
