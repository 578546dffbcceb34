"""What the attacker knows and sees: public knowledge, budget knobs, a reconstruction.

Threat model: an honest-but-curious server that knows the global parameters, the architecture,
the loss (regime, schedule, weights), the protocol (FedSGD/FedAvg, batch size, lr, local steps)
and the public schema/preprocessing, and sees one client's update. Unknown: the rows and the
per-row latents (t, eps, and in the mixed regime the [MASK] pattern).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from flowerbed.clients.tabdiff.model import Denoiser, DiffusionSpec, split_blocks
from flowerbed.clients.tabdiff.preprocess import TablePreprocessor
from flowerbed.clients.tabdiff.training import Protocol

CLOSED_FORM_ACCEPT = 1e-3  # gradient-match score under which a FedSGD closed form is exact
LOCAL_SGD_ACCEPT = 1e-2  # the same for local SGD (its steps are read at the global model)
BOUND = 5.2  # QuantileTransformer's normal output lives in [-5.2, 5.2]
GROUPS = ("numeric", "categorical", "shared")


# -- what the attacker knows and sees ----------------------------------------------------------
@dataclass
class Knowledge:
    """Public knowledge of an honest-but-curious server."""

    model: Denoiser
    params: dict[str, torch.Tensor]  # the global model sent this round
    protocol: Protocol
    prep: TablePreprocessor
    #: a defense's public transform of an update, as a defense-aware attacker models it (applied to
    #: every simulated update before matching; None = the server sees the update as trained)
    view: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None

    @property
    def spec(self) -> DiffusionSpec:
        return self.model.spec


@dataclass
class InversionConfig:
    """Budget and method knobs shared by Goliath and the baselines."""

    objective: str = "goliath"  # l2 | cosine | goliath
    cat_param: str = "softmax"  # softmax (structural prior) | raw (continuous one-hot relaxation)
    latents: str = "cyclic"  # fixed | joint | cyclic | oracle
    restarts: int = 4
    iterations: int = 400  # optimiser steps per restart
    cycles: int = 4
    lr: float = 0.05
    sign: bool = False  # signed gradients (TabLeak / Inverting Gradients)
    analytic_init: bool = True
    pooling: str = "best"  # best | median (TabLeak median+softmax over restarts)
    w_groups: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
    lam_eps: float = 1e-2
    lam_mask: float = 1e-2
    lam_dens: float = 1e-1
    t_grid: int = 24
    label_recovery: bool = True  # restrict categories to the support the gradient reveals
    adam_as_signs: bool = True  # FedAvg-Adam, mixed: the update as a sign-compressed gradient
    seed: int = 0


@dataclass
class Reconstruction:
    num: torch.Tensor  # (B, n) normal space
    cat: torch.Tensor  # (B, sum K) probabilities
    t: np.ndarray | None
    mask: np.ndarray | None
    score: float
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)
    entropy: np.ndarray | None = None
    seconds: float = 0.0
    eps: np.ndarray | None = None  # (B, eps_dim) the fitted noise, beside t and mask (a warm start)


def observed_target(
    know: Knowledge, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The matching target from the arrays: grad = (sent - reply)/lr (FedSGD), else the delta."""
    delta = {k: (sent[k].double() - reply[k].double()).float() for k in sent}
    if know.protocol.kind == "fedsgd":
        return {k: v / know.protocol.lr for k, v in delta.items()}
    return delta


def sign_surrogate(know: Knowledge, target: dict[str, torch.Tensor], batch: int) -> tuple[Knowledge, dict[str, torch.Tensor]]:  # fmt: skip
    """FedAvg with Adam read as one FedSGD gradient of the batch, sign-compressed.

    Adam's first step is ``lr * m_hat / (sqrt(v_hat) + eps) = lr * g / (|g| + eps)``, i.e.
    ``lr * sign(g)`` with exact zeros where the gradient is zero; later steps on the same rows
    keep that sign pattern and mix magnitudes only through per-coordinate ratios. Differentiating
    through the unrolled Adam steps gives almost no signal (the sign is flat), while the engine's
    scale-free per-group cosine against the update reads the sign pattern directly, and the
    zero pattern of the one-hot input columns is the category support. Used in the mixed regime
    only: Gaussian inputs have no exact zeros, and there the signs alone land below the unrolled
    loop (measured, docs/goliath.md)."""
    protocol = replace(
        know.protocol, kind="fedsgd", batch_size=max(know.protocol.batch_size, batch)
    )
    surrogate = Knowledge(know.model, know.params, protocol, know.prep)
    return surrogate, {k: v / know.protocol.lr for k, v in target.items()}


def local_steps(protocol: Protocol, batch: int) -> int:
    if protocol.kind == "fedsgd":
        return 1
    per_epoch = math.ceil(batch / protocol.batch_size)
    steps = protocol.local_epochs * per_epoch
    return min(steps, protocol.max_steps) if protocol.max_steps else steps


def decode(know: Knowledge, num: torch.Tensor, cat: torch.Tensor) -> pd.DataFrame:
    codes = [b.argmax(1) for b in split_blocks(cat, know.spec.cat_sizes)]
    codes_t = torch.stack(codes, 1) if codes else torch.zeros(len(num), 0, dtype=torch.long)
    return know.prep.decode(num.double().numpy(), codes_t.numpy())


def prior_rows(know: Knowledge, batch: int, seed: int) -> Reconstruction:
    """Rows from the public prior alone: each numeric cell from the agreed preprocessing's quantile
    function, each category from its public frequency (``TablePreprocessor.frequencies``;
    uniform without them), independently; the update is not read (TabLeak's random baseline)."""
    gen = torch.Generator().manual_seed(int(seed) % 2**63)
    prep, spec = know.prep, know.spec
    num = torch.zeros(batch, spec.n_num, dtype=torch.float64)
    if spec.n_num and prep.quantile is not None:  # a normal draw through the quantile function,
        z = torch.randn(batch, spec.n_num, generator=gen, dtype=torch.float64).clamp(-BOUND, BOUND)
        values = prep.quantile.inverse_transform(z.numpy())  # ... re-encoded: ties land on their
        num = torch.from_numpy(prep.quantile.transform(values))  # own normal-space value
    blocks = []
    for c, k in zip(prep.categorical, spec.cat_sizes, strict=True):
        freq = (prep.frequencies or {}).get(c)
        probs = (
            torch.tensor(freq, dtype=torch.float64) if freq else torch.ones(k, dtype=torch.float64)
        )
        codes = torch.multinomial(probs / probs.sum(), batch, replacement=True, generator=gen)
        blocks.append(torch.nn.functional.one_hot(codes, k).double())
    cat = torch.cat(blocks, 1) if blocks else torch.zeros(batch, 0, dtype=torch.float64)
    rec = Reconstruction(num.float(), cat.float(), None, None, float("nan"))
    rec.frame = decode(know, rec.num, rec.cat)
    return rec


#: Goliath's own settings; the baselines are other settings of the same engine
GOLIATH = InversionConfig()


def with_config(icfg: InversionConfig, params: dict[str, Any], seed: int) -> InversionConfig:
    """Apply an attack's typed params (budget knobs) to its inversion config."""
    keys = {"restarts", "iterations", "latents", "cycles"}
    return replace(icfg, seed=seed, **{k: v for k, v in params.items() if k in keys})
