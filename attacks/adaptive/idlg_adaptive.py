"""``idlg-adaptive``: the defense-aware idlg on a model-loss workload (``attacks.adaptive.model_loss``).

The attack reads the update through the defenses' public mechanisms; the unaware idlg runs
beside it and the answer is chosen by ``attacks.adaptive.selection``.
"""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.adaptive.model_loss import DESCRIPTION, ModelLossAdaptive
from flowerbed.attacks.baseline_common import IDLG


@ATTACKS.register("idlg-adaptive", DESCRIPTION.format(base="idlg"))
class IdlgAdaptive(ModelLossAdaptive):
    base = "idlg"
    settings = IDLG
