"""``analytic-fc``: analytic input recovery through a fully connected first layer (model-loss
workloads with ``linear-first-layer``; ``attacks.inversion.analytic``). What the baselines share:
``attacks.baseline_common``."""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.baseline_common import ANALYTIC, ON_MODEL_LOSS, EngineSetting
from flowerbed.attacks.common import ObservedParams
from flowerbed.clients.core.capabilities import Capability


@ATTACKS.register("analytic-fc", "Analytic input recovery through a fully connected first layer")
class AnalyticFirstLayer(EngineSetting):
    """x = (dL/dW)_i / (dL/db)_i per first-layer neuron (exact for one example; for a batch, the
    inputs several neurons agree on), labels by iDLG + update matching."""

    needs = ON_MODEL_LOSS | {Capability.LINEAR_FIRST_LAYER}
    settings = ANALYTIC

    Params = ObservedParams  # no budget: the first layer is read in closed form
