"""The observer plug-in: Goliath's engine (or a baseline setting of it) on what the server sees.

Public knowledge comes from the server's own copy of the workload (the one place the denoiser,
its protocol and the agreed preprocessing are built), plus the parameters sent this round.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from flowerbed.attacks.goliath.aggregation import aggregate_rounds
from flowerbed.attacks.goliath.knowledge import (
    InversionConfig,
    Knowledge,
    Reconstruction,
    observed_target,
    prior_rows,
)
from flowerbed.attacks.goliath.optimisation import invert, rows_score
from flowerbed.clients.workloads import build_workload


class TabularInversion:
    """Inverts one client update of federated tabular diffusion."""

    def __init__(self, cfg: dict[str, Any], icfg: InversionConfig) -> None:
        self.icfg = icfg
        self.workload = build_workload(cfg)

    def knowledge(self, sent: dict[str, torch.Tensor]) -> Knowledge:
        w = self.workload
        return Knowledge(w.model, sent, w.protocol, w.prep)

    def reconstruct(self, know: Knowledge, target: dict[str, torch.Tensor], batch: int) -> Reconstruction:  # fmt: skip
        return invert(know, target, batch, self.icfg)

    def invert(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], num_examples: int) -> Reconstruction:  # fmt: skip
        know = self.knowledge(sent)
        return self.reconstruct(know, observed_target(know, sent, reply), num_examples)

    def prior_guess(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], num_examples: int, seed: int) -> Reconstruction:  # fmt: skip
        """Rows from the public prior alone (``knowledge.prior_rows``); the update is not read."""
        return prior_rows(self.knowledge(sent), num_examples, seed)

    def match(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], rec: Reconstruction) -> float:  # fmt: skip
        """The engine's objective for ``rec``'s rows against this update (lower = better): the
        latents refitted to the rows (``rows_score``), or, when lower, the hard-projected score
        the engine itself reached for them (``rec.score``: its full latent fit, which a quarter
        budget refit can miss on a small model, so a fitted reconstruction would lose to the prior)."""
        know = self.knowledge(sent)
        refit = rows_score(know, observed_target(know, sent, reply), rec.num, rec.cat, self.icfg,
                           self.icfg.seed)  # fmt: skip
        return min(refit, rec.score) if math.isfinite(rec.score) else refit

    def pool(self, sent: dict[str, torch.Tensor], recs: list[Reconstruction]) -> Reconstruction | None:  # fmt: skip
        """Multi-round Goliath (FedAvg: the same rows are seen again every round)."""
        if self.workload.protocol.kind != "fedavg":
            return None
        return aggregate_rounds(self.knowledge(sent), recs)
