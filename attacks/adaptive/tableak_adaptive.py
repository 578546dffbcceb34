"""``tableak-adaptive``: the defense-aware tableak on a model-loss workload (``attacks.adaptive.model_loss``).

The attack reads the update through the defenses' public mechanisms; the unaware tableak runs
beside it and the answer is chosen by ``attacks.adaptive.selection``.
"""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.adaptive.model_loss import DESCRIPTION, ModelLossAdaptive
from flowerbed.attacks.baseline_common import TABLEAK


@ATTACKS.register("tableak-adaptive", DESCRIPTION.format(base="tableak"))
class TableakAdaptive(ModelLossAdaptive):
    base = "tableak"
    settings = TABLEAK
