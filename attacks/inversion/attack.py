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
from flowerbed.attacks.inversion.knowledge import (
    InversionSettings,
    Recovered,
    ServerView,
    server_view,
)
from flowerbed.attacks.inversion.optimisation import invert_optimised
from flowerbed.attacks.inversion.simulate import distance, observed
from flowerbed.clients.model_loss import ModelLoss, prior_guess_inputs, prior_guess_labels
from flowerbed.clients.workloads import build_workload

METHODS = ("analytic", "optimised", "random")


def model_loss_of(cfg: dict[str, Any]) -> ModelLoss:
    """The workload's model-loss contract, from the server's own copy of the workload."""
    return build_workload(cfg).model_loss()


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
        view = self.view(sent, reply, num_examples)
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

    def view(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], num_examples: int) -> ServerView:  # fmt: skip
        """What the attacker reads from a reply (the defense-aware attacker reads it through the
        defenses' public mechanisms: ``attacks.adaptive.model_loss``)."""
        return server_view(self.contract, sent, reply, num_examples)

    def prior_guess(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], num_examples: int, seed: int) -> Recovered:  # fmt: skip
        """Inputs and labels from public knowledge alone (``guess_from_prior``)."""
        return guess_from_prior(self.contract, num_examples, seed, self.name)

    def match(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], rec: Recovered) -> float:  # fmt: skip
        """The attack's objective (its update distance, no prior term) for ``rec``."""
        view = self.view(sent, reply, len(rec.x))
        dtype = next(iter(view.params.values())).dtype
        with torch.enable_grad():
            sim = observed(view, rec.x.to(dtype), rec.y, create_graph=False)
        return float(distance(sim, view.update, self.settings.objective).detach())

    def pool(self, sent: dict[str, torch.Tensor], recs: list[Recovered]) -> Recovered | None:
        """No multi-round pooling: each round's examples are drawn afresh."""
        return None


def guess_from_prior(contract: ModelLoss, n: int, seed: int, method: str = "prior") -> Recovered:
    """What a server guesses from public knowledge alone: ``contract.guess`` (images: the public
    mean image) or prior draws (tables: per-feature marginals), labels from the class prior."""
    gen = torch.Generator().manual_seed(int(seed) % 2**63)
    x = prior_guess_inputs(contract, n, gen)
    y = prior_guess_labels(contract, n, gen)
    return Recovered(x, y, float("nan"), contract.decode(x), 0.0, method)
