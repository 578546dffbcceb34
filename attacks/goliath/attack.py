"""The observer plug-in: Goliath's engine (or a baseline setting of it) on what the server sees.

Public knowledge is the context's ``DiffusionReplay`` (the denoiser, its protocol and the agreed
preprocessing, from the server's own workload) plus the parameters sent this round.
"""

from __future__ import annotations

import math

from flowerbed.attacks.common import (
    DiffusionReplay,
    InversionSettings,
    Knowledge,
    Reconstruction,
    Tensors,
)
from flowerbed.attacks.goliath.aggregation import aggregate_rounds
from flowerbed.attacks.goliath.knowledge import prior_rows
from flowerbed.attacks.goliath.optimisation import invert, rows_score


class TabularInversion:
    """Inverts one client update of federated tabular diffusion with ``settings``
    (``method="prior"``: rows from the public prior alone, the update unread)."""

    def __init__(self, replay: DiffusionReplay, settings: InversionSettings) -> None:
        self.replay, self.settings = replay, settings

    def knowledge(self, sent: Tensors, reply: Tensors, num_examples: int) -> Knowledge:
        return Knowledge.observe(self.replay, sent, reply, num_examples)

    def invert(self, sent: Tensors, reply: Tensors, num_examples: int) -> Reconstruction:
        if self.settings.method == "prior":
            return prior_rows(self.replay, num_examples, self.settings.seed)
        return invert(self.knowledge(sent, reply, num_examples), self.settings)

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
