"""Flower's differential-privacy mods, as defenses.

``local-dp``: Flower's ``LocalDpMod`` clips the update and adds Laplace noise on the client.
``central-dp``: the client half of Flower's central DP. With ``clipping: client`` the client clips
its update with Flower's ``fixedclipping_mod`` (or ``adaptiveclipping_mod``) and the server wrapper
(``strategies/defenses.py``) adds the noise; with ``clipping: server`` the client does nothing and
the server clips and noises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flwr.clientapp.mod import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod

from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.defenses import DEFENSES, Defense

CLIPPING = ("client", "server")


@DEFENSES.register(
    "local-dp", "Flower LocalDpMod: client-side clipping + Laplace noise (epsilon, delta)"
)
class LocalDp(Defense):
    declares = ("update",)

    @dataclass
    class Params:
        clipping_norm: float = 1.0
        sensitivity: float = 1.0
        epsilon: float = 1.0
        delta: float = 1e-5

    def mods(self) -> list[Any]:
        p = self.params
        return [LocalDpMod(p.clipping_norm, p.sensitivity, p.epsilon, p.delta)]


@DEFENSES.register(
    "central-dp", "Flower central DP wrappers: fixed/adaptive clipping on client or server"
)
class CentralDp(Defense):
    declares = ("aggregation",)

    @dataclass
    class Params:
        noise_multiplier: float = 0.5
        clipping_norm: float = 1.0
        clipping: str = "server"
        adaptive: bool = False
        delta: float = 1e-5

    def __init__(self, cfg: dict[str, Any], params: dict[str, Any]) -> None:
        super().__init__(cfg, params)
        if self.params.clipping not in CLIPPING:
            raise ConfigError(
                f"central-dp.clipping '{self.params.clipping}' unknown (allowed: {', '.join(CLIPPING)})"
            )

    def mods(self) -> list[Any]:
        if self.params.clipping != "client":
            return []
        return [adaptiveclipping_mod if self.params.adaptive else fixedclipping_mod]
