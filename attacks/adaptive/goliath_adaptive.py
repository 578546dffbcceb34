"""``goliath-adaptive``: Goliath adapted to the configured defenses' public mechanisms (tabular diffusion).

The engine (``attacks.adaptive.inversion.DefenseAwareInversion``) matches through top-k's kept
coordinates, quantisation's grid, DP noise averaged over rounds and secure aggregation's group;
the unaware Goliath runs beside it on the same replies (``attack.unaware_*``) and the answer is
chosen by ``attacks.adaptive.selection`` (prior guess, unaware or aware; ``attack.chosen_*``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.adaptive.inversion import DefenseAwareInversion, DefenseAwareObserver
from flowerbed.attacks.adaptive.scoring import GroupScorer
from flowerbed.attacks.goliath import GOLIATH, TabularInversion, with_config
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.defenses import published_mechanisms


@ATTACKS.register(
    "goliath-adaptive",
    "defense-aware Goliath (top-k support, quantisation grid, DP averaging, SecAgg aggregate)",
)
class GoliathAdaptive:
    needs = frozenset({Capability.TABULAR_DIFFUSION})

    @dataclass
    class Params:
        target_clients: list[int] = param(factory=lambda: [0], ge=0)
        restarts: int = param(4, ge=1)
        iterations: int = param(400, ge=0)
        cycles: int = param(4, ge=1)
        rounds: list[int] = param(factory=list, ge=1)  # attacked rounds; empty = every round
        average_rounds: int = param(4, ge=1)  # noisy updates of one client averaged (DP); 1 = none
        compare_unaware: bool = True  # also run the unaware Goliath on the same replies

    @classmethod
    def wrap(cls, strategy: Any, cfg: dict[str, Any], writer: Any) -> Any:
        p = cfg["attack"]["params"]
        icfg = with_config(GOLIATH, p, cfg["seed"])
        # what the server knows of the defenses: their public mechanisms, handed to the attack
        adaptive = DefenseAwareInversion(cfg, icfg, p["average_rounds"], published_mechanisms(cfg))
        unaware = TabularInversion(cfg, icfg) if p["compare_unaware"] else None
        return DefenseAwareObserver(strategy, writer, adaptive, GroupScorer(cfg),
                                    p["target_clients"], p["rounds"], unaware)  # fmt: skip
