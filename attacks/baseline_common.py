"""What the gradient-inversion baselines share: their settings of Goliath's engine, their params,
needs and observers (each baseline is registered in its own module: ``dlg``, ``idlg``,
``inverting_gradients``, ``tableak``, ``random_baseline``, ``analytic_fc``).

``dlg``, ``idlg``, ``inverting-gradients``, ``tableak`` and ``random-baseline`` declare two
alternative needs: ``tabular-diffusion`` (then they are settings of Goliath's engine, below) or
``model-loss`` (then they run ``attacks.inversion`` on the workload's model-loss contract: any
torch classifier, with its local steps replayed). ``analytic-fc`` (input recovery through a fully
connected first layer) needs ``model-loss`` + ``linear-first-layer``. The observer, budget knobs
and per-round metrics are the same for all.

On tabular diffusion each is a setting of ``attacks.goliath``'s engine (same simulated client, same
budget):

* ``dlg`` — L2 gradient distance on raw continuous rows (relaxed one-hot, no softmax).
* ``idlg`` — DLG + iDLG-style analytic category recovery: categories absent from the batch
  (zero input-projection columns / non-negative categorical-head-bias gradient, mixed regime)
  are removed from the search space.
* ``inverting-gradients`` — cosine distance, Adam on signed gradients, box [0, 1] on one-hots,
  step decay at 3/8, 5/8, 7/8 of the budget, one restart.
* ``tableak`` — cosine + softmax/sigmoid structural priors + pooled restarts (median+softmax).
* ``random-baseline`` — each cell from the public marginal (TabLeak's ``all_empirical``): the
  prior every score is measured above (``attacks.prior``; no prior-keeping, it is the prior).
* ``ORACLE`` — Goliath's row step given the true latents: an upper bound, not an attack (the
  latents come from the scorer), so it is run by ``flowerbed.apps.attack_eval`` only, never registered.

``latents``: ``fixed`` (random draws from the training distribution) or ``joint`` (optimised).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch

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
from flowerbed.attacks.inversion import SETTINGS, InversionSettings, with_budget
from flowerbed.attacks.inversion.attack import ModelLossAttack, model_loss_of
from flowerbed.attacks.inversion.scoring import ClassifierScorer
from flowerbed.attacks.observer import AttackObserver
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import choices, param
from flowerbed.clients.workloads import WORKLOADS

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


Latents = choices("Latents", ("fixed", "joint"))


@dataclass
class BaselineParams:
    target_clients: list[int] = param(factory=lambda: [0], ge=0)
    restarts: int = param(1, ge=1)
    iterations: int = param(400, ge=1)
    latents: Latents = Latents("joint")  # tabular diffusion only: fixed | joint
    rounds: list[int] = param(
        factory=list, ge=0
    )  # attacked rounds (1..rounds: checked on resolve); empty = all


ON_DIFFUSION = frozenset({Capability.TABULAR_DIFFUSION})
ON_MODEL_LOSS = frozenset({Capability.MODEL_LOSS})


def on_diffusion(cfg: dict[str, Any]) -> bool:
    """Whether the configured workload is the tabular-diffusion one (else: model-loss)."""
    return Capability.TABULAR_DIFFUSION in WORKLOADS.get(cfg["workload"]["name"]).offers


def model_loss_observer(strategy: Any, cfg: dict[str, Any], writer: Any, method: str,
                        settings: InversionSettings, name: str) -> AttackObserver:  # fmt: skip
    """The observer running a model-loss attack, scored against the client's round examples."""
    p = cfg["attack"]["params"]
    attack = ModelLossAttack(
        model_loss_of(cfg), method, with_budget(settings, p, cfg["seed"]), name
    )
    return AttackObserver(strategy, writer, attack, ClassifierScorer(cfg), p["target_clients"],
                          rounds=p["rounds"], keep_prior_guess=method != "random")  # fmt: skip


class EngineSetting:
    """A baseline that is a setting of Goliath's engine on tabular diffusion (``config``) and of
    ``attacks.inversion``'s optimisation loop on a model-loss workload (``SETTINGS[name]``)."""

    Params = BaselineParams
    needs = (ON_DIFFUSION, ON_MODEL_LOSS)
    config: ClassVar[InversionConfig]
    registry_name: ClassVar[str]

    @classmethod
    def wrap(cls, strategy: Any, cfg: dict[str, Any], writer: Any) -> Any:
        p, name = cfg["attack"]["params"], cls.registry_name
        if not on_diffusion(cfg):
            return model_loss_observer(strategy, cfg, writer, "optimised", SETTINGS[name], name)
        icfg = with_config(cls.config, p, cfg["seed"])
        return AttackObserver(strategy, writer, TabularInversion(cfg, icfg), TruthScorer(cfg),
                              p["target_clients"], rounds=p["rounds"])  # fmt: skip
