"""The scorer of a gradient inversion, by the replay that made its reconstructions (scorer side:
it holds ground truth; registers nothing)."""

from __future__ import annotations

from flowerbed.attacks.goliath.scoring import TruthScorer
from flowerbed.attacks.inversion.scoring import ClassifierScorer
from flowerbed.attacks.truth import TruthSource
from flowerbed.clients.core.capabilities import Capability


def inversion_scorer(truth: TruthSource) -> TruthScorer | ClassifierScorer:
    """Rows of tabular diffusion (``TruthScorer``), or a classifier's examples."""
    if Capability.TABULAR_DIFFUSION in truth.capabilities:
        return TruthScorer(truth)
    return ClassifierScorer(truth)
