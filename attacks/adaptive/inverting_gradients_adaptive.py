"""``inverting-gradients-adaptive``: the defense-aware inverting-gradients on a model-loss workload (``attacks.adaptive.model_loss``).

The attack reads the update through the defenses' public mechanisms; the unaware inverting-gradients runs
beside it and the answer is chosen by ``attacks.adaptive.selection``.
"""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.adaptive.model_loss import DESCRIPTION, ModelLossAdaptive
from flowerbed.attacks.baseline_common import IG


@ATTACKS.register("inverting-gradients-adaptive", DESCRIPTION.format(base="inverting-gradients"))
class InvertingGradientsAdaptive(ModelLossAdaptive):
    base = "inverting-gradients"
    settings = IG
