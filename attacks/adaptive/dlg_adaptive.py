"""``dlg-adaptive``: the defense-aware dlg on a model-loss workload (``attacks.adaptive.model_loss``).

The attack reads the update through the defenses' public mechanisms; the unaware dlg runs
beside it and the answer is chosen by ``attacks.adaptive.selection``.
"""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.adaptive.model_loss import DESCRIPTION, ModelLossAdaptive
from flowerbed.attacks.baseline_common import DLG


@ATTACKS.register("dlg-adaptive", DESCRIPTION.format(base="dlg"))
class DlgAdaptive(ModelLossAdaptive):
    base = "dlg"
    settings = DLG
