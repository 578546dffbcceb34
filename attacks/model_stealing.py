"""Model stealing against a released model: warm-start from the exposed weights, fine-tune on q.

In the final round the observer takes the global model the server sends (the victim) and the
pooled Fisher diagonal the clients return for it (``fisher.*``, workload ``filosofer``), releases
the victim through the configured release defense (``AttackContext.deploy``: ``filosofer``,
``shield-last-layer``, ``whole-model-tee``; none = all weights exposed; the victim's architecture
and data split are the context's ``release``) and runs the attacker: the exposed weights
fine-tuned on a fraction ``q`` of the training data, best over learning rates (0 = as is), against
the black-box bound (same architecture from scratch on the same data).

Also here: the attacker's loops (``steal``, ``black_box``) and one seed of the central analysis
(``stealing_table``: victim, every release scheme, surrogate per q), used by the tests and
benchmarks/filosofer.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NotRequired, Required, TypedDict

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import Strategy
from torch import nn

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.common import Attack, AttackContext
from flowerbed.attacks.observer import AttackObserver, Hooks
from flowerbed.attacks.prior import advantage
from flowerbed.attacks.protocols import Answer, Scorer, Writer
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.defenses.filosofer import DEFAULT_RHO, Flip, Release, release
from flowerbed.clients.nn import make_mlp
from flowerbed.clients.training import (
    accuracy,
    fisher_diagonal,
    load_state,
    output_entropy,
)
from flowerbed.clients.workloads.filosofer import Split, digits_split, train_victim, unpack


# -- the attacker ------------------------------------------------------------------------------
def attacker_subset(split: Split, q: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fraction ``q`` of the training pool (at least one sample per class where possible)."""
    n = max(int(round(q * len(split.y_train))), 10)
    idx = np.random.default_rng([seed, 17]).permutation(len(split.y_train))[:n]
    return split.x_train[idx], split.y_train[idx]


def steal(
    exposed: dict[str, torch.Tensor] | None, x: torch.Tensor, y: torch.Tensor,
    x_test: torch.Tensor, y_test: torch.Tensor, lrs: tuple[float, ...] = (0.0, 1e-3, 1e-2),
    steps: int = 150, seed: int = 0, keep_last_layer_secret: bool = False,
    hidden: list[int] | None = None,
) -> dict[str, float]:  # fmt: skip
    """Model stealing: warm-start from the exposed weights, fine-tune on ``(x, y)``, best over ``lrs``.

    ``lr = 0`` uses the exposed weights as they are. ``exposed=None`` (nothing exposed) or a
    withheld last layer re-initialise the missing part at random. Full-batch Adam for ``steps``
    steps. Returns the best test accuracy and the per-lr accuracies (the attacker's upper bound:
    the best lr is picked on the test set).
    """
    out: dict[str, float] = {}
    for lr in lrs:
        torch.manual_seed(seed)
        model = make_mlp(hidden=hidden)
        if exposed is not None:
            state = {k: v.clone() for k, v in exposed.items()}
            if keep_last_layer_secret:
                last = [k for k in model.state_dict() if k.startswith(f"{len(model) - 1}.")]
                fresh = model.state_dict()
                state.update({k: fresh[k].clone() for k in last})
            model.load_state_dict(state)
        if lr > 0:
            opt = torch.optim.Adam(model.parameters(), lr=lr)
            model.train()
            for _ in range(steps):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        out[f"lr{lr:g}"] = accuracy(model, x_test, y_test)
    out["best"] = max(out.values())
    return out


def black_box(
    x: torch.Tensor, y: torch.Tensor, x_test: torch.Tensor, y_test: torch.Tensor, steps: int = 150,
    seed: int = 0, hidden: list[int] | None = None,
) -> float:  # fmt: skip
    """The black-box bound: the same architecture from random init on the same data, best lr."""
    return steal(None, x, y, x_test, y_test, (1e-3, 1e-2), steps, seed, hidden=hidden)["best"]


# -- the analysis: one seed of the release-scheme table ----------------------------------------
class ReleaseKwargs(TypedDict, total=False):
    """A release scheme: ``filosofer.release``'s keyword arguments past the victim and its data."""

    scheme: Required[str]
    rho: float
    rank: int
    cross_layer: bool
    entropy_steps: int
    distill_epochs: int
    fisher_chunks: int
    flip: Flip
    flip_low: float


class StealingRow(TypedDict, total=False):
    """One release scheme of :func:`stealing_table`: the user's accuracy, the TEE's shares, what
    the exposed part scores, the surrogate's accuracy per q (and the defense-aware attacker's)."""

    user: float
    tee_params: float
    tee_flops: float
    exposed: float
    entropy: float
    surrogate: dict[float, float]
    adaptive: dict[float, float]


#: one seed of the analysis: the victim's accuracy, the black-box bound per q, each scheme's row
StealingTable = TypedDict(
    "StealingTable",
    {
        "victim": float,
        "schemes": dict[str, StealingRow],
        "black-box": NotRequired[dict[float, float]],
    },
)


SCHEMES: dict[str, ReleaseKwargs] = {
    "none": {"scheme": "none"},
    "shield-last-layer": {"scheme": "shield-last-layer"},
    "whole-model": {"scheme": "whole-model"},
    "random 8%": {"scheme": "random"},
    "magnitude 8%": {"scheme": "magnitude"},
    "FILOsofer 8%": {"scheme": "fisher"},
}


def stealing_table(
    seed: int, qs: tuple[float, ...] = (0.02, 0.05, 0.1),
    schemes: dict[str, ReleaseKwargs] | None = None, steps: int = 150, victim_epochs: int = 40,
    adaptive: Callable[..., dict[str, float]] | None = None,
) -> StealingTable:  # fmt: skip
    """One seed of the analysis: victim, each scheme's release (``release`` kwargs), surrogate per q.

    ``adaptive(exposed, x, y, x_test, y_test, rho, seed=...)``, when given, is a defense-aware
    attacker run on every fully exposed release too (``row["adaptive"]``: the better of it and the
    plain attacker, per q).
    """
    torch.set_num_threads(1)
    split = digits_split(seed)
    victim = train_victim(split, seed, victim_epochs)
    fisher = fisher_diagonal(victim, split.x_train, split.y_train)
    out: StealingTable = {"victim": accuracy(victim, split.x_test, split.y_test), "schemes": {}}
    subsets = {q: attacker_subset(split, q, seed) for q in qs}
    out["black-box"] = {
        q: black_box(*subsets[q], split.x_test, split.y_test, steps, seed) for q in qs
    }
    for name, kwargs in (schemes or SCHEMES).items():
        rel = release(victim, owner_x=split.x_train, owner_y=split.y_train, fisher=fisher,
                      seed=seed, **kwargs)  # fmt: skip
        row: StealingRow = {
            "user": accuracy(rel.user_model, split.x_test, split.y_test),
            "tee_params": rel.tee_param_fraction,
            "tee_flops": rel.tee_flop_fraction,
        }
        if rel.exposed is not None and not rel.keep_last_layer_secret:
            exposed_model = load_state(rel.exposed)
            row["exposed"] = accuracy(exposed_model, split.x_test, split.y_test)
            row["entropy"] = output_entropy(exposed_model, split.x_test)
        row["surrogate"] = {
            q: steal(rel.exposed, *subsets[q], split.x_test, split.y_test, steps=steps, seed=seed,
                     keep_last_layer_secret=rel.keep_last_layer_secret)["best"]
            for q in qs
        }  # fmt: skip
        if adaptive is not None and rel.exposed is not None and not rel.keep_last_layer_secret:
            rho = kwargs.get("rho", DEFAULT_RHO)
            row["adaptive"] = {
                q: max(row["surrogate"][q], adaptive(rel.exposed, *subsets[q], split.x_test,
                                                     split.y_test, rho, seed=seed)["best"])
                for q in qs
            }  # fmt: skip
        out["schemes"][name] = row
    return out


# -- the federated attack ----------------------------------------------------------------------
def release_with(ctx: AttackContext, victim, owner_x, owner_y, fisher, seed: int) -> Release:  # noqa: ANN001
    """Release ``victim`` through the configured release defense (none: all exposed)."""
    if ctx.deploy is not None:
        return ctx.deploy(victim, owner_x, owner_y, fisher, seed)
    return release(victim, "none", owner_x, owner_y, fisher, seed=seed)


#: an extra attacker on the same release: (release, attacker data, test data, seed, hidden widths,
#: params, the plain attack's metrics) -> metrics (the defense-aware stealing attack plugs in here)
ExtraAttack = Callable[..., dict[str, float]]


def attack_release(
    ctx: AttackContext, params: ModelStealing.Params, state: dict[str, torch.Tensor],
    fisher: dict[str, torch.Tensor], extra: ExtraAttack | None = None,
) -> dict[str, float]:  # fmt: skip
    """Deploy the victim ``state`` under the configured defense and steal it; all metrics."""
    torch.set_num_threads(1)
    hidden, split = ctx.release.hidden, ctx.release.split  # the model-release setup
    victim = load_state(state, hidden)
    seed = client_seed(ctx.seed, 0, ctx.rounds, salt=16)
    rel = release_with(ctx, victim, split.x_train, split.y_train, fisher or None, seed)
    x_q, y_q = attacker_subset(split, params.q, ctx.seed)
    test = (split.x_test, split.y_test)
    stolen = steal(rel.exposed, x_q, y_q, *test, tuple(params.lrs), params.steps, seed,
                   rel.keep_last_layer_secret, hidden)  # fmt: skip
    bb = black_box(x_q, y_q, *test, params.steps, seed, hidden)
    out = {
        "victim_accuracy": accuracy(victim, *test),
        "user_accuracy": accuracy(rel.user_model, *test),
        "surrogate_accuracy": stolen["best"],
        "blackbox_accuracy": bb,
        "security_gap": stolen["best"] - bb,
        "tee_param_fraction": rel.tee_param_fraction,
        "tee_flop_fraction": rel.tee_flop_fraction,
        "attacker_samples": float(len(y_q)),
    }
    # the prior: what the attacker's own data gives without the release (the black-box bound)
    out |= {"success": out["surrogate_accuracy"], "prior": bb,
            "advantage": advantage(out["surrogate_accuracy"], bb)}  # fmt: skip
    if rel.exposed is not None and not rel.keep_last_layer_secret:
        exposed = load_state(rel.exposed, hidden)
        out["exposed_accuracy"] = accuracy(exposed, *test)
        out["exposed_entropy"] = output_entropy(exposed, split.x_test)
    if extra is not None:
        out |= extra(rel, (x_q, y_q), test, seed, hidden, params, out)
    return out


class Stealing(Hooks):
    """The observer's hooks for model stealing: nothing per reply; after the final round's
    aggregation, the global model sent that round and the clients' pooled Fisher of it are
    released and stolen (``attack_release``), its metrics logged under ``attack``."""

    def __init__(self, ctx: AttackContext, params: ModelStealing.Params,
                 extra: ExtraAttack | None = None) -> None:  # fmt: skip
        self.ctx, self.params, self.extra = ctx, params, extra

    def aggregated(self, observer: AttackObserver, server_round: int,
                   arrays: ArrayRecord | None) -> None:  # fmt: skip
        if server_round == self.ctx.rounds and observer.sent is not None and arrays is not None:
            state, _ = unpack(observer.sent)
            _, fisher = unpack(arrays)  # the clients' pooled Fisher of the model sent this round
            result = attack_release(self.ctx, self.params, state, fisher, self.extra)
            observer.writer.log(server_round, "attack", result)
            for key, value in result.items():
                observer.writer.set_final(f"attack.{key}", value)


@ATTACKS.register(
    "model-stealing", "fine-tune the exposed weights on a fraction q of the data (vs black-box)"
)
class ModelStealing(Attack):
    """Scores itself: the stolen surrogate's test accuracy against the black-box bound (no
    scorer: the attacker's data and the test split are the model-release setup)."""

    reads_aggregates = True  # it steals the released global model, whatever the server saw

    #: the clients' pooled Fisher of the final model (``fisher.*`` arrays): ``filosofer``
    needs = frozenset({Capability.MODEL_RELEASE})

    @dataclass
    class Params:
        q: float = param(0.05, gt=0, le=1)
        lrs: list[float] = param(factory=lambda: [0.0, 1e-3, 1e-2], ge=0)
        steps: int = param(150, ge=1)

    params: Params

    def wrap(self, strategy: Strategy, writer: Writer, scorer: Scorer[Answer] | None) -> Strategy:
        return AttackObserver(strategy, writer, Stealing(self.ctx, self.params))
