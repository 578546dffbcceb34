"""Federated LLM routing ("Federate the Router"): learn which LLM to call for a query from
decentralised, sparse query x model evaluation data.

Reads top to bottom:

1. data: a synthetic query-model evaluation benchmark (topic clusters with a difficulty
   component, models with capability tiers, per-topic skill and log-spread prices, clients with
   Dirichlet topic mixtures and partial model coverage; true probabilities kept for exact regret),
   and a loader for real evaluation tables (``prompt``, ``<model>``, ``<model>|total_cost``);
2. routers: an MLP with a shared trunk and per-model accuracy / log-cost heads (masked loss), and a
   K-means router (Lloyd steps as sufficient statistics, per-(cluster, model) tables with shrinkage);
3. local steps and the centralised / client-local baselines as plain functions;
4. metrics: the routing rule argmax_m q_m - lambda c_m swept over lambda, the non-decreasing convex
   hull of the accuracy-cost curve, its AUC over a common cost range, normalised between the best
   single-model hull and the oracle, and routing suboptimality from the true probabilities;
5. registration: ``routing-mlp`` and ``routing-kmeans`` (server side: ``strategies/routing.py``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from torch import nn

from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.params import param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.workloads import WORKLOADS, Workload

# ================================================================================================
# 1. Data
# ================================================================================================


@dataclass
class RouterData:
    """Queries with their evaluations: ``y``/``cost`` are observed where ``mask`` is True.

    ``p_true``/``cost_true`` are the expected correctness and cost (synthetic data); for real
    tables they equal the observed outcomes.
    """

    emb: np.ndarray  # [n, d] float32, unit norm
    y: np.ndarray  # [n, M] float32 in {0, 1} (0 where unobserved)
    cost: np.ndarray  # [n, M] float32 (0 where unobserved)
    mask: np.ndarray  # [n, M] bool, evaluated
    p_true: np.ndarray  # [n, M]
    cost_true: np.ndarray  # [n, M]
    topic: np.ndarray  # [n] int

    def __len__(self) -> int:
        return len(self.emb)


@dataclass
class Benchmark:
    """Per-client train/test sets, a global test set and each client's model coverage."""

    train: list[RouterData]
    test: list[RouterData]
    global_test: RouterData
    coverage: np.ndarray  # [N, M] bool
    model_names: list[str]
    mixtures: np.ndarray  # [N, T] topic mixture per client

    @property
    def num_models(self) -> int:
        return len(self.model_names)


@dataclass
class BenchmarkParams:
    """Knobs of the data: synthetic generator, or a real table when ``table_path`` is set."""

    dim: int = param(32, ge=1)
    topics: int = param(10, ge=1)
    models: int = param(11, ge=1)
    specialists: int = param(2, ge=0)
    n_train: int = param(200, ge=1)
    n_test: int = param(200, ge=1)
    n_global_test: int = param(2000, ge=1)
    coverage: float = param(0.3, gt=0, le=1)
    coverage_bias: float = param(0.5, ge=0, le=1)
    exclude_models: list[int] = field(default_factory=list)
    table_path: str | None = None
    encoder: str = "tfidf"
    cost_unit: float = param(1000.0, gt=0)
    lambdas: int = param(41, ge=2)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@dataclass
class SyntheticWorld:
    """The hidden generative model of the synthetic benchmark (topics, models, prices)."""

    centers: np.ndarray  # [T, d]
    hard_dirs: np.ndarray  # [T, d] direction of the observable difficulty
    prompt_len: np.ndarray  # [T] log-length offset of prompts per topic
    skill: np.ndarray  # [M, T]
    price_in: np.ndarray  # [M] $ per token
    price_out: np.ndarray  # [M]
    verbosity: np.ndarray  # [M] mean log output length
    names: list[str]
    spread: float = 0.35
    gamma: float = 0.6
    sharpness: float = 2.0

    @staticmethod
    def create(rng: np.random.Generator, dim: int, topics: int, models: int, specialists: int):
        centers = 3.0 * _unit(rng.normal(size=(topics, dim)))
        hard_dirs = _unit(rng.normal(size=(topics, dim)))
        tier = np.linspace(0.0, 1.0, models)
        log_span = np.log(30.0 / 0.2)
        price = 0.2e-6 * np.exp(np.clip(tier + 0.15 * rng.normal(size=models), 0, 1) * log_span)
        skill = -0.6 + 2.2 * tier[:, None] + 0.5 * rng.normal(size=(models, topics))
        names = [f"model-{m:02d}" for m in range(models)]
        # cheap specialists (a "code-llama" analogue): low tier, strong on one or two topics
        for s in range(min(specialists, models - 1)):
            m = 1 + s
            for t in rng.choice(topics, size=min(2, topics), replace=False):
                skill[m, t] += 2.0
            names[m] = f"specialist-{s}"
        return SyntheticWorld(
            centers=centers,
            hard_dirs=hard_dirs,
            prompt_len=0.5 * rng.normal(size=topics),
            skill=skill,
            price_in=price,
            price_out=2.0 * price,
            verbosity=5.0 + 0.5 * rng.normal(size=models),
            names=names,
        )

    def queries(self, topic: np.ndarray, rng: np.random.Generator, cost_unit: float) -> RouterData:
        """Embeddings, true probabilities and one sampled evaluation of every model per query."""
        n, dim = len(topic), self.centers.shape[1]
        xi = rng.normal(size=(n, dim))
        emb = _unit(self.centers[topic] + self.spread * xi)
        observable = np.einsum("nd,nd->n", xi, self.hard_dirs[topic])
        difficulty = self.gamma * observable + np.sqrt(1 - self.gamma**2) * rng.normal(size=n)
        p_true = _sigmoid(self.sharpness * (self.skill[:, topic].T - difficulty[:, None]))
        y = (rng.random(p_true.shape) < p_true).astype(np.float32)
        len_in = np.exp(5.0 + self.prompt_len[topic] + 0.3 * rng.normal(size=n))
        log_out = self.verbosity[None, :] + 0.4 * rng.normal(size=(n, len(self.names)))
        cost = self.price_in * len_in[:, None] + self.price_out * np.exp(log_out)
        cost_true = self.price_in * len_in[:, None] + self.price_out * np.exp(self.verbosity + 0.08)
        return RouterData(
            emb=emb.astype(np.float32),
            y=y,
            cost=(cost * cost_unit).astype(np.float32),
            mask=np.ones(p_true.shape, dtype=bool),
            p_true=p_true,
            cost_true=cost_true * cost_unit,
            topic=topic.astype(np.int64),
        )


def sample_coverage(
    rng: np.random.Generator,
    num_clients: int,
    prices: np.ndarray,
    coverage: float,
    bias: float,
    exclude: list[int] | tuple[int, ...] = (),
) -> np.ndarray:
    """Each client evaluates ``max(1, round(coverage * M))`` models, cheap ones more likely
    (P ~ price^-bias); then every uncovered model (but the excluded) is swapped in for a model
    another client also covers, so that each model is evaluated by someone when possible."""
    num_models = len(prices)
    allowed = np.setdiff1d(np.arange(num_models), np.asarray(exclude, dtype=int))
    size = int(min(max(1, round(coverage * num_models)), len(allowed)))
    weights = prices[allowed] ** (-bias)
    cov = np.zeros((num_clients, num_models), dtype=bool)
    for k in range(num_clients):
        cov[k, rng.choice(allowed, size=size, replace=False, p=weights / weights.sum())] = True
    for m in rng.permutation(allowed):
        if cov[:, m].any():
            continue
        spare = [(k, j) for k in range(num_clients) for j in np.flatnonzero(cov[k])]
        spare = [(k, j) for k, j in spare if cov[:, j].sum() > 1]
        if not spare:
            break  # fewer slots than models: nothing more can be covered
        k, j = spare[rng.integers(len(spare))]
        cov[k, j], cov[k, m] = False, True
    return cov


def _observe(data: RouterData, models: np.ndarray) -> RouterData:
    """Keep only the evaluations of ``models`` (bool [M]) as observed training labels."""
    mask = np.broadcast_to(models, data.mask.shape).copy()
    return RouterData(
        emb=data.emb,
        y=np.where(mask, data.y, 0).astype(np.float32),
        cost=np.where(mask, data.cost, 0).astype(np.float32),
        mask=mask,
        p_true=data.p_true,
        cost_true=data.cost_true,
        topic=data.topic,
    )


def _client_topics(
    rng: np.random.Generator, num_clients: int, topics: int, alpha: float
) -> np.ndarray:
    return rng.dirichlet(np.full(topics, alpha), size=num_clients)


def make_synthetic_benchmark(params: BenchmarkParams, num_clients: int, alpha: float, seed: int):
    """The synthetic benchmark; a pure function of (params, clients, alpha, seed)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 8008]))
    world = SyntheticWorld.create(rng, params.dim, params.topics, params.models, params.specialists)
    mixtures = _client_topics(rng, num_clients, params.topics, alpha)
    prices = world.price_in + world.price_out
    cov = sample_coverage(
        rng, num_clients, prices, params.coverage, params.coverage_bias, params.exclude_models
    )
    train, test = [], []
    for k in range(num_clients):
        for n, out in ((params.n_train, train), (params.n_test, test)):
            topic = rng.choice(params.topics, size=n, p=mixtures[k])
            out.append(world.queries(topic, rng, params.cost_unit))
        train[k] = _observe(train[k], cov[k])
    global_topic = rng.choice(params.topics, size=params.n_global_test)
    global_test = world.queries(global_topic, rng, params.cost_unit)
    return Benchmark(train, test, global_test, cov, world.names, mixtures)


# -- real evaluation tables ----------------------------------------------------------------------


def embed_texts(texts: list[str], encoder: str = "tfidf", dim: int = 32, seed: int = 0):
    """Unit-norm text embeddings: TF-IDF + truncated SVD by default, or any installed
    ``sentence-transformers`` model (a name or local path) for ``encoder``."""
    if encoder == "tfidf":
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        tfidf = TfidfVectorizer(sublinear_tf=True).fit_transform(texts)
        k = max(1, min(dim, tfidf.shape[1] - 1, len(texts) - 1))
        emb = TruncatedSVD(k, random_state=seed).fit_transform(tfidf)
    else:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ConfigError(
                f"encoder '{encoder}' needs sentence-transformers (or use encoder=tfidf)"
            ) from None
        emb = SentenceTransformer(encoder).encode(texts, convert_to_numpy=True)
    return _unit(np.asarray(emb, dtype=np.float64)).astype(np.float32)


def load_eval_table(
    source: str | Path | pd.DataFrame,
    encoder: str = "tfidf",
    dim: int = 32,
    cost_unit: float = 1000.0,
    seed: int = 0,
) -> tuple[RouterData, list[str]]:
    """A RouterBench-style wide table: ``prompt``, per model ``<model>`` (correctness in [0, 1])
    and ``<model>|total_cost``; optional ``eval_name`` becomes the topic. Missing cells are
    unobserved. Returns all rows as one RouterData (outcomes double as "true" values)."""
    if isinstance(source, pd.DataFrame):
        frame = source
    else:
        path = Path(source)
        reader = {".pkl": pd.read_pickle, ".parquet": pd.read_parquet}.get(path.suffix, pd.read_csv)
        frame = reader(path)
    if "prompt" not in frame.columns:
        raise ConfigError("evaluation table needs a 'prompt' column")
    models = [c for c in frame.columns if "|" not in c and f"{c}|total_cost" in frame.columns]
    if not models:
        raise ConfigError("evaluation table has no '<model>' + '<model>|total_cost' column pairs")
    y = frame[models].to_numpy(np.float64)
    cost = frame[[f"{m}|total_cost" for m in models]].to_numpy(np.float64) * cost_unit
    mask = ~(np.isnan(y) | np.isnan(cost))
    emb = embed_texts(frame["prompt"].astype(str).tolist(), encoder, dim, seed)
    if "eval_name" in frame.columns:
        topic = pd.factorize(frame["eval_name"])[0]
    else:
        from sklearn.cluster import KMeans

        topic = KMeans(min(10, len(frame)), n_init=1, random_state=seed).fit_predict(emb)
    y, cost = np.nan_to_num(y), np.nan_to_num(cost)
    data = RouterData(
        emb=emb,
        y=y.astype(np.float32),
        cost=cost.astype(np.float32),
        mask=mask,
        p_true=y,
        cost_true=cost,
        topic=np.asarray(topic, dtype=np.int64),
    )
    return data, models


def _subset(data: RouterData, idx: np.ndarray) -> RouterData:
    return RouterData(*(getattr(data, f)[idx] for f in RouterData.__dataclass_fields__))


def make_table_benchmark(params: BenchmarkParams, num_clients: int, alpha: float, seed: int):
    """Split a real table into a global test set and Dirichlet(topic) clients with coverage.

    Rows with a missing evaluation are kept for training only (tests need every model)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 8009]))
    data, models = load_eval_table(
        params.table_path, params.encoder, params.dim, params.cost_unit, seed
    )
    complete = data.mask.all(axis=1)
    order = rng.permutation(len(data))
    n_global = min(params.n_global_test, int(complete.sum()) // 2)
    global_idx = order[complete[order]][:n_global]
    topics = int(data.topic.max()) + 1
    mixtures = _client_topics(rng, num_clients, topics, alpha)
    mean_cost = np.array([data.cost[data.mask[:, m], m].mean() for m in range(len(models))])
    cov = sample_coverage(
        rng, num_clients, mean_cost, params.coverage, params.coverage_bias, params.exclude_models
    )
    used = np.zeros(len(data), dtype=bool)
    used[global_idx] = True

    def draw(k: int, n: int, need_complete: bool) -> np.ndarray:
        picked = []
        for t in rng.choice(topics, size=n, p=mixtures[k]):
            ok = ~used & (data.topic == t) & (complete if need_complete else True)
            if not ok.any():
                ok = ~used & (complete if need_complete else True)
            if not ok.any():
                break
            i = rng.choice(np.flatnonzero(ok))
            used[i] = True
            picked.append(i)
        return np.asarray(picked, dtype=np.int64)

    tests = [_subset(data, draw(k, params.n_test, True)) for k in range(num_clients)]
    trains = []
    for k in range(num_clients):
        part = _subset(data, draw(k, params.n_train, False))
        observed = part.mask & cov[k][None, :]  # the table's own gaps stay unobserved
        part = _observe(part, cov[k])
        part.mask = observed
        trains.append(part)
    return Benchmark(trains, tests, _subset(data, global_idx), cov, models, mixtures)


@functools.lru_cache(maxsize=8)
def _benchmark_cached(key: str) -> Benchmark:
    spec = json.loads(key)
    params = BenchmarkParams(**spec["params"])
    make = make_table_benchmark if params.table_path else make_synthetic_benchmark
    return make(params, spec["num_clients"], spec["alpha"], spec["seed"])


def benchmark_for(cfg: dict[str, Any]) -> Benchmark:
    """The (cached) benchmark of an experiment config: seed, clients.num, clients.alpha."""
    names = BenchmarkParams.__dataclass_fields__
    params = {k: v for k, v in cfg["workload"]["params"].items() if k in names}
    key = {
        "params": params,
        "num_clients": cfg["clients"]["num"],
        "alpha": cfg["clients"]["alpha"],
        "seed": cfg["seed"],
    }
    return _benchmark_cached(json.dumps(key, sort_keys=True))


# ================================================================================================
# 2. Routers
# ================================================================================================

HEAD_PREFIXES = ("acc_head.", "cost_head.")  # per-model rows, aggregated per model by fed-mlp


class RouterMLP(nn.Module):
    """Shared trunk; row m of ``acc_head`` predicts P(model m correct), of ``cost_head`` its
    log-cost. One row per model is what lets the server average a model only over its evaluators."""

    def __init__(self, dim: int, hidden: int, num_models: int) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.acc_head = nn.Linear(hidden, num_models)
        self.cost_head = nn.Linear(hidden, num_models)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.acc_head(h), self.cost_head(h)


def masked_router_loss(
    model: RouterMLP, data: RouterData, idx: np.ndarray | slice, cost_weight: float
) -> torch.Tensor:
    """BCE on correctness + cost_weight x MSE on log-cost, both only over evaluated (query, model)
    cells: a model the client did not evaluate contributes nothing (zero gradient to its row)."""
    x = torch.from_numpy(data.emb[idx])
    mask = torch.from_numpy(data.mask[idx]).float()
    logits, log_cost = model(x)
    y = torch.from_numpy(data.y[idx])
    target = torch.log(torch.from_numpy(data.cost[idx]).clamp_min(1e-12))
    denom = mask.sum().clamp_min(1.0)
    bce = nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
    mse = (log_cost - target) ** 2
    return ((bce + cost_weight * mse) * mask).sum() / denom


def train_mlp(
    model: RouterMLP,
    data: RouterData,
    epochs: int,
    lr: float,
    batch_size: int,
    cost_weight: float,
    weight_decay: float,
    seed: int,
) -> float:
    """Local step: AdamW epochs on the masked loss; returns the mean loss."""
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    total, steps = 0.0, 0
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator).numpy()
        for start in range(0, len(order), batch_size):
            opt.zero_grad()
            loss = masked_router_loss(model, data, order[start : start + batch_size], cost_weight)
            loss.backward()
            opt.step()
            total += float(loss.detach())
            steps += 1
    return total / max(steps, 1)


def mlp_predict(model: RouterMLP, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Predicted P(correct) and cost per (query, model)."""
    model.eval()
    with torch.no_grad():
        logits, log_cost = model(torch.from_numpy(emb))
    return torch.sigmoid(logits).numpy().astype(np.float64), np.exp(log_cost.numpy()).astype(
        np.float64
    )


# -- K-means router: Lloyd as sufficient statistics ----------------------------------------------


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
    acc_sum: np.ndarray, evals: np.ndarray, cost_sum: np.ndarray, strength: float
) -> tuple[np.ndarray, np.ndarray]:
    """Quality/cost tables [K, M]: cell mean shrunk towards the model's pooled mean with
    ``strength`` pseudo-evaluations, so empty cells fall back to the model's global mean.
    A model nobody evaluated gets the mean over models."""
    per_model = evals.sum(0)
    seen = per_model > 0
    acc_m = np.where(seen, acc_sum.sum(0) / np.maximum(per_model, 1), 0.0)
    cost_m = np.where(seen, cost_sum.sum(0) / np.maximum(per_model, 1), 0.0)
    if seen.any():
        acc_m[~seen], cost_m[~seen] = acc_m[seen].mean(), cost_m[seen].mean()
    acc = (acc_sum + strength * acc_m) / (evals + strength)
    cost = (cost_sum + strength * cost_m) / (evals + strength)
    return acc, cost


def kmeans_predict(
    centroids: np.ndarray, acc: np.ndarray, cost: np.ndarray, emb: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    labels = assign(np.asarray(emb, dtype=np.float64), centroids)
    return acc[labels], cost[labels]


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


# ================================================================================================
# 3. Baselines as plain functions: centralised (pooled data) and client-local routers
# ================================================================================================


def pool(parts: list[RouterData]) -> RouterData:
    fields = RouterData.__dataclass_fields__
    return RouterData(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))


@dataclass
class MLPConfig:
    hidden: int = param(128, ge=1)
    lr: float = param(1e-3, gt=0)
    batch_size: int = param(64, ge=1)
    local_epochs: int = param(1, ge=1)
    cost_weight: float = param(0.5, ge=0)
    weight_decay: float = param(0.01, ge=0)


def fit_mlp_router(data: RouterData, cfg: MLPConfig, epochs: int, seed: int) -> RouterMLP:
    """One MLP router trained on ``data`` alone (centralised when ``data`` is the pool)."""
    torch.manual_seed(seed)
    model = RouterMLP(data.emb.shape[1], cfg.hidden, data.mask.shape[1])
    train_mlp(model, data, epochs, cfg.lr, cfg.batch_size, cfg.cost_weight, cfg.weight_decay, seed)
    return model


def fit_kmeans_router(
    data: RouterData, k: int, iters: int, strength: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """K-means router on ``data`` alone: k-means++ + Lloyd, then shrunk (cluster, model) tables."""
    x = np.asarray(data.emb, dtype=np.float64)
    c = lloyd(x, kmeanspp(x, min(k, len(x)), np.random.default_rng(seed)), iters)
    acc, cost = shrink_tables(*cluster_stats(data, c), strength)
    return c, acc, cost


# ================================================================================================
# 4. Metrics: routing rule, NDCH, AUC, suboptimality
# ================================================================================================


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
    (costs in units of the median model cost)."""
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
    return RoutingScore(
        auc=auc,
        auc_norm=(auc - single) / max(best - single, 1e-12),
        max_acc=float(accs.max()),
        subopt=float((regret / np.maximum(lambdas[:, None] * scale, 1.0)).mean()),
        oracle_auc=best,
        single_auc=single,
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
    }


# ================================================================================================
# 5. Registration: client logic of the two routers
# ================================================================================================


class _RoutingWorkload(Workload):
    reads = frozenset({"clients.alpha"})  # Dirichlet topic mixtures per client

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.bench = benchmark_for(cfg)
        self.dim = int(self.bench.global_test.emb.shape[1])  # an encoder may differ from params.dim

    def load_partition(self, partition_id: int, num_partitions: int) -> dict[str, Any]:
        return {
            "train": self.bench.train[partition_id],
            "test": self.bench.test[partition_id],
            "coverage": self.bench.coverage[partition_id],
        }

    def predict(self, arrays: ArrayRecord, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def evaluate(self, arrays: ArrayRecord, data: dict[str, Any], config: dict[str, Any]):
        """The global router on the client's own test distribution (every model evaluated)."""
        test = data["test"]
        score = score_router(*self.predict(arrays, test.emb), test, size=self.params.lambdas)
        return score_metrics(score, len(test))

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        test = self.bench.global_test
        score = score_router(*self.predict(arrays, test.emb), test, size=self.params.lambdas)
        metrics = score_metrics(score, len(test))
        metrics.pop("num-examples")
        return metrics


@WORKLOADS.register(
    "routing-mlp", "LLM router: MLP with per-model accuracy/cost heads, masked loss (fed-mlp)"
)
class RoutingMLP(_RoutingWorkload):
    @dataclass
    class Params(BenchmarkParams, MLPConfig):
        pass

    def _model(self) -> RouterMLP:
        return RouterMLP(self.dim, self.params.hidden, self.bench.num_models)

    def _load(self, arrays: ArrayRecord) -> RouterMLP:
        model = self._model()
        model.load_state_dict(arrays.to_torch_state_dict())
        return model

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.cfg["seed"])
        return ArrayRecord(self._model().state_dict())

    def fit(
        self, arrays: ArrayRecord, data: dict[str, Any], config: dict[str, Any], state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, Any]]:
        model = self._load(arrays)
        p = self.params
        seed = client_seed(self.cfg["seed"], config["partition-id"], config["server-round"])
        train = data["train"]
        loss = train_mlp(
            model, train, p.local_epochs, p.lr, p.batch_size, p.cost_weight, p.weight_decay, seed
        )
        metrics = {
            "num-examples": len(train),
            "loss": loss,
            "n-evals-per-model": train.mask.sum(0).astype(int).tolist(),
        }
        return ArrayRecord(model.state_dict()), metrics

    def predict(self, arrays: ArrayRecord, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return mlp_predict(self._load(arrays), emb)


@WORKLOADS.register(
    "routing-kmeans", "LLM router: federated Lloyd K-means + per-(cluster, model) tables"
)
class RoutingKMeans(_RoutingWorkload):
    @dataclass
    class Params(BenchmarkParams):
        clusters: int = 20
        init_iters: int = 10
        shrinkage: float = 5.0

    def init_arrays(self) -> ArrayRecord:
        """Empty router: ``ready`` is 0 until the first statistics round."""
        k, d, m = self.params.clusters, self.dim, self.bench.num_models
        zeros = {
            "centroids": np.zeros((k, d)),
            "router-centroids": np.zeros((k, d)),
            "acc": np.zeros((k, m)),
            "cost": np.zeros((k, m)),
            "ready": np.zeros(1),
        }
        return ArrayRecord({name: _array(v) for name, v in zeros.items()})

    def fit(
        self, arrays: ArrayRecord, data: dict[str, Any], config: dict[str, Any], state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, Any]]:
        """``phase=init``: local centroids and sizes; ``phase=lloyd``: per-centroid sums and
        counts plus per-(cluster, model) correctness/evaluation/cost sums, all sufficient stats."""
        train = data["train"]
        if config.get("phase") == "init":
            seed = client_seed(self.cfg["seed"], config["partition-id"], 0, salt=1)
            k = min(self.params.clusters, len(train))
            c, sizes = local_kmeans_init(train, k, self.params.init_iters, seed)
            pad = self.params.clusters - k
            c, sizes = np.pad(c, ((0, pad), (0, 0))), np.pad(sizes, (0, pad))
            out = {"local-centroids": c, "local-sizes": sizes}
        else:
            c = arrays["centroids"].numpy()
            sums, counts = lloyd_stats(train.emb, c)
            acc_sum, evals, cost_sum = cluster_stats(train, c)
            out = {"sums": sums, "counts": counts, "acc-sum": acc_sum}
            out |= {"evals": evals, "cost-sum": cost_sum}
        metrics = {"num-examples": len(train)}
        return ArrayRecord({k: _array(v) for k, v in out.items()}), metrics

    def predict(self, arrays: ArrayRecord, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = {k: v.numpy() for k, v in arrays.items()}
        return kmeans_predict(a["router-centroids"], a["acc"], a["cost"], emb)

    def evaluate(self, arrays: ArrayRecord, data: dict[str, Any], config: dict[str, Any]):
        if float(arrays["ready"].numpy()[0]) == 0:
            return {"num-examples": len(data["test"])}
        return super().evaluate(arrays, data, config)

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        if float(arrays["ready"].numpy()[0]) == 0:
            return None
        return super().server_evaluate(server_round, arrays)


def _array(value: np.ndarray) -> Array:
    return Array(np.ascontiguousarray(value, dtype=np.float64))
