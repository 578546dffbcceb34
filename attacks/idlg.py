"""``idlg``: DLG + iDLG-style analytic recovery. On tabular diffusion, categories absent from the
batch (zero input-projection columns / non-negative categorical-head-bias gradient, mixed regime)
leave the search space; on a model-loss workload, labels from the last layer's gradient. What the
baselines share: ``attacks.baseline_common``."""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.baseline_common import IDLG, EngineSetting


@ATTACKS.register("idlg", "iDLG: DLG + analytic label / category-support recovery")
class ImprovedDeepLeakage(EngineSetting):
    settings = IDLG
