"""``dlg``: Deep Leakage from Gradients. On tabular diffusion, L2 gradient distance on raw
continuous rows (relaxed one-hot, no softmax) in Goliath's engine; on a model-loss workload,
``attacks.inversion``'s loop with L2 and labels optimised jointly. Its one settings constant and
what the baselines share: ``attacks.baseline_common``."""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.baseline_common import DLG, EngineSetting


@ATTACKS.register("dlg", "Deep Leakage from Gradients (L2, joint labels)")
class DeepLeakage(EngineSetting):
    settings = DLG
