"""``random-baseline``: each cell (or input) drawn from the public prior, ignoring the update: the
floor every score is measured above (``attacks.prior``; no prior-keeping, it is the prior). On
tabular diffusion the rows come from the agreed preprocessing's marginals
(``goliath.knowledge.prior_rows``), on a model-loss workload from the contract's prior draws. What
the baselines share: ``attacks.baseline_common``."""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.baseline_common import PRIOR, EngineSetting


@ATTACKS.register("random-baseline", "Draws from the public prior, ignoring the update (floor)")
class RandomBaseline(EngineSetting):
    settings = PRIOR
