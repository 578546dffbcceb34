"""``tableak``: TabLeak adapted. On tabular diffusion, cosine + softmax/sigmoid structural priors
+ pooled restarts (median+softmax) in Goliath's engine; on a model-loss workload,
``attacks.inversion``'s TabLeak setting. What the baselines share: ``attacks.baseline_common``."""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.baseline_common import TABLEAK, EngineSetting


@ATTACKS.register("tableak", "TabLeak adapted (softmax/sigmoid priors, pooled restarts)")
class TabLeak(EngineSetting):
    settings = TABLEAK
