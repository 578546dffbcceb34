"""``analytic-fc-adaptive``: the defense-aware analytic-fc on a model-loss workload (``attacks.adaptive.model_loss``).

The attack reads the update through the defenses' public mechanisms; the unaware analytic-fc runs
beside it and the answer is chosen by ``attacks.adaptive.selection``.
"""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.adaptive.model_loss import DESCRIPTION, model_loss_adaptive
from flowerbed.attacks.inversion import InversionSettings

AnalyticFcAdaptive = ATTACKS.register(
    "analytic-fc-adaptive", DESCRIPTION.format(base="analytic-fc")
)(model_loss_adaptive("analytic-fc", "analytic", InversionSettings(), __name__))
