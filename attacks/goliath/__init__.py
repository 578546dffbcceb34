"""Goliath: gradient inversion of federated tabular diffusion (Gaussian and mixed regimes).

The engine inverts ``clients.tabdiff.model.diffusion_loss`` -- the very function clients train
with. Goliath = tabular-aware objective (per-group normalised gradient matching of numeric,
categorical and shared parameters + noise prior + mask/noise-level consistency) optimised by a
cyclic loop, closed-form initialisation, restarts scored by gradient match, and multi-round
aggregation (Hungarian row alignment + per-cell vote). The baselines (``attacks.dlg``, ``idlg``,
``inverting_gradients``, ``tableak``, ``random_baseline``; settings in ``attacks.baseline_common``)
are other settings of the same engine, so every method gets the same observer and budget knobs.

Modules: ``knowledge`` (Goliath's settings, what the engine reads of the denoiser), ``objective``
(gradient matching, variables), ``closed_forms``, ``optimisation`` (the engine), ``aggregation``
(multi-round), ``attack`` (the engine on the context's ``DiffusionReplay``), ``scoring`` (ground
truth, scorer only). Registration below.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.common import InversionAttack, ObservedParams
from flowerbed.attacks.goliath.aggregation import aggregate_rounds, align_and_vote
from flowerbed.attacks.goliath.attack import TabularInversion
from flowerbed.attacks.goliath.closed_forms import (
    analytic_b1,
    analytic_mixed,
    analytic_time,
    closed_form,
    closed_form_local_sgd,
    group_visits,
    timesteps_from_embedding,
)
from flowerbed.attacks.goliath.knowledge import GOLIATH, prior_rows
from flowerbed.attacks.goliath.optimisation import invert
from flowerbed.attacks.goliath.scoring import TruthScorer
from flowerbed.attacks.inversion.types import DiffusionReplay
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param

__all__ = [
    "GOLIATH", "GoliathParams", "TabularInversion", "TruthScorer", "aggregate_rounds", "align_and_vote",
    "analytic_b1", "analytic_mixed", "analytic_time", "closed_form", "closed_form_local_sgd",
    "group_visits", "invert", "prior_rows", "timesteps_from_embedding",
]  # fmt: skip


@dataclass
class GoliathParams(ObservedParams):
    """Goliath's budget (``goliath``, ``goliath-adaptive``): restarts, optimiser steps per
    restart, cycles of the latent/row loop."""

    restarts: int = param(4, ge=1)
    iterations: int = param(400, ge=1)
    cycles: int = param(4, ge=1)


@ATTACKS.register("goliath", "Goliath: cyclic gradient inversion of federated tabular diffusion")
class Goliath(InversionAttack):
    needs = frozenset({Capability.TABULAR_DIFFUSION})
    settings = GOLIATH
    scorer = TruthScorer

    @dataclass
    class Params(GoliathParams):  # Goliath's budget, and:
        aggregate_rounds: bool = True  # pool each client's rounds (FedAvg: the same rows again)

    params: Params

    def engine(self) -> TabularInversion:
        return TabularInversion(self.ctx.replay_as(DiffusionReplay), self.budgeted())
