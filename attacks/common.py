"""The one shape every attack has (registers nothing).

- ``Attack``: the base class of a registered attack. It is built from its validated ``Params``
  (``self.params``) and an ``AttackContext`` (``self.ctx``), never the experiment config, and
  ``wrap(strategy, writer, scorer)`` puts its observer around the server's strategy;
- ``AttackContext``: what the server knows of the run: seed, rounds, clients, the public knowledge
  of the capability the attack runs on (a ``Replay`` of the model, or the model-release setup) and
  the defenses' published mechanisms. The runner builds it (``server/runner.py``);
- ground truth is the scorer's alone: the runner builds the attack class's ``scorer`` from a
  ``TruthSource`` (``attacks.truth``) and hands the scorer to ``wrap``, so the attack's own object
  and its engine never receive it;
- the gradient inversions' shared types: ``InversionSettings`` (one constant per method, both
  replays), ``Knowledge`` (what the server knows and sees of one update; its model-specific half
  is a ``Replay``: ``DiffusionReplay`` for the tabular-diffusion denoiser, Goliath's engine;
  ``ModelLossReplay`` for the model-loss contract, ``attacks.inversion``'s) and
  ``Reconstruction``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch

from flowerbed.attacks.observer import AttackObserver, Scorer
from flowerbed.clients.core.capabilities import Capability, Needs
from flowerbed.clients.core.registry import NoParams
from flowerbed.clients.defenses import Mechanism
from flowerbed.clients.model_loss import ModelLoss
from flowerbed.clients.tabdiff.model import Denoiser, DiffusionSpec, Rows, split_blocks
from flowerbed.clients.tabdiff.preprocess import TablePreprocessor
from flowerbed.clients.tabdiff.training import Protocol as DiffusionProtocol

Tensors = dict[str, torch.Tensor]
#: a defense's public transform of an update, as a defense-aware attacker models it: a simulated
#: (clean) update -> what the server would see of it
Reading = Callable[[Tensors], Tensors]


# -- the public model an update is replayed on (the model-specific half of Knowledge) --------------
@dataclass(frozen=True)
class DiffusionReplay:
    """The tabular-diffusion capability's public knowledge: the denoiser (its parameters come from
    the sent arrays), the local-training protocol and the agreed preprocessing."""

    model: Denoiser
    protocol: DiffusionProtocol
    prep: TablePreprocessor

    @classmethod
    def of(cls, workload: Any) -> DiffusionReplay:
        """The public half of a tabular-diffusion ``workload`` (the server's own copy)."""
        return cls(workload.model, workload.protocol, workload.prep)

    @property
    def spec(self) -> DiffusionSpec:
        return self.model.spec

    def target(self, sent: Tensors, reply: Tensors) -> Tensors:
        """What Goliath matches: the gradient ``(sent - reply) / lr`` (FedSGD), else the delta."""
        delta = {k: (sent[k].double() - reply[k].double()).float() for k in sent}
        if self.protocol.kind == "fedsgd":
            return {k: v / self.protocol.lr for k, v in delta.items()}
        return delta

    def decode(self, num: torch.Tensor, cat: torch.Tensor) -> pd.DataFrame:
        """Rows in original units: numerics through the preprocessing, each category by argmax."""
        codes = [b.argmax(1) for b in split_blocks(cat, self.spec.cat_sizes)]
        codes_t = torch.stack(codes, 1) if codes else torch.zeros(len(num), 0, dtype=torch.long)
        return self.prep.decode(num.double().numpy(), codes_t.numpy())


@dataclass(frozen=True)
class ModelLossReplay:
    """The model-loss capability's public knowledge: the workload's ``ModelLoss`` contract
    (architecture, loss, input schema, preprocessing's inverse, local-training protocol)."""

    contract: ModelLoss

    def target(self, sent: Tensors, reply: Tensors) -> Tensors:
        """``(sent - reply) / lr`` computed in float64 from the float32 arrays (the gradient under
        FedSGD; the replayed local steps give the same units under FedAvg)."""
        lr = self.contract.training.lr
        return {k: ((sent[k].double() - reply[k].double()) / lr).to(sent[k].dtype)
                for k in sent if k in reply}  # fmt: skip


Replay = DiffusionReplay | ModelLossReplay


# -- what the attacker knows and sees of one update ------------------------------------------------
@dataclass
class Knowledge:
    """One observed client update with the public knowledge needed to invert it."""

    replay: Replay  # the public model (architecture, protocol, preprocessing)
    params: Tensors  # the global model sent this round
    update: Tensors  # what the replay matches (``Replay.target`` of the reply)
    batch: int  # the reply's num-examples
    #: how the attacker reads an update (a defense's published mechanism; None: as it is)
    reading: Reading | None = None
    #: the update is the example-weighted mean of this many clients' updates (secure aggregation),
    #: each of ``batch / members`` examples
    members: int = 1
    #: a first-layer input column whose entries are all at most this (absolute) reads "no row holds
    #: this category": exact zeros for the unaware attacker; a defense-aware one sets it from the
    #: defense's mechanism (None: no rule)
    absent_at: float | None = 0.0

    @classmethod
    def observe(cls, replay: Replay, sent: Tensors, reply: Tensors, batch: int) -> Knowledge:
        """The server's view of a reply: ``replay``'s target of (sent, reply), ``batch`` examples."""
        return cls(replay, dict(sent), replay.target(sent, reply), batch)

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.params.values())).dtype


# -- a reconstruction ------------------------------------------------------------------------------
@dataclass(eq=False)
class Reconstruction:
    """What an attack answers for one update, whichever replay made it."""

    #: model-space inputs: a tensor (model-loss), or the denoiser's ``Rows`` (numerics in normal
    #: space, per-column category probabilities)
    x: torch.Tensor | Rows
    score: float  # the attack's objective at the end (lower = better match; nan: not matched)
    y: torch.Tensor | None = None  # labels, where the model has them
    decoded: Any = None  # original units: DataFrame rows, or images
    seconds: float = 0.0
    method: str = ""
    #: tabular diffusion: the fitted per-row latents (timestep, [MASK] pattern, noise)
    t: np.ndarray | None = None
    mask: np.ndarray | None = None
    eps: np.ndarray | None = None
    entropy: np.ndarray | None = None  # per-cell entropy of pooled reconstructions
    kept_prior: float | None = None  # set by the prior-keeping attacker (``attacks.prior``)
    choice: dict[str, float] | None = None  # set by the defense-aware selection

    @property
    def num(self) -> torch.Tensor:
        """The denoiser rows' numerics (tabular diffusion)."""
        return self.x.num

    @property
    def cat(self) -> torch.Tensor:
        """The denoiser rows' category probabilities (tabular diffusion)."""
        return self.x.cat

    @property
    def batch(self) -> int:
        return len(self.x.num) if isinstance(self.x, Rows) else len(self.x)


# -- the settings of a gradient inversion: one constant per method, both replays -------------------
@dataclass(frozen=True)
class DiffusionKnobs:
    """Goliath's engine on the tabular-diffusion denoiser (``attacks.goliath``)."""

    lr: float = 0.05
    analytic_init: bool = True  # start from the closed forms (exact where every row separates)
    cat_param: str = "softmax"  # softmax (structural prior) | raw (continuous one-hot relaxation)
    latents: str = "cyclic"  # fixed | joint | cyclic | oracle
    cycles: int = 4
    w_groups: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
    lam_eps: float = 1e-2
    lam_mask: float = 1e-2
    lam_dens: float = 1e-1
    t_grid: int = 24
    label_recovery: bool = True  # restrict categories to the support the gradient reveals
    adam_as_signs: bool = True  # FedAvg-Adam, mixed: the update as a sign-compressed gradient


@dataclass(frozen=True)
class ModelLossKnobs:
    """``attacks.inversion``'s loop on a model-loss contract (the local steps replayed)."""

    lr: float = 0.1
    #: start the first restart from the analytic first-layer rows (``analytic.invert_analytic``)
    analytic_init: bool = False
    labels: str = "analytic"  # joint (DLG: soft labels optimised) | analytic (iDLG recovery)
    tv: float = 0.0  # total-variation prior weight (images only)
    box: bool = True  # project the inputs into the schema's box after every step
    #: tables: categorical groups as softmax of free logits (TabLeak) instead of box-projected
    structure: bool = False
    #: tables: drop the categories the update says no row holds (``tabular.present_columns``)
    support: bool = False
    #: tables with ``structure``: step size of the numeric columns (0 = ``lr``)
    numeric_lr: float = 0.0


@dataclass(frozen=True)
class InversionSettings:
    """A gradient inversion's knobs: those both engines share, and each replay's own section.

    ``method``: ``optimised`` (match the replayed update), ``analytic`` (a fully connected first
    layer read in closed form; model-loss only) or ``prior`` (draws from the public prior that
    ignore the update: the floor). ``decay``: lr x 0.1 at 3/8, 5/8, 7/8 of the budget. ``pooling``:
    ``best`` restart, or ``median`` (TabLeak's matched median / mean probabilities)."""

    method: str = "optimised"
    objective: str = "cosine"  # l2 (DLG) | cosine (Inverting Gradients) | goliath (diffusion)
    restarts: int = 1
    iterations: int = 400  # optimiser steps per restart
    sign: bool = True  # Adam on signed gradients
    decay: bool = True
    pooling: str = "best"
    seed: int = 0
    diffusion: DiffusionKnobs = field(default_factory=DiffusionKnobs)
    model_loss: ModelLossKnobs = field(default_factory=ModelLossKnobs)

    def on_diffusion(self, **changes: Any) -> InversionSettings:
        """These settings with ``changes`` to the diffusion section."""
        return replace(self, diffusion=replace(self.diffusion, **changes))

    def on_model_loss(self, **changes: Any) -> InversionSettings:
        """These settings with ``changes`` to the model-loss section."""
        return replace(self, model_loss=replace(self.model_loss, **changes))


#: budget knobs an attack's ``Params`` may set: shared ones, and the diffusion engine's own
BUDGET, DIFFUSION_BUDGET = ("restarts", "iterations"), ("latents", "cycles")


def with_budget(settings: InversionSettings, params: Any, seed: int) -> InversionSettings:
    """``settings`` with the run's seed and an attack's typed params applied (``restarts``,
    ``iterations``, and on diffusion ``latents``, ``cycles``, where the params have them); a
    budget of 0 keeps the settings' own value (the defense-aware model-loss variants'
    ``restarts=0``: the attack's default)."""
    values = {k: getattr(params, k) for k in (*BUDGET, *DIFFUSION_BUDGET) if getattr(params, k, 0)}
    diffusion = {k: values.pop(k) for k in DIFFUSION_BUDGET if k in values}
    return replace(settings, seed=seed, **values).on_diffusion(**diffusion)


# -- what an attack receives, and what its scorer receives ------------------------------------------
@dataclass(frozen=True)
class AttackContext:
    """The narrow view of a run an attack gets (``server/runner.py: attack_context``).

    ``capabilities``: what the workload offers of the attack's ``needs`` (the alternative that
    fits: an attack picks its implementation from it); ``replay``: the public model of a
    ``model-loss`` or ``tabular-diffusion`` workload; ``release``: a ``model-release`` workload's
    setup (victim architecture, data split) and ``deploy``: the configured release defense's
    deployment of a victim (None: every weight exposed); ``mechanisms``: the defenses' published
    mechanisms in config order (what a defense-aware attack adapts to)."""

    seed: int
    rounds: int
    num_clients: int
    experiment: str
    capabilities: frozenset[Capability] = frozenset()
    mechanisms: tuple[Mechanism, ...] = ()
    replay: Replay | None = None
    release: Any = None
    deploy: Callable[..., Any] | None = None

    def runs_on(self, capability: Capability) -> bool:
        return capability in self.capabilities


# -- the registered class ---------------------------------------------------------------------------
class Attack:
    """Base class of a registered attack: typed ``Params``, ``needs``, a ``scorer``, and ``wrap``.

    ``scorer``: builds the scorer from a ``TruthSource`` (None: the attack scores itself); the
    runner calls it and hands the scorer to ``wrap``, so ground truth never reaches the attack's
    own object. The default ``wrap`` observes ``params.target_clients`` (in ``params.rounds``
    when the params have them) with ``self`` as the attack: ``invert(sent, reply, num_examples)``.
    """

    Params: ClassVar[type] = NoParams
    needs: ClassVar[Needs] = frozenset()
    #: (``TruthSource``) -> the scorer; typed loosely here: attack code never imports the truth
    scorer: ClassVar[Callable[..., Scorer] | None] = None
    #: whether the attack reads what secure aggregation shows the server (group aggregates);
    #: False: it inverts single clients' replies, so a run with an ``Aggregation`` defense is
    #: refused when the config is resolved (it would never score)
    reads_aggregates: ClassVar[bool] = False

    def __init__(self, params: Any, ctx: AttackContext) -> None:
        """``params``: this attack's ``Params``, or its fields as a mapping."""
        if not isinstance(ctx, AttackContext):
            raise TypeError(f"{type(self).__name__} takes an AttackContext, not {type(ctx).__name__}")  # fmt: skip
        if isinstance(params, Mapping):
            params = self.Params(**params)
        if not isinstance(params, self.Params):
            raise TypeError(f"{type(self).__name__} takes its Params, not {type(params).__name__}")
        self.params, self.ctx = params, ctx

    def wrap(self, strategy: Any, writer: Any, scorer: Scorer | None) -> Any:
        """The server's strategy with this attack's observer around it."""
        return AttackObserver(strategy, writer, self, scorer, self.params.target_clients,
                              rounds=getattr(self.params, "rounds", None), seed=self.ctx.seed)  # fmt: skip


class InversionAttack(Attack):
    """A gradient inversion: its ``settings`` (one constant, whichever replay runs it) with the
    run's budget (``with_budget``) in an ``engine`` on the context's replay, behind the observer
    (prior-keeping unless the settings draw from the prior; multi-round pooling where the params
    ask for it, ``aggregate_rounds``)."""

    settings: ClassVar[InversionSettings]
    registry_name: ClassVar[str]

    def budgeted(self) -> InversionSettings:
        """The settings with this run's seed and budget."""
        return with_budget(self.settings, self.params, self.ctx.seed)

    def engine(self) -> Any:
        """What inverts a reply on the context's replay (``invert``, ``prior_guess``, ``match``,
        ``pool``)."""
        raise NotImplementedError

    def wrap(self, strategy: Any, writer: Any, scorer: Scorer | None) -> Any:
        p = self.params
        return AttackObserver(strategy, writer, self.engine(), scorer, p.target_clients,
                              aggregate=getattr(p, "aggregate_rounds", False), rounds=p.rounds,
                              keep_prior_guess=self.settings.method != "prior", seed=self.ctx.seed)  # fmt: skip
