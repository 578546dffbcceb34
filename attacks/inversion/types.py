"""The gradient inversions' shared types (registers nothing): what both engines -- Goliath's on
tabular diffusion (``attacks.goliath``) and the model-loss loop (``attacks.inversion``) -- read and
answer.

- ``Knowledge``: what the server knows and sees of one update; its model-specific half is a
  ``Replay``: ``DiffusionReplay`` for the tabular-diffusion denoiser, ``ModelLossReplay`` for the
  model-loss contract;
- ``Reconstruction``: what an inversion answers for one update (an ``attacks.common.Answer``);
- ``InversionSettings``: one constant per method, both replays (``DiffusionKnobs``,
  ``ModelLossKnobs``), and ``with_budget``: the settings with a run's seed and an attack's budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import pandas as pd
import torch

from flowerbed.clients.model_loss import ModelLoss
from flowerbed.clients.tabdiff.model import Denoiser, DiffusionSpec, Rows, split_blocks
from flowerbed.clients.tabdiff.preprocess import TablePreprocessor
from flowerbed.clients.tabdiff.training import Protocol as DiffusionProtocol

if TYPE_CHECKING:
    from flowerbed.clients.contracts import TabularDiffusionOffer

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
    def of(cls, workload: TabularDiffusionOffer) -> DiffusionReplay:
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
RP = TypeVar("RP", DiffusionReplay, ModelLossReplay)


@dataclass
class Knowledge(Generic[RP]):
    """One observed client update with the public knowledge needed to invert it (``RP``: the
    replay it is read on: Goliath's engine takes ``Knowledge[DiffusionReplay]``, the model-loss
    loop ``Knowledge[ModelLossReplay]``)."""

    replay: RP  # the public model (architecture, protocol, preprocessing)
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
    def observe(cls, replay: RP, sent: Tensors, reply: Tensors, batch: int) -> Knowledge[RP]:
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
    decoded: Any = None  # original units: DataFrame rows, or images (the scorer knows which)
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
    def rows(self) -> Rows:
        """The denoiser's rows (tabular diffusion; a model-loss tensor is a ``TypeError``)."""
        if not isinstance(self.x, Rows):
            raise TypeError(f"a {self.method or 'model-loss'} reconstruction holds a tensor, not rows")  # fmt: skip
        return self.x

    @property
    def inputs(self) -> torch.Tensor:
        """The model-space input tensor (model-loss; the denoiser's rows are a ``TypeError``)."""
        if isinstance(self.x, Rows):
            raise TypeError(f"a {self.method or 'diffusion'} reconstruction holds rows, not a tensor")  # fmt: skip
        return self.x

    @property
    def labels(self) -> torch.Tensor:
        """The labels (a model with labels; ``TypeError`` where there are none)."""
        if self.y is None:
            raise TypeError(f"a {self.method or 'diffusion'} reconstruction holds no labels")
        return self.y

    @property
    def num(self) -> torch.Tensor:
        """The denoiser rows' numerics (tabular diffusion)."""
        return self.rows.num

    @property
    def cat(self) -> torch.Tensor:
        """The denoiser rows' category probabilities (tabular diffusion)."""
        return self.rows.cat

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
    #: FedAvg-SGD: the local-SGD closed form's rows are the answer wherever it runs (within
    #: h/2 visits), not only where it is exact (else the cyclic loop takes over)
    keep_local_sgd: bool = True


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


def with_budget(settings: InversionSettings, params: object, seed: int) -> InversionSettings:
    """``settings`` with the run's seed and an attack's typed params applied (``restarts``,
    ``iterations``, and on diffusion ``latents``, ``cycles``, where the params have them); a
    budget of 0 keeps the settings' own value (the defense-aware model-loss variants'
    ``restarts=0``: the attack's default)."""
    values = {k: getattr(params, k) for k in (*BUDGET, *DIFFUSION_BUDGET) if getattr(params, k, 0)}
    diffusion = {k: values.pop(k) for k in DIFFUSION_BUDGET if k in values}
    return replace(settings, seed=seed, **values).on_diffusion(**diffusion)
