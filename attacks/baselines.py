"""Gradient-inversion baselines under the same observer and budget knobs as Goliath.

Each is a setting of ``attacks.goliath``'s engine (same simulated client, same budget):

* ``dlg`` — L2 gradient distance on raw continuous rows (relaxed one-hot, no softmax).
* ``idlg`` — DLG + iDLG-style analytic category recovery: categories absent from the batch
  (zero input-projection columns / non-negative categorical-head-bias gradient, mixed regime)
  are removed from the search space.
* ``inverting-gradients`` — cosine distance, Adam on signed gradients, box [0, 1] on one-hots,
  step decay at 3/8, 5/8, 7/8 of the budget, one restart.
* ``tableak`` — cosine + softmax/sigmoid structural priors + pooled restarts (median+softmax).
* ``random-baseline`` — each cell from the empirical marginal (TabLeak's ``all_empirical``).
* ``ORACLE`` — Goliath's row step given the true latents: an upper bound, not an attack (the
  latents come from the scorer), so it is run by ``flowerbed.apps.attack_eval`` only, never registered.

``latents``: ``fixed`` (random draws from the training distribution) or ``joint`` (optimised).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.goliath import (
    GOLIATH,
    InversionConfig,
    Knowledge,
    Reconstruction,
    TabularInversion,
    TruthScorer,
    decode,
    with_config,
)
from flowerbed.attacks.observer import AttackObserver
from flowerbed.clients.core.capabilities import Capability

DLG = InversionConfig(objective="l2", cat_param="raw", latents="joint", restarts=1, lr=0.05, label_recovery=False,
                      analytic_init=False)  # fmt: skip
IDLG = replace(DLG, label_recovery=True)
IG = InversionConfig(objective="cosine", cat_param="raw", latents="joint", restarts=1, lr=0.1, label_recovery=False,
                     sign=True, analytic_init=False)  # fmt: skip
TABLEAK = InversionConfig(objective="cosine", cat_param="softmax", latents="joint", restarts=4, label_recovery=False,
                          lr=0.06, sign=True, analytic_init=False, pooling="median")  # fmt: skip
ORACLE = replace(GOLIATH, latents="oracle", restarts=1)

CONFIGS: dict[str, InversionConfig] = {
    "goliath": GOLIATH, "dlg": DLG, "idlg": IDLG, "inverting-gradients": IG, "tableak": TABLEAK,
}  # fmt: skip


def random_reconstruction(know: Knowledge, batch: int, marginals: Any, seed: int) -> Reconstruction:
    """Empirical-marginal draw in model space (the floor every attack must beat)."""
    rng = np.random.default_rng(seed)
    num_pool, code_pool = marginals
    num = np.stack(
        [num_pool[rng.integers(0, len(num_pool), batch), j] for j in range(num_pool.shape[1])], 1
    )
    codes = np.stack(
        [code_pool[rng.integers(0, len(code_pool), batch), j] for j in range(code_pool.shape[1])], 1
    )
    cat = np.concatenate([np.eye(k)[codes[:, j]] for j, k in enumerate(know.spec.cat_sizes)], 1)
    rec = Reconstruction(
        torch.from_numpy(num).float(), torch.from_numpy(cat).float(), None, None, 0.0
    )
    rec.frame = decode(know, rec.num, rec.cat)
    return rec


@dataclass
class BaselineParams:
    target_clients: list[int] = field(default_factory=lambda: [0])
    restarts: int = 1
    iterations: int = 400
    latents: str = "joint"
    rounds: list[int] = field(default_factory=list)  # attacked rounds; empty = every round


def _register(name: str, description: str, base: InversionConfig) -> None:
    @ATTACKS.register(name, description)
    class Entry:
        Params = BaselineParams
        needs = frozenset({Capability.TABULAR_DIFFUSION})
        config = base

        @classmethod
        def wrap(cls, strategy: Any, cfg: dict[str, Any], writer: Any) -> Any:
            icfg = with_config(cls.config, cfg["attack"]["params"], cfg["seed"])
            return AttackObserver(strategy, writer, TabularInversion(cfg, icfg), TruthScorer(cfg),
                                  cfg["attack"]["params"]["target_clients"],
                                  rounds=cfg["attack"]["params"]["rounds"])  # fmt: skip


_register("dlg", "Deep Leakage from Gradients (L2) adapted to tabular diffusion", DLG)
_register("idlg", "iDLG: DLG + analytic category-support recovery", IDLG)
_register("inverting-gradients", "Inverting Gradients (cosine, signed Adam, box)", IG)
_register("tableak", "TabLeak adapted (softmax/sigmoid priors, pooled restarts)", TABLEAK)


class RandomRows(TabularInversion):
    """Each cell drawn from the public empirical marginal; ignores the update."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg, GOLIATH)
        data = self.workload.prep
        table = self.workload.table
        self.marginals = data.encode(table.train)  # public marginals (the attacker's prior)
        self.seed = int(cfg["seed"])

    def reconstruct(self, know: Knowledge, target: dict, batch: int) -> Reconstruction:
        return random_reconstruction(know, batch, self.marginals, self.seed)


@ATTACKS.register("random-baseline", "Empirical-marginal random rows (TabLeak floor)")
class RandomBaseline:
    Params = BaselineParams
    needs = frozenset({Capability.TABULAR_DIFFUSION})

    @classmethod
    def wrap(cls, strategy: Any, cfg: dict[str, Any], writer: Any) -> Any:
        return AttackObserver(strategy, writer, RandomRows(cfg), TruthScorer(cfg),
                              cfg["attack"]["params"]["target_clients"],
                                  rounds=cfg["attack"]["params"]["rounds"])  # fmt: skip
