"""Defense-aware attacks: the strongest attacker we have that knows each defense's public mechanism.

- ``goliath-adaptive`` (tabular diffusion): Goliath's engine adapted to top-k (match on the kept
  coordinates), quantisation (match within one grid step), DP-SGD / local DP (average a client's
  noisy updates over rounds) and secure aggregation (invert the aggregate of N clients); the
  unaware Goliath runs beside it on the same replies (``attack.unaware_*``). ``inversion.py``.
- ``<attack>-adaptive`` for every model-loss inversion (``analytic-fc-adaptive``,
  ``inverting-gradients-adaptive``, ``tableak-adaptive``, ``dlg-adaptive``, ``idlg-adaptive``: the
  classifiers): the attack reads the update through the defenses' published mechanisms (top-k
  view and low-rank completion, quantisation grid, no absent-category rule under noise, secure
  aggregation as N clients' rows); the unaware attack beside it. ``model_loss.py``.
- ``model-stealing-adaptive`` (model release): detect FILOsofer's flipped weights (values pinned
  at a tensor's extremes, the largest magnitudes, or a saliency score on the attacker's own data),
  zero them, then fine-tune; reported beside the plain stealing attack. ``stealing.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.adaptive.inversion import DefenseAwareInversion, DefenseAwareObserver
from flowerbed.attacks.adaptive.model_loss import (
    ClassifierGroupScorer,
    DefenseAwareModelLoss,
    RememberingAttack,
)
from flowerbed.attacks.adaptive.scoring import GroupScorer
from flowerbed.attacks.adaptive.stealing import ModelStealingAdaptive
from flowerbed.attacks.goliath import GOLIATH, TabularInversion, with_config
from flowerbed.attacks.inversion import SETTINGS, InversionSettings, with_budget
from flowerbed.attacks.inversion.attack import model_loss_of
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.defenses import published_mechanisms

__all__ = [
    "DefenseAwareInversion",
    "DefenseAwareModelLoss",
    "DefenseAwareObserver",
    "GoliathAdaptive",
    "ModelStealingAdaptive",
]


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


@dataclass
class ModelLossAdaptiveParams:
    target_clients: list[int] = param(factory=lambda: [0], ge=0)
    restarts: int = param(0, ge=0)  # 0 = the attack's own default
    iterations: int = param(0, ge=0)  # 0 = the attack's own default (optimisation attacks)
    rounds: list[int] = param(factory=list, ge=1)  # attacked rounds; empty = every round
    compare_unaware: bool = True  # also run the unaware attack on the same replies


def model_loss_adaptive(base: str, method: str, settings: InversionSettings) -> type:
    """The defense-aware variant of the model-loss attack ``base`` (module docstring)."""
    needs = {Capability.MODEL_LOSS}
    if method == "analytic":
        needs.add(Capability.LINEAR_FIRST_LAYER)

    class Entry:
        Params = ModelLossAdaptiveParams

        @classmethod
        def wrap(cls, strategy: Any, cfg: dict[str, Any], writer: Any) -> Any:
            p = cfg["attack"]["params"]
            icfg = with_budget(settings, p, cfg["seed"])  # 0 = the attack's own budget
            contract = model_loss_of(cfg)
            plain = RememberingAttack(contract, method, icfg, base)
            adaptive = DefenseAwareModelLoss(contract, method, icfg, f"{base}-adaptive",
                                             published_mechanisms(cfg), plain)  # fmt: skip
            unaware = plain if p["compare_unaware"] else None
            return DefenseAwareObserver(strategy, writer, adaptive, ClassifierGroupScorer(cfg),
                                        p["target_clients"], p["rounds"], unaware)  # fmt: skip

    Entry.needs = frozenset(needs)
    Entry.__name__ = Entry.__qualname__ = f"{base.title().replace('-', '')}Adaptive"
    return Entry


for _base, _method, _settings in [
    ("analytic-fc", "analytic", InversionSettings()),
    *((name, "optimised", s) for name, s in SETTINGS.items()),
]:
    ATTACKS.register(f"{_base}-adaptive", f"defense-aware {_base} on a model-loss workload "
                     "(reads the update through the defenses' public mechanisms)")(
        model_loss_adaptive(_base, _method, _settings))  # fmt: skip
