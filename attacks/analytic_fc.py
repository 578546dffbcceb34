"""``analytic-fc``: analytic input recovery through a fully connected first layer (model-loss
workloads with ``linear-first-layer``; ``attacks.inversion.analytic``). What the baselines share:
``attacks.baseline_common``."""

from __future__ import annotations

from dataclasses import dataclass

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.baseline_common import ANALYTIC, ON_MODEL_LOSS, EngineSetting
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param


@ATTACKS.register("analytic-fc", "Analytic input recovery through a fully connected first layer")
class AnalyticFirstLayer(EngineSetting):
    """x = (dL/dW)_i / (dL/db)_i per first-layer neuron (exact for one example; for a batch, the
    inputs several neurons agree on), labels by iDLG + update matching."""

    needs = ON_MODEL_LOSS | {Capability.LINEAR_FIRST_LAYER}
    settings = ANALYTIC

    @dataclass
    class Params:
        target_clients: list[int] = param(factory=lambda: [0], ge=0)
        rounds: list[int] = param(
            factory=list, ge=0
        )  # attacked rounds (1..rounds: checked on resolve); empty = all
