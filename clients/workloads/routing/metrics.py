"""Routing metrics: the rule argmax_m q_m - lambda c_m swept over lambda, the non-decreasing
convex hull (NDCH) of the accuracy-cost curve, its AUC over a common cost range normalised
between the best single-model hull and the oracle, APGR and suboptimality."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowerbed.clients.workloads.routing.data import RouterData


def lambda_grid(cost_true: np.ndarray, size: int = 41) -> np.ndarray:
    """0 plus log-spaced lambdas in units of 1 / (median model cost), up to cheapest-everywhere."""
    scale = float(np.median(cost_true.mean(0)))
    return np.concatenate([[0.0], np.geomspace(1e-3, 1e3, size - 1) / scale])


def route(
    quality: np.ndarray, cost: np.ndarray, lambdas: np.ndarray, allowed: np.ndarray | None = None
) -> np.ndarray:
    """argmax_m quality - lambda x cost per (lambda, query); ``allowed`` [M] restricts models."""
    utility = quality[None] - lambdas[:, None, None] * cost[None]
    if allowed is not None:
        utility[..., ~np.asarray(allowed, dtype=bool)] = -np.inf
    return utility.argmax(-1)


def curve(choice: np.ndarray, data: RouterData) -> tuple[np.ndarray, np.ndarray]:
    """Expected (mean cost, mean accuracy) of each routing decision row [L, n]."""
    rows = np.arange(choice.shape[1])[None, :]
    return data.cost_true[rows, choice].mean(1), data.p_true[rows, choice].mean(1)


def ndch(costs: np.ndarray, accs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-decreasing convex hull of (cost, accuracy) points plus the origin (abstaining):
    every point on it is attainable by randomly mixing two routers."""
    pts = sorted(set(zip(np.r_[0.0, costs].tolist(), np.r_[0.0, accs].tolist(), strict=True)))
    hull: list[tuple[float, float]] = []
    for p in pts:  # upper hull, monotone chain
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    xs, ys = np.array(hull).T
    top = int(np.argmax(ys))  # beyond the best accuracy the hull stays flat
    return xs[: top + 1], ys[: top + 1]


def hull_auc(costs: np.ndarray, accs: np.ndarray, c_lo: float, c_hi: float) -> float:
    """Mean of the NDCH over the common cost range [c_lo, c_hi] (exact for a piecewise line)."""
    hx, hy = ndch(costs, accs)
    grid = np.unique(np.r_[c_lo, c_hi, hx[(hx > c_lo) & (hx < c_hi)]])
    values = np.interp(grid, hx, hy)
    return float(np.sum((values[1:] + values[:-1]) / 2 * np.diff(grid)) / (c_hi - c_lo))


@dataclass
class RoutingScore:
    auc: float
    auc_norm: float
    max_acc: float
    subopt: float
    oracle_auc: float
    single_auc: float
    apgr: float
    weak_acc: float
    strong_acc: float
    costs: np.ndarray
    accs: np.ndarray


def score_router(
    quality: np.ndarray,
    cost: np.ndarray,
    data: RouterData,
    allowed: np.ndarray | None = None,
    size: int = 41,
) -> RoutingScore:
    """AUC of the router's accuracy-cost hull on ``data``, normalised so that 0 is the best
    mix of single models and 1 the oracle (argmax of the true utility); suboptimality is
    E_x[max_m U*_m - U*_{r(x)}] averaged over the lambda grid, with U* = p_true - lambda cost_true
    (costs in units of the median model cost).

    APGR (RouteLLM's average performance gap recovered, for many models): (AUC - accuracy of the
    cheapest model) / (accuracy of the most accurate model - accuracy of the cheapest model);
    0 = always the cheapest model, 1 = the best model's accuracy at every budget."""
    lambdas = lambda_grid(data.cost_true, size)
    choice = route(quality, cost, lambdas, allowed)
    costs, accs = curve(choice, data)
    model_cost, model_acc = data.cost_true.mean(0), data.p_true.mean(0)
    c_lo, c_hi = float(model_cost.min()), float(model_cost.max())
    oracle = route(data.p_true, data.cost_true, lambdas)
    o_costs, o_accs = curve(oracle, data)
    auc = hull_auc(costs, accs, c_lo, c_hi)
    single = hull_auc(model_cost, model_acc, c_lo, c_hi)
    best = hull_auc(o_costs, o_accs, c_lo, c_hi)
    rows = np.arange(len(data))[None, :]
    scale = float(np.median(model_cost))
    utility = data.p_true[None] - lambdas[:, None, None] * data.cost_true[None]
    regret = utility.max(-1) - utility[np.arange(len(lambdas))[:, None], rows, choice]
    weak, strong = float(model_acc[np.argmin(model_cost)]), float(model_acc.max())
    return RoutingScore(
        auc=auc,
        auc_norm=(auc - single) / max(best - single, 1e-12),
        max_acc=float(accs.max()),
        subopt=float((regret / np.maximum(lambdas[:, None] * scale, 1.0)).mean()),
        oracle_auc=best,
        single_auc=single,
        apgr=(auc - weak) / max(strong - weak, 1e-12),
        weak_acc=weak,
        strong_acc=strong,
        costs=costs,
        accs=accs,
    )


def score_metrics(score: RoutingScore, num_examples: int) -> dict[str, float]:
    return {
        "num-examples": num_examples,
        "auc": score.auc,
        "auc_norm": score.auc_norm,
        "max_acc": score.max_acc,
        "subopt": score.subopt,
        "oracle_auc": score.oracle_auc,
        "single_auc": score.single_auc,
        "apgr": score.apgr,
    }
