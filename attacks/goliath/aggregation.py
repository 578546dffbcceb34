"""Pooling reconstructions of the same rows: Hungarian row alignment and a per-cell vote."""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from flowerbed.attacks.inversion.types import DiffusionReplay, Reconstruction
from flowerbed.attacks.metrics import cell_entropy
from flowerbed.clients.tabdiff.model import Rows


def soft_cost(
    a_num: np.ndarray, a_cat: list[np.ndarray], b_num: np.ndarray, b_cat: list[np.ndarray]
) -> np.ndarray:
    """Row-alignment cost in model space: categorical mismatch + clipped numeric distance."""
    cost = np.zeros((len(a_num), len(b_num)))
    for j in range(a_num.shape[1]):
        cost += np.minimum(1, np.abs(a_num[:, j, None] - b_num[None, :, j]) / 0.319)
    for x, y in zip(a_cat, b_cat, strict=True):
        cost += x.argmax(1)[:, None] != y.argmax(1)[None, :]
    return cost / max(a_num.shape[1] + len(a_cat), 1)


def align_and_vote(nums: list[np.ndarray], cats: list[np.ndarray], scores: list[float],
                   cat_sizes: tuple[int, ...], mode: str = "vote") -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Align reconstructions of the same rows to the best one (Hungarian) and pool per cell:
    ``vote`` = categorical majority + numeric median (multi-round Goliath); ``median`` = TabLeak's
    median+softmax (numeric median, mean of probabilities). Returns (num, cat probs, entropy)."""
    ref = int(np.argmin(scores))
    split = lambda c: np.split(c, np.cumsum(cat_sizes)[:-1], axis=1)  # noqa: E731
    ref_num, ref_cat = nums[ref], split(cats[ref])
    aligned_n: list[np.ndarray] = []
    aligned_c: list[np.ndarray] = []
    for _ in range(2):  # re-align to the consensus
        aligned_n, aligned_c = [], []
        for n_, c_ in zip(nums, cats, strict=True):
            _, perm = linear_sum_assignment(soft_cost(ref_num, ref_cat, n_, split(c_)))
            aligned_n.append(n_[perm])
            aligned_c.append(c_[perm])
        ref_num = np.median(np.stack(aligned_n), 0)
        ref_cat = split(np.mean(np.stack(aligned_c), 0))
    num = np.median(np.stack(aligned_n), 0)
    blocks = []
    for j, k in enumerate(cat_sizes):
        runs = np.stack([split(c)[j] for c in aligned_c])  # (R, B, K)
        if mode == "vote":
            votes = np.eye(k)[runs.argmax(-1)].sum(0)
            blocks.append(votes / votes.sum(-1, keepdims=True))
        else:
            blocks.append(runs.mean(0))
    ent = cell_entropy(
        np.stack(aligned_n),
        [np.stack([split(c)[j] for c in aligned_c]) for j in range(len(cat_sizes))],
    )
    return num, np.concatenate(blocks, 1) if blocks else np.zeros((len(num), 0)), ent


def aggregate_rounds(replay: DiffusionReplay, recs: list[Reconstruction]) -> Reconstruction:
    """Multi-round Goliath: align reconstructions of the same client's rows and vote per cell."""
    num, cat, ent = align_and_vote([r.num.numpy() for r in recs], [r.cat.numpy() for r in recs],
                                   [r.score for r in recs], replay.spec.cat_sizes, "vote")  # fmt: skip
    best = recs[int(np.argmin([r.score for r in recs]))]
    rows = Rows(torch.from_numpy(num), torch.from_numpy(cat))
    return Reconstruction(rows, best.score, decoded=replay.decode(rows.num, rows.cat), entropy=ent)
