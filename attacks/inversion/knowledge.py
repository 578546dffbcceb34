"""What a gradient-inversion attacker on a model-loss workload knows and sees, its budget knobs,
and a reconstruction.

Threat model: an honest-but-curious server that knows the contract (``clients.model_loss``:
architecture, loss, input/label schema, agreed preprocessing, local protocol), the arrays it sent
and one client's reply with its ``num-examples``. Unknown: the inputs and their labels.
"""

from __future__ import annotations

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


DLG = InversionSettings(objective="l2", labels="joint", sign=False, box=False, decay=False, lr=0.1)
IDLG = replace(DLG, labels="analytic")
INVERTING_GRADIENTS = InversionSettings(objective="cosine", labels="analytic", tv=1e-4, sign=True,
                                        box=True, decay=True, lr=0.1)  # fmt: skip

SETTINGS: dict[str, InversionSettings] = {
    "dlg": DLG, "idlg": IDLG, "inverting-gradients": INVERTING_GRADIENTS,
}  # fmt: skip


def with_budget(
    settings: InversionSettings, params: dict[str, Any], seed: int
) -> InversionSettings:
    """Apply an attack's typed params (budget knobs) to its settings."""
    keys = {"restarts", "iterations"}
    return replace(settings, seed=seed, **{k: v for k, v in params.items() if k in keys})


@dataclass
class Recovered:
    """A reconstruction of one update: model-space inputs, labels, decoded inputs."""

    x: torch.Tensor  # (B, *shape) model space
    y: torch.Tensor  # (B,) class indices
    score: float  # the objective at the end (lower = better match)
    decoded: Any = None  # original units (DataFrame rows, or images)
    seconds: float = 0.0
    method: str = ""
