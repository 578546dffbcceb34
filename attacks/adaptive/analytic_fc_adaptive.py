"""``analytic-fc-adaptive``: the defense-aware analytic-fc on a model-loss workload (``attacks.adaptive.model_loss``).

The attack reads the update through the defenses' public mechanisms; the unaware analytic-fc runs
beside it and the answer is chosen by ``attacks.adaptive.selection``.
"""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.adaptive.model_loss import DESCRIPTION, ModelLossAdaptive
from flowerbed.attacks.baseline_common import ANALYTIC
from flowerbed.clients.core.capabilities import Capability


@ATTACKS.register("analytic-fc-adaptive", DESCRIPTION.format(base="analytic-fc"))
class AnalyticFcAdaptive(ModelLossAdaptive):
    needs = ModelLossAdaptive.needs | {Capability.LINEAR_FIRST_LAYER}
    base = "analytic-fc"
    settings = ANALYTIC
