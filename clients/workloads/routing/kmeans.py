"""The K-means router: Lloyd steps as sufficient statistics (what a client sends), k-means++
starts, per-(cluster, model) quality / cost tables with shrinkage and neighbour smoothing,
(soft) assignment when routing, and the centralised / personalised routers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowerbed.clients.core.params import param
from flowerbed.clients.workloads.routing.data import RouterData


@dataclass
class KMeansConfig:
    clusters: int = param(20, ge=1)
    init_iters: int = param(10, ge=1)
    shrinkage: float = param(5.0, ge=0)  # pseudo-evaluations of the model's pooled mean
    bandwidth: float = param(0.1, ge=0)  # neighbour smoothing of the tables (0: off)
    neighbour_strength: float = param(20.0, ge=0)  # pseudo-evaluations of the neighbour prior
    temperature: float = param(0.05, ge=0)  # soft assignment when routing (0: nearest centroid)
    personal_strength: float = param(10.0, ge=0)  # personalised router: pseudo-evals of global


def assign(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Nearest centroid (squared Euclidean) per row."""
    d2 = (x**2).sum(1)[:, None] - 2 * x @ centroids.T + (centroids**2).sum(1)[None, :]
    return d2.argmin(1)


def lloyd_stats(x: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-centroid sums [K, d] and counts [K] of the points assigned to each centroid."""
    x = np.asarray(x, dtype=np.float64)
    labels = assign(x, centroids)
    sums = np.zeros_like(centroids, dtype=np.float64)
    np.add.at(sums, labels, x)
    counts = np.bincount(labels, minlength=len(centroids)).astype(np.float64)
    return sums, counts


def lloyd_update(centroids: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """New centroids = sums / counts; a centroid with no points stays where it is."""
    out = np.array(centroids, dtype=np.float64, copy=True)
    hit = counts > 0
    out[hit] = sums[hit] / counts[hit, None]
    return out


def lloyd(x: np.ndarray, centroids: np.ndarray, iters: int) -> np.ndarray:
    """Centralised Lloyd iterations from a given start."""
    c = np.asarray(centroids, dtype=np.float64)
    for _ in range(iters):
        c = lloyd_update(c, *lloyd_stats(x, c))
    return c


def kmeanspp(
    x: np.ndarray, k: int, rng: np.random.Generator, weights: np.ndarray | None = None
) -> np.ndarray:
    """(Weighted) k-means++ seeding; duplicates allowed when there are fewer points than k."""
    x = np.asarray(x, dtype=np.float64)
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64)
    centers = [x[rng.choice(len(x), p=w / w.sum())]]
    d2 = ((x - centers[0]) ** 2).sum(1)
    for _ in range(1, k):
        p = w * d2
        i = rng.choice(len(x), p=p / p.sum()) if p.sum() > 0 else rng.choice(len(x))
        centers.append(x[i])
        d2 = np.minimum(d2, ((x - x[i]) ** 2).sum(1))
    return np.stack(centers)


def weighted_lloyd(x: np.ndarray, w: np.ndarray, centroids: np.ndarray, iters: int) -> np.ndarray:
    """Lloyd on weighted points (the server's pass over the union of client centroids)."""
    c = np.asarray(centroids, dtype=np.float64)
    for _ in range(iters):
        labels = assign(x, c)
        sums = np.zeros_like(c)
        np.add.at(sums, labels, x * w[:, None])
        c = lloyd_update(c, sums, np.bincount(labels, weights=w, minlength=len(c)))
    return c


def cluster_stats(
    data: RouterData, centroids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (cluster, model): correctness sum, evaluation count, cost sum (observed cells only)."""
    labels = assign(np.asarray(data.emb, dtype=np.float64), centroids)
    onehot = np.eye(len(centroids))[labels]  # [n, K]
    mask = data.mask.astype(np.float64)
    return onehot.T @ (data.y * mask), onehot.T @ mask, onehot.T @ (data.cost * mask)


def shrink_tables(
    acc_sum: np.ndarray,
    evals: np.ndarray,
    cost_sum: np.ndarray,
    strength: float,
    centroids: np.ndarray | None = None,
    bandwidth: float = 0.0,
    neighbour_strength: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Quality/cost tables [K, M] from summed statistics.

    Each cell's mean is shrunk towards a prior with pseudo-evaluations. Without neighbours the
    prior is the model's pooled mean (``strength``). With ``bandwidth`` > 0 it is the Gaussian-
    kernel average over neighbouring clusters (weights exp(-|c_j - c_j'|^2 / bandwidth), itself
    shrunk to the model's mean with ``strength``) and the cell gets ``neighbour_strength``
    pseudo-evaluations of it: clusters that split one topic share their evidence. A model nobody
    evaluated gets the mean over models."""
    per_model = evals.sum(0)
    seen = per_model > 0
    acc_m = np.where(seen, acc_sum.sum(0) / np.maximum(per_model, 1), 0.0)
    cost_m = np.where(seen, cost_sum.sum(0) / np.maximum(per_model, 1), 0.0)
    if seen.any():
        acc_m[~seen], cost_m[~seen] = acc_m[seen].mean(), cost_m[seen].mean()
    if centroids is None or bandwidth <= 0:
        acc = (acc_sum + strength * acc_m) / (evals + strength)
        cost = (cost_sum + strength * cost_m) / (evals + strength)
        return acc, cost
    c = np.asarray(centroids, dtype=np.float64)
    kernel = np.exp(-((c[:, None, :] - c[None, :, :]) ** 2).sum(-1) / bandwidth)
    prior_acc, prior_cost = shrink_tables(
        kernel @ acc_sum, kernel @ evals, kernel @ cost_sum, strength
    )
    acc = (acc_sum + neighbour_strength * prior_acc) / (evals + neighbour_strength)
    cost = (cost_sum + neighbour_strength * prior_cost) / (evals + neighbour_strength)
    return acc, cost


def soft_assign(emb: np.ndarray, centroids: np.ndarray, temperature: float) -> np.ndarray:
    """Cluster weights [n, K]: softmax(-squared distance / temperature); 0 = nearest centroid."""
    x = np.asarray(emb, dtype=np.float64)
    if temperature <= 0:
        return np.eye(len(centroids))[assign(x, centroids)]
    d2 = (x**2).sum(1)[:, None] - 2 * x @ centroids.T + (centroids**2).sum(1)[None, :]
    w = np.exp(-(d2 - d2.min(1, keepdims=True)) / temperature)
    return w / w.sum(1, keepdims=True)


def kmeans_predict(
    centroids: np.ndarray,
    acc: np.ndarray,
    cost: np.ndarray,
    emb: np.ndarray,
    temperature: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Predicted quality and cost per (query, model): the tables of the query's cluster, or
    their soft-assignment mixture (``temperature`` > 0)."""
    w = soft_assign(emb, centroids, temperature)
    return w @ acc, w @ cost


def personal_tables(
    data: RouterData,
    centroids: np.ndarray,
    acc: np.ndarray,
    cost: np.ndarray,
    strength: float,
) -> tuple[np.ndarray, np.ndarray]:
    """A client's personalised tables: its own (cluster, model) statistics shrunk towards the
    global tables with ``strength`` pseudo-evaluations, so a cell moves towards the client's data
    in proportion to its own evidence and models it never evaluated keep the global values."""
    acc_sum, evals, cost_sum = cluster_stats(data, centroids)
    return (
        (acc_sum + strength * acc) / (evals + strength),
        (cost_sum + strength * cost) / (evals + strength),
    )


def local_kmeans_init(data: RouterData, k: int, iters: int, seed: int) -> tuple[np.ndarray, ...]:
    """A client's init message: its own k-means++ + Lloyd centroids and cluster sizes."""
    x = np.asarray(data.emb, dtype=np.float64)
    c = lloyd(x, kmeanspp(x, k, np.random.default_rng(seed)), iters)
    return c, lloyd_stats(x, c)[1]


def server_kmeans_init(
    centroids: list[np.ndarray], sizes: list[np.ndarray], k: int, iters: int, seed: int
) -> np.ndarray:
    """Global start: weighted k-means++ and Lloyd over the union of client centroids."""
    x, w = np.concatenate(centroids), np.concatenate(sizes)
    keep = w > 0
    x, w = x[keep], w[keep]
    return weighted_lloyd(x, w, kmeanspp(x, k, np.random.default_rng(seed), w), iters)


@dataclass
class KMeansRouter:
    """Centroids and (cluster, model) quality/cost tables; routes by (soft) assignment."""

    centroids: np.ndarray
    acc: np.ndarray
    cost: np.ndarray
    temperature: float = 0.0

    def predict(self, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return kmeans_predict(self.centroids, self.acc, self.cost, emb, self.temperature)

    def personalised(self, data: RouterData, strength: float) -> KMeansRouter:
        acc, cost = personal_tables(data, self.centroids, self.acc, self.cost, strength)
        return KMeansRouter(self.centroids, acc, cost, self.temperature)


def kmeans_tables(
    stats: tuple[np.ndarray, np.ndarray, np.ndarray], centroids: np.ndarray, cfg: KMeansConfig
) -> tuple[np.ndarray, np.ndarray]:
    """The router's tables from summed (correctness, evaluations, cost) statistics."""
    return shrink_tables(*stats, cfg.shrinkage, centroids, cfg.bandwidth, cfg.neighbour_strength)


def fit_kmeans_router(data: RouterData, cfg: KMeansConfig, iters: int, seed: int) -> KMeansRouter:
    """K-means router on ``data`` alone: k-means++ + Lloyd, then shrunk (cluster, model) tables."""
    x = np.asarray(data.emb, dtype=np.float64)
    c = lloyd(x, kmeanspp(x, min(cfg.clusters, len(x)), np.random.default_rng(seed)), iters)
    acc, cost = kmeans_tables(cluster_stats(data, c), c, cfg)
    return KMeansRouter(c, acc, cost, cfg.temperature)
