"""The observer plug-in: Goliath's engine (or a baseline setting of it) on what the server sees.

Public knowledge is the context's ``DiffusionReplay`` (the denoiser, its protocol and the agreed
preprocessing, from the server's own workload) plus the parameters sent this round.
"""

from __future__ import annotations

import math

import torch

from flowerbed.attacks.estimate import Estimate, timed
from flowerbed.attacks.goliath.aggregation import aggregate_rounds
from flowerbed.attacks.goliath.knowledge import local_steps, prior_rows, sign_surrogate
from flowerbed.attacks.goliath.objective import Variables
from flowerbed.attacks.goliath.optimisation import evaluate, invert, rows_score
from flowerbed.attacks.inversion.types import (
    DiffusionReplay,
    InversionSettings,
    Knowledge,
    Reconstruction,
    Tensors,
)


class TabularInversion:
    """Inverts one client update of federated tabular diffusion with ``settings``
    (``method="prior"``: rows from the public prior alone, the update unread)."""

    def __init__(self, replay: DiffusionReplay, settings: InversionSettings) -> None:
        self.replay, self.settings = replay, settings

    def knowledge(
        self, sent: Tensors, reply: Tensors, num_examples: int
    ) -> Knowledge[DiffusionReplay]:
        return Knowledge.observe(self.replay, sent, reply, num_examples)

    def invert(self, sent: Tensors, reply: Tensors, num_examples: int) -> Reconstruction:
        if self.settings.method == "prior":
            return prior_rows(self.replay, num_examples, self.settings.seed)
        return invert(self.knowledge(sent, reply, num_examples), self.settings)

    def estimate(self, sent: Tensors, reply: Tensors, num_examples: int) -> Estimate:
        """Row visits in the update against the closed form's reach (h/2 visits at width h;
        none under FedAvg with Adam) and the expected time of the optimisation (module
        ``attacks.estimate``), before ``invert`` runs."""
        cfg, know = self.settings, self.knowledge(sent, reply, num_examples)
        protocol, spec = self.replay.protocol, self.replay.spec
        fedavg = protocol.kind == "fedavg"
        epochs = protocol.local_epochs if fedavg else 1
        per = min(protocol.batch_size, num_examples)
        steps = local_steps(protocol, num_examples)
        visits = min(epochs * num_examples, steps * per) if fedavg else num_examples
        adam = fedavg and protocol.optimizer == "adam"
        reach = cfg.diffusion.analytic_init and cfg.method != "prior" and not adam
        if fedavg and num_examples % per:
            reach = False  # the local-SGD route needs whole minibatches
        if adam and cfg.diffusion.adam_as_signs and spec.regime == "mixed":
            know, steps = sign_surrogate(know), 1
        v = Variables(spec, steps, num_examples, cfg, torch.Generator().manual_seed(0))
        seconds = timed(lambda: evaluate(know, v, cfg).backward())
        budget = cfg.iterations + max(cfg.iterations // 10, 1)
        evaluations = cfg.restarts * budget + 2 * (max(cfg.iterations // 4, 1) + 1)
        name = "goliath" if cfg.objective == "goliath" else f"{cfg.objective} inversion"
        return Estimate(name, num_examples, epochs, visits, steps, spec.hidden // 2 if reach else 0,
                        evaluations if cfg.method != "prior" else 0, seconds)  # fmt: skip

    def prior_guess(self, sent: Tensors, reply: Tensors, num_examples: int, seed: int) -> Reconstruction:  # fmt: skip
        """Rows from the public prior alone (``knowledge.prior_rows``); the update is not read."""
        return prior_rows(self.replay, num_examples, seed)

    def match(self, sent: Tensors, reply: Tensors, rec: Reconstruction) -> float:
        """The engine's objective for ``rec``'s rows against this update (lower = better): the
        latents refitted to the rows (``rows_score``), or, when lower, the hard-projected score
        the engine itself reached for them (``rec.score``: its full latent fit, which a quarter
        budget refit can miss on a small model, so a fitted reconstruction would lose to the prior)."""
        know = self.knowledge(sent, reply, rec.batch)
        refit = rows_score(know, rec.num, rec.cat, self.settings, self.settings.seed)
        return min(refit, rec.score) if math.isfinite(rec.score) else refit

    def pool(self, sent: Tensors, recs: list[Reconstruction]) -> Reconstruction | None:
        """Multi-round Goliath (FedAvg: the same rows are seen again every round)."""
        if self.replay.protocol.kind != "fedavg":
            return None
        return aggregate_rounds(self.replay, recs)
