"""Analytic input recovery through a fully connected first layer.

For ``h = W x + b`` and one example, ``dL/dW = delta x^T`` and ``dL/db = delta``: every neuron with
``delta_i != 0`` gives the input exactly, ``x = (dL/dW)_i / (dL/db)_i`` (least squares over all
neurons: ``x = g_b^T G_W / |g_b|^2``). For a batch, neuron i gives the mean of the inputs that
activate it, weighted by their deltas; a neuron that only one example activates (ReLU) gives that
example exactly, so the exact inputs are the candidates that several neurons agree on. SGD local
steps scale every neuron's pair alike, so the ratios survive (to first order); Adam's do not
(refused at config time, ``Capability.LINEAR_FIRST_LAYER``). Without the bias there is no ratio:
the attack has nothing to divide by and returns prior draws.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from sklearn.cluster import AgglomerativeClustering

from flowerbed.attacks.inversion.labels import assign_labels, recover_labels
from flowerbed.attacks.inversion.simulate import distance, observed
from flowerbed.attacks.inversion.types import Knowledge, ModelLossReplay, Reconstruction

ACTIVE = 1e-6  # a neuron counts when |dL/db_i| exceeds this fraction of the largest
AGREE = 1e-2  # candidates closer than this (RMS, in units of the input box) are the same input
SLACK = 0.05  # candidates may leave the input box by this fraction of its width (rounding)


def single_input(g_w: torch.Tensor, g_b: torch.Tensor) -> torch.Tensor:
    """The input of a biased linear layer for one example: least-squares ratio over neurons."""
    return (g_b @ g_w) / (g_b @ g_b).clamp_min(1e-300)


def candidates(know: Knowledge[ModelLossReplay]) -> torch.Tensor | None:
    """Per-neuron ratios ``(dL/dW)_i / (dL/db)_i`` that lie in the input box (None without bias)."""
    contract = know.replay.contract
    if contract.first_linear is None:
        raise ValueError("the analytic attack needs a fully connected first layer")
    w_name, b_name = contract.first_linear
    if w_name not in know.update or b_name not in know.update:
        return None
    g_w = know.update[w_name].double().reshape(len(know.update[b_name]), -1)
    g_b = know.update[b_name].double()
    active = g_b.abs() > ACTIVE * float(g_b.abs().max().clamp_min(1e-300))
    ratios = g_w[active] / g_b[active, None]
    low, high = contract.schema.low.double(), contract.schema.high.double()
    width = (high - low).clamp_min(1e-12)
    inside = ((ratios >= low - SLACK * width) & (ratios <= high + SLACK * width)).all(1)
    return ratios[inside]


def group(cands: torch.Tensor, width: torch.Tensor, batch: int) -> list[torch.Tensor]:
    """The inputs several neurons agree on: clusters of candidates (complete linkage, RMS distance
    in box units below ``AGREE``), largest first, each represented by its median; at most
    ``batch``, and only clusters of two or more neurons."""
    if len(cands) < 2:
        return []
    z = (cands / width).numpy()
    labels = AgglomerativeClustering(
        n_clusters=None, distance_threshold=AGREE * np.sqrt(z.shape[1]), linkage="complete"
    ).fit_predict(z)
    sizes = np.bincount(labels)
    order = [c for c in np.argsort(-sizes, kind="stable") if sizes[c] >= 2][:batch]
    return [cands[labels == c].median(0).values for c in order]


def invert_analytic(
    know: Knowledge[ModelLossReplay], seed: int = 0, assign: bool = True
) -> Reconstruction:
    """Recover the batch from the first layer; rows not found are prior draws (not recovered).
    ``assign``: give each row its label by update matching (``assign_labels``, B^2 replays; off
    where only the rows are wanted, e.g. as an optimisation's start)."""
    start = time.perf_counter()
    contract, batch = know.replay.contract, know.batch
    dtype = know.dtype
    schema = contract.schema
    gen = torch.Generator().manual_seed(seed)
    w_name, b_name = contract.first_linear or ("", "")
    found: list[torch.Tensor] = []
    if batch == 1 and b_name in know.update:
        g_b = know.update[b_name].double()
        found = [single_input(know.update[w_name].double().reshape(len(g_b), -1), g_b)]
    elif batch > 1:
        cands = candidates(know)
        if cands is not None:
            found = group(cands, (schema.high - schema.low).double().clamp_min(1e-12), batch)
    rows = [f.to(dtype) for f in found]
    if len(rows) < batch:
        rows += list(contract.draw(batch - len(rows), gen).reshape(batch - len(rows), -1).to(dtype))
    x = torch.stack(rows).reshape(batch, *schema.shape)
    y = recover_labels(know, seed) if contract.last_bias in know.update else torch.zeros(batch).long()  # fmt: skip
    if batch > 1 and assign:
        y = assign_labels(know, x, y)
    sim = observed(know, x, y, create_graph=False)
    score = float(distance(sim, know.update, "cosine").detach())
    return Reconstruction(x.detach(), score, y=y, decoded=contract.decode(x.detach()),
                          seconds=time.perf_counter() - start, method="analytic")  # fmt: skip
