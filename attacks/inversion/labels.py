"""Analytic label recovery (iDLG) from the output layer's bias update, and label assignment to
recovered inputs by update matching.

Under cross-entropy the output bias gradient of one example is ``softmax - onehot(y)``: only the
true class is negative (iDLG, exact for B = 1). For a batch, its mean ``p_mean - n / B`` gives the
label counts ``n = B (p_mean - g)``; ``p_mean`` is estimated from the model's mean prediction on
public prior draws. SGD local steps scale the gradient by a known factor (``sgd_scale``); Adam
keeps only signs, so there the present classes (negative entries) get one label each and the rest
go by magnitude.
"""

from __future__ import annotations

import numpy as np
import torch

from flowerbed.attacks.inversion.simulate import distance, observed
from flowerbed.attacks.inversion.types import Knowledge, ModelLossReplay

PRIOR_DRAWS = 256


def sgd_scale(know: Knowledge[ModelLossReplay]) -> float:
    """How many mean-gradient units the SGD update ``(sent - reply) / lr`` holds (first order):
    each step adds its momentum buffer, sum_k (1 - m^k) / (1 - m)."""
    training = know.replay.contract.training
    steps = len(training.plan(max(know.batch // max(know.members, 1), 1)))
    m = 0.0 if training.protocol == "fedsgd" else training.momentum
    return float(sum((1 - m**k) / (1 - m) if m else 1.0 for k in range(1, steps + 1)))


def _mean_prediction(know: Knowledge[ModelLossReplay], generator: torch.Generator) -> torch.Tensor:
    contract = know.replay.contract
    x = contract.draw(PRIOR_DRAWS, generator).to(know.dtype)
    with torch.no_grad():
        return torch.softmax(contract.logits(know.params, x), 1).mean(0)


def label_counts(know: Knowledge[ModelLossReplay], seed: int = 0) -> np.ndarray:
    """The recovered number of examples per class (sums to the batch size)."""
    contract, batch = know.replay.contract, know.batch
    name = contract.last_bias
    if name is None or name not in know.update:
        raise ValueError("label recovery needs the output layer's bias update")
    g = know.update[name].double()
    classes = len(g)
    if batch == 1:
        counts = np.zeros(classes, int)
        counts[int(g.argmin())] = 1
        return counts
    if contract.training.keeps_gradient_ratios:
        p_mean = _mean_prediction(know, torch.Generator().manual_seed(seed)).double()
        est = (batch * (p_mean - g / sgd_scale(know))).clamp_min(0).numpy()
        present = (g < 0).numpy()
    else:  # Adam: signs
        est = (-g).clamp_min(0).numpy()
        present = est > 0
    counts = present.astype(int)
    if counts.sum() > batch:  # keep the most negative
        keep = np.argsort(-est)[:batch]
        counts = np.zeros(classes, int)
        counts[keep] = 1
    left = batch - counts.sum()
    if left > 0:  # largest remainder on what the estimate still asks for
        want = np.clip(est - counts, 0, None)
        want = want / want.sum() * left if want.sum() > 0 else np.full(classes, left / classes)
        base = np.floor(want).astype(int)
        counts += base
        for c in np.argsort(-(want - base))[: left - base.sum()]:
            counts[c] += 1
    return counts


def recover_labels(know: Knowledge[ModelLossReplay], seed: int = 0) -> torch.Tensor:
    """iDLG labels of the batch (sorted by class; order is irrelevant to the update)."""
    counts = label_counts(know, seed)
    return torch.from_numpy(np.repeat(np.arange(len(counts)), counts)).long()


def assign_labels(know: Knowledge[ModelLossReplay], x: torch.Tensor, y: torch.Tensor, objective: str = "cosine",
                  sweeps: int = 2) -> torch.Tensor:  # fmt: skip
    """Give each recovered input its label: local search over label swaps between two inputs
    (keeps the recovered counts) and single relabels, keeping the assignment whose simulated
    update matches the observed one best (start: ``y``)."""
    y = y.clone()
    classes = know.replay.contract.schema.num_classes

    def cost(labels: torch.Tensor) -> float:
        sim = observed(know, x, labels, create_graph=False)
        return float(distance(sim, know.update, objective).detach())

    def moves(labels: torch.Tensor):  # noqa: ANN202 - generator of candidate assignments
        for a in range(len(labels)):
            for b in range(a + 1, len(labels)):
                if labels[a] != labels[b]:
                    trial = labels.clone()
                    trial[a], trial[b] = labels[b], labels[a]
                    yield trial
        for a in range(len(labels)):
            for c in range(classes):
                if c != int(labels[a]):
                    trial = labels.clone()
                    trial[a] = c
                    yield trial

    best = cost(y)
    for _ in range(sweeps):
        changed = False
        for trial in moves(y):
            value = cost(trial)
            if value < best - 1e-12:
                best, y, changed = value, trial, True
        if not changed:
            break
    return y
