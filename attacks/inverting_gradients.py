"""``inverting-gradients``: cosine distance, Adam on signed gradients, box [0, 1], step decay
at 3/8, 5/8, 7/8 of the budget (and a TV prior on images, ``attacks.inversion``); one restart.
What the baselines share: ``attacks.baseline_common``."""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.baseline_common import IG, EngineSetting


@ATTACKS.register("inverting-gradients", "Inverting Gradients (cosine, signed Adam, box, TV prior)")
class InvertingGradients(EngineSetting):
    settings = IG
