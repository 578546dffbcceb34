"""``dlg``: Deep Leakage from Gradients. On tabular diffusion, L2 gradient distance on raw
continuous rows (relaxed one-hot, no softmax) in Goliath's engine; on a model-loss workload,
``attacks.inversion``'s DLG setting (L2, labels optimised jointly). What the baselines share:
``attacks.baseline_common``."""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.baseline_common import DLG, EngineSetting


@ATTACKS.register("dlg", "Deep Leakage from Gradients (L2, joint labels)")
class DeepLeakage(EngineSetting):
    config = DLG
