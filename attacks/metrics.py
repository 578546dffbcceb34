"""Scoring of tabular reconstructions exactly as TabLeak, plus latent and confidence metrics.

Categorical cell correct on exact match; numeric cell correct when within 0.319 x the column's
std (original units); rows matched by the Hungarian algorithm on per-row mean cell error. Ground truth enters only
through ``attacks.goliath.scoring.TruthScorer``, which rebuilds a client's batch through the
server's workload from (seed, partition id, round) — the attacks never see it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import linear_sum_assignment

TOLERANCE = 0.319


def cell_error_matrix(
    true: pd.DataFrame, rec: pd.DataFrame, numeric: list[str], categorical: list[str],
    tol: dict[str, float],
) -> np.ndarray:  # fmt: skip
    """E[a, b, j]: 0/1 error of cell j when true row a is matched with reconstructed row b."""
    errs = []
    for c in numeric:
        x, y = true[c].to_numpy(float)[:, None], rec[c].to_numpy(float)[None, :]
        errs.append((np.abs(x - y) > tol[c]).astype(float))
    for c in categorical:
        x, y = true[c].astype(str).to_numpy()[:, None], rec[c].astype(str).to_numpy()[None, :]
        errs.append((x != y).astype(float))
    return np.stack(errs, 2)


def tableak_accuracy(
    true: pd.DataFrame, rec: pd.DataFrame, numeric: list[str], categorical: list[str],
    stds: dict[str, float], tol: float = TOLERANCE,
) -> dict[str, Any]:  # fmt: skip
    """TabLeak per-cell accuracy (in [0, 1]) after Hungarian row matching; also the matching."""
    tols = {c: tol * stds[c] for c in numeric}
    errors = cell_error_matrix(true.reset_index(drop=True), rec.reset_index(drop=True),
                               numeric, categorical, tols)  # fmt: skip
    rows, cols = linear_sum_assignment(errors.mean(2))
    matched = errors[rows, cols]  # (B, n_cols)
    n = len(numeric)
    out: dict[str, Any] = {
        "accuracy": 1 - matched.mean(),
        "num_accuracy": 1 - matched[:, :n].mean() if n else float("nan"),
        "cat_accuracy": 1 - matched[:, n:].mean() if categorical else float("nan"),
        "per_column": {c: 1 - matched[:, j].mean() for j, c in enumerate(numeric + categorical)},
        "exact_rows": float((matched.sum(1) == 0).mean()),
        "perm": cols,
    }
    return out


def timestep_mae(t_true: np.ndarray, t_rec: np.ndarray, perm: np.ndarray) -> float:
    """|t - t_hat| averaged over rows matched by the accuracy's Hungarian permutation."""
    return float(np.abs(np.asarray(t_true) - np.asarray(t_rec)[perm]).mean())


def mask_f1(m_true: np.ndarray, m_rec: np.ndarray, perm: np.ndarray) -> float:
    """F1 of the recovered [MASK] pattern (1 if both are empty)."""
    a, b = np.asarray(m_true) > 0.5, np.asarray(m_rec)[perm] > 0.5
    tp, fp, fn = (a & b).sum(), (~a & b).sum(), (a & ~b).sum()
    return 1.0 if tp + fp + fn == 0 else float(2 * tp / (2 * tp + fp + fn))


def cell_entropy(num_runs: np.ndarray, cat_probs_runs: list[np.ndarray]) -> np.ndarray:
    """Per-cell uncertainty across aligned restarts (TabLeak): categorical entropy of the pooled
    probabilities / log K; numeric Gaussian differential entropy 0.5 + 0.5 log(2 pi var)."""
    cols = []
    if num_runs.size:
        var = num_runs.var(0) + 1e-12
        cols.append(0.5 + 0.5 * np.log(2 * np.pi * var))
    for probs in cat_probs_runs:  # (R, B, K)
        p = probs.mean(0).clip(1e-12, 1)
        cols.append(-(p * np.log(p)).sum(-1)[:, None] / np.log(max(p.shape[-1], 2)))
    return np.concatenate(cols, 1) if cols else np.zeros((0, 0))
