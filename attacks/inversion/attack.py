"""The observer plug-in: a model-loss attack on what the server sees.

Public knowledge comes from the server's own copy of the workload (``Workload.model_loss()``,
built once when the attack is wired in); each reply is inverted from the sent arrays, the reply's
arrays and its ``num-examples`` alone.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from flowerbed.attacks.inversion.analytic import invert_analytic
from flowerbed.attacks.inversion.knowledge import InversionSettings, Recovered, server_view
from flowerbed.attacks.inversion.optimisation import invert_optimised
from flowerbed.clients.model_loss import ModelLoss
from flowerbed.clients.workloads import WORKLOADS

METHODS = ("analytic", "optimised", "random")


def model_loss_of(cfg: dict[str, Any]) -> ModelLoss:
    """The workload's model-loss contract, from the server's own copy of the workload."""
    return WORKLOADS.get(cfg["workload"]["name"])(cfg).model_loss()


class ModelLossAttack:
    """Inverts one client update of a model-loss workload (``method``: analytic | optimised |
    random, the last a draw from the public prior that ignores the update)."""

    def __init__(self, contract: ModelLoss, method: str, settings: InversionSettings,
                 name: str = "") -> None:  # fmt: skip
        if method not in METHODS:
            raise ValueError(f"unknown method '{method}' (allowed: {', '.join(METHODS)})")
        self.contract, self.method, self.settings = contract, method, settings
        self.name = name or method

    def invert(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], num_examples: int) -> Recovered:  # fmt: skip
        view = server_view(self.contract, sent, reply, num_examples)
        if self.method == "analytic":
            return invert_analytic(view, self.settings.seed)
        if self.method == "optimised":
            return invert_optimised(view, self.settings, self.name)
        start = time.perf_counter()
        gen = torch.Generator().manual_seed(self.settings.seed)
        x = self.contract.draw(num_examples, gen)
        y = torch.randint(self.contract.schema.num_classes, (num_examples,), generator=gen)
        return Recovered(x, y, float("nan"), self.contract.decode(x),
                         time.perf_counter() - start, self.name)  # fmt: skip

    def pool(self, sent: dict[str, torch.Tensor], recs: list[Recovered]) -> Recovered | None:
        """No multi-round pooling: each round's examples are drawn afresh."""
        return None
