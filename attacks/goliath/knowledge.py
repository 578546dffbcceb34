"""Goliath's settings and what its engine reads of the denoiser's public knowledge.

Threat model: an honest-but-curious server that knows the global parameters, the architecture,
the loss (regime, schedule, weights), the protocol (FedSGD/FedAvg, batch size, lr, local steps)
and the public schema/preprocessing (``attacks.common.DiffusionReplay``), and sees one client's
update (``attacks.common.Knowledge``). Unknown: the rows and the per-row latents (t, eps, and in
the mixed regime the [MASK] pattern).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from flowerbed.attacks.inversion.types import (
    DiffusionKnobs,
    DiffusionReplay,
    InversionSettings,
    Knowledge,
    Reconstruction,
)
from flowerbed.clients.tabdiff.model import Rows
from flowerbed.clients.tabdiff.training import Protocol

CLOSED_FORM_ACCEPT = 1e-3  # gradient-match score under which a FedSGD closed form is exact
LOCAL_SGD_ACCEPT = 1e-2  # the same for local SGD (its steps are read at the global model)
BOUND = 5.2  # QuantileTransformer's normal output lives in [-5.2, 5.2]
GROUPS = ("numeric", "categorical", "shared")

#: Goliath: its objective (per-group normalised gradient matching + latent priors) in the cyclic
#: loop from the closed forms, four restarts scored by gradient match
GOLIATH = InversionSettings(objective="goliath", restarts=4, sign=False, decay=False,
                            diffusion=DiffusionKnobs())  # fmt: skip


def sign_surrogate(know: Knowledge[DiffusionReplay]) -> Knowledge[DiffusionReplay]:
    """FedAvg with Adam read as one FedSGD gradient of the batch, sign-compressed.

    Adam's first step is ``lr * m_hat / (sqrt(v_hat) + eps) = lr * g / (|g| + eps)``, i.e.
    ``lr * sign(g)`` with exact zeros where the gradient is zero; later steps on the same rows
    keep that sign pattern and mix magnitudes only through per-coordinate ratios. Differentiating
    through the unrolled Adam steps gives almost no signal (the sign is flat), while the engine's
    scale-free per-group cosine against the update reads the sign pattern directly, and the
    zero pattern of the one-hot input columns is the category support. Used in the mixed regime
    only: Gaussian inputs have no exact zeros, and there the signs alone land below the unrolled
    loop (measured, docs/goliath.md)."""
    protocol = know.replay.protocol
    fedsgd = replace(protocol, kind="fedsgd", batch_size=max(protocol.batch_size, know.batch))
    return Knowledge(replace(know.replay, protocol=fedsgd), know.params,
                     {k: v / protocol.lr for k, v in know.update.items()}, know.batch)  # fmt: skip


def local_steps(protocol: Protocol, batch: int) -> int:
    if protocol.kind == "fedsgd":
        return 1
    per_epoch = math.ceil(batch / protocol.batch_size)
    steps = protocol.local_epochs * per_epoch
    return min(steps, protocol.max_steps) if protocol.max_steps else steps


def prior_rows(replay: DiffusionReplay, batch: int, seed: int) -> Reconstruction:
    """Rows from the public prior alone: each numeric cell from the agreed preprocessing's quantile
    function, each category from its public frequency (``TablePreprocessor.frequencies``;
    uniform without them), independently; the update is not read (TabLeak's random baseline)."""
    gen = torch.Generator().manual_seed(int(seed) % 2**63)
    prep, spec = replay.prep, replay.spec
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
    rows = Rows(num.float(), cat.float())
    return Reconstruction(rows, float("nan"), decoded=replay.decode(rows.num, rows.cat))
