"""Defense-aware attacks: the strongest attacker we have that knows each defense's public mechanism.

One module per registration (the registry imports this package, which imports them):

- ``goliath-adaptive`` (tabular diffusion, ``goliath_adaptive.py``): Goliath's engine adapted to
  top-k (match on the kept coordinates), quantisation (match within one grid step), DP-SGD /
  local DP (average a client's noisy updates over rounds) and secure aggregation (invert the
  aggregate of N clients); the engine is ``inversion.py``;
- ``<attack>-adaptive`` for every model-loss inversion (``analytic_fc_adaptive.py``,
  ``inverting_gradients_adaptive.py``, ``tableak_adaptive.py``, ``dlg_adaptive.py``,
  ``idlg_adaptive.py``: the classifiers): the attack reads the update through the defenses'
  published mechanisms (top-k view and low-rank completion, quantisation grid, no absent-category
  rule under noise, secure aggregation as N clients' rows); their shared base class is
  ``model_loss.ModelLossAdaptive``;
- ``model-stealing-adaptive`` (model release, ``model_stealing_adaptive.py``): detect FILOsofer's
  flipped weights, zero them, then fine-tune; reported beside the plain stealing attack.

The inversion attacks run the unaware attack beside the aware one on the same replies
(``attack.unaware_*``) and answer with the candidate ``selection.py`` picks -- the unaware
reconstruction where nothing adapts, the prior guess where the update carries no evidence above
the published noise, else the best of (prior, unaware, aware) by the attack's own defense-aware
objective (``attack.chosen_*``).
"""

from __future__ import annotations

from flowerbed.attacks.adaptive import (  # noqa: F401  (each registers its attack)
    analytic_fc_adaptive,
    dlg_adaptive,
    goliath_adaptive,
    idlg_adaptive,
    inverting_gradients_adaptive,
    model_stealing_adaptive,
    tableak_adaptive,
)
from flowerbed.attacks.adaptive.goliath_adaptive import GoliathAdaptive
from flowerbed.attacks.adaptive.inversion import DefenseAware, DefenseAwareInversion
from flowerbed.attacks.adaptive.model_loss import DefenseAwareModelLoss, ModelLossAdaptive
from flowerbed.attacks.adaptive.model_stealing_adaptive import ModelStealingAdaptive

__all__ = [
    "DefenseAware",
    "DefenseAwareInversion",
    "DefenseAwareModelLoss",
    "GoliathAdaptive",
    "ModelLossAdaptive",
    "ModelStealingAdaptive",
]
