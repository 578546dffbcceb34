"""The observer plug-in: a model-loss attack on what the server sees.

Public knowledge is the context's ``ModelLossReplay`` (the workload's ``model_loss()`` contract,
from the server's own workload); each reply is inverted from the sent arrays, the reply's arrays
and its ``num-examples`` alone.
"""

from __future__ import annotations

import time

import torch

from flowerbed.attacks.estimate import Estimate, timed
from flowerbed.attacks.inversion.analytic import invert_analytic
from flowerbed.attacks.inversion.optimisation import invert_optimised
from flowerbed.attacks.inversion.simulate import distance, observed
from flowerbed.attacks.inversion.types import (
    InversionSettings,
    Knowledge,
    ModelLossReplay,
    Reconstruction,
    Tensors,
)
from flowerbed.clients.model_loss import ModelLoss, prior_guess_inputs, prior_guess_labels

METHODS = ("optimised", "analytic", "prior")


class ModelLossAttack:
    """Inverts one client update of a model-loss workload with ``settings`` (``method``:
    optimised | analytic | prior, the last a draw from the public prior that ignores the update)."""

    def __init__(self, replay: ModelLossReplay, settings: InversionSettings, name: str = "") -> None:  # fmt: skip
        if settings.method not in METHODS:
            raise ValueError(f"unknown method '{settings.method}' (allowed: {', '.join(METHODS)})")
        self.replay, self.settings = replay, settings
        self.name = name or settings.method

    @property
    def contract(self) -> ModelLoss:
        return self.replay.contract

    def invert(self, sent: Tensors, reply: Tensors, num_examples: int) -> Reconstruction:
        know = self.knowledge(sent, reply, num_examples)
        method = self.settings.method
        if method == "analytic":
            return invert_analytic(know, self.settings.seed)
        if method == "optimised":
            return invert_optimised(know, self.settings, self.name)
        start = time.perf_counter()
        gen = torch.Generator().manual_seed(self.settings.seed)
        x = self.contract.draw(num_examples, gen)
        y = torch.randint(self.contract.schema.num_classes, (num_examples,), generator=gen)
        return Reconstruction(x, float("nan"), y=y, decoded=self.contract.decode(x),
                              seconds=time.perf_counter() - start, method=self.name)  # fmt: skip

    def estimate(self, sent: Tensors, reply: Tensors, num_examples: int) -> Estimate:
        """Row visits and replayed local steps of the update, and the expected time of the
        optimisation (``attacks.estimate``); the loop has no closed-form reach to report."""
        know, cfg = self.knowledge(sent, reply, num_examples), self.settings
        training = self.contract.training
        plan = training.plan(num_examples)
        visits = sum(len(range(num_examples)[s]) for s in plan)
        epochs = training.local_epochs if training.protocol != "fedsgd" else 1
        gen = torch.Generator().manual_seed(0)
        x = self.contract.draw(num_examples, gen).to(know.dtype).requires_grad_(True)
        y = torch.randint(self.contract.schema.num_classes, (num_examples,), generator=gen)
        seconds = timed(
            lambda: distance(observed(know, x, y), know.update, cfg.objective).backward()
        )
        evaluations = cfg.restarts * cfg.iterations + 2 if cfg.method == "optimised" else 2
        return Estimate(self.name, num_examples, epochs, visits, len(plan), 0, evaluations, seconds)

    def knowledge(
        self, sent: Tensors, reply: Tensors, num_examples: int
    ) -> Knowledge[ModelLossReplay]:
        """What the attacker reads from a reply (the defense-aware attacker reads it through the
        defenses' public mechanisms: ``attacks.adaptive.model_loss``)."""
        return Knowledge.observe(self.replay, sent, reply, num_examples)

    def prior_guess(self, sent: Tensors, reply: Tensors, num_examples: int, seed: int) -> Reconstruction:  # fmt: skip
        """Inputs and labels from public knowledge alone (``guess_from_prior``)."""
        return guess_from_prior(self.contract, num_examples, seed, self.name)

    def match(self, sent: Tensors, reply: Tensors, rec: Reconstruction) -> float:
        """The attack's objective (its update distance, no prior term) for ``rec``."""
        know = self.knowledge(sent, reply, rec.batch)
        with torch.enable_grad():
            sim = observed(know, rec.inputs.to(know.dtype), rec.labels, create_graph=False)
        return float(distance(sim, know.update, self.settings.objective).detach())

    def pool(self, sent: Tensors, recs: list[Reconstruction]) -> Reconstruction | None:
        """No multi-round pooling: each round's examples are drawn afresh."""
        return None


def guess_from_prior(contract: ModelLoss, n: int, seed: int, method: str = "prior") -> Reconstruction:  # fmt: skip
    """What a server guesses from public knowledge alone: ``contract.guess`` (images: the public
    mean image) or prior draws (tables: per-feature marginals), labels from the class prior."""
    gen = torch.Generator().manual_seed(int(seed) % 2**63)
    x = prior_guess_inputs(contract, n, gen)
    y = prior_guess_labels(contract, n, gen)
    return Reconstruction(x, float("nan"), y=y, decoded=contract.decode(x), method=method)
