"""What a gradient-inversion attacker on a model-loss workload knows and sees, its budget knobs,
and a reconstruction.

Threat model: an honest-but-curious server that knows the contract (``clients.model_loss``:
architecture, loss, input/label schema, agreed preprocessing, local protocol), the arrays it sent
and one client's reply with its ``num-examples``. Unknown: the inputs and their labels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from flowerbed.clients.model_loss import ModelLoss


@dataclass
class ServerView:
    """One observed client update, with the public knowledge needed to invert it."""

    contract: ModelLoss
    params: dict[str, torch.Tensor]  # the global model sent this round
    update: dict[str, torch.Tensor]  # (sent - reply) / lr: the gradient under FedSGD
    batch: int  # the reply's num-examples
    #: how the attacker reads an update: a simulated (clean) update -> what the server would see
    #: of it (a defense's public mechanism; None = as it is, the unaware attacker)
    reading: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None
    #: a first-layer input column whose entries are all at most this (absolute) reads "no row
    #: holds this category" (``attacks.inversion.tabular``): exact zeros for the unaware
    #: attacker; a defense-aware one sets it from the defense's mechanism (None: no rule)
    absent_at: float | None = 0.0
    #: the update is the example-weighted mean of this many clients' updates (secure
    #: aggregation), each of ``batch / members`` examples
    members: int = 1


def server_view(
    contract: ModelLoss, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], batch: int
) -> ServerView:
    """The update as the attacker reads it, computed in float64 from the float32 arrays."""
    lr = contract.training.lr
    update = {
        k: ((sent[k].double() - reply[k].double()) / lr).to(sent[k].dtype)
        for k in sent
        if k in reply
    }
    return ServerView(contract, dict(sent), update, batch)


@dataclass(frozen=True)
class InversionSettings:
    """Budget and method knobs of the optimisation attacks (DLG, iDLG, Inverting Gradients)."""

    objective: str = "cosine"  # l2 (DLG) | cosine (Inverting Gradients)
    labels: str = "analytic"  # joint (DLG: soft labels optimised) | analytic (iDLG label recovery)
    tv: float = 0.0  # total-variation prior weight (images only)
    sign: bool = True  # Adam on signed gradients (Inverting Gradients)
    box: bool = True  # project the inputs into the schema's box after every step
    decay: bool = True  # lr x 0.1 at 3/8, 5/8 and 7/8 of the budget
    lr: float = 0.1
    iterations: int = 400
    restarts: int = 1
    seed: int = 0
    #: tables: categorical groups as softmax of free logits (TabLeak) instead of box-projected
    structure: bool = False
    #: tables: drop the categories the update says no row holds (``tabular.present_columns``)
    support: bool = False
    #: combine the restarts (TabLeak's pooling: matched median / mean probabilities) instead of
    #: keeping the best one
    pooling: bool = False
    #: start the first restart from the analytic first-layer reconstruction (the rows several
    #: first-layer neurons agree on, prior draws for the rest; ``analytic.invert_analytic``)
    analytic_init: bool = False
    #: tables with ``structure``: step size of the numeric columns (0 = ``lr``); small keeps them
    #: near their (prior) start unless the update pushes them consistently
    numeric_lr: float = 0.0


DLG = InversionSettings(objective="l2", labels="joint", sign=False, box=False, decay=False, lr=0.1)
IDLG = replace(DLG, labels="analytic")
INVERTING_GRADIENTS = InversionSettings(objective="cosine", labels="analytic", tv=1e-4, sign=True,
                                        box=True, decay=True, lr=0.1)  # fmt: skip

#: TabLeak adapted to a classifier on an encoded table: cosine, signed Adam with step decay,
#: softmax-structured categorical groups restricted to the categories present in the update,
#: started from the analytic first-layer rows, two restarts pooled (``attacks.inversion.tabular``)
TABLEAK = InversionSettings(objective="cosine", labels="analytic", sign=True, box=True, decay=True,
                            lr=0.1, restarts=2, structure=True, support=True, pooling=True,
                            analytic_init=True, numeric_lr=0.01)  # fmt: skip

SETTINGS: dict[str, InversionSettings] = {
    "dlg": DLG, "idlg": IDLG, "inverting-gradients": INVERTING_GRADIENTS, "tableak": TABLEAK,
}  # fmt: skip


def with_budget(
    settings: InversionSettings, params: dict[str, Any], seed: int
) -> InversionSettings:
    """Apply an attack's typed params (budget knobs) to its settings; 0 keeps the settings' own
    value (the defense-aware variants' ``restarts=0`` / ``iterations=0``: the attack's default)."""
    keys = {"restarts", "iterations"}
    budget = {k: v for k, v in params.items() if k in keys and v}
    return replace(settings, seed=seed, **budget)


@dataclass
class Recovered:
    """A reconstruction of one update: model-space inputs, labels, decoded inputs."""

    x: torch.Tensor  # (B, *shape) model space
    y: torch.Tensor  # (B,) class indices
    score: float  # the objective at the end (lower = better match)
    decoded: Any = None  # original units (DataFrame rows, or images)
    seconds: float = 0.0
    method: str = ""
