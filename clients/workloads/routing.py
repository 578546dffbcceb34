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

import copy
import functools
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from torch import nn

from flowerbed.clients.core.capabilities import Capability
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
    fallback_draws: list[int] = field(default_factory=list)  # table: redrawn per client

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
    #: std of per-(client, model) skill offsets: clients whose users find the models better or
    #: worse than the population does (0: quality depends on the query alone, as in the paper)
    client_skill: float = param(0.0, ge=0)
    exclude_models: list[int] = field(default_factory=list)
    table_path: str | None = None
    model_columns: list[str] = field(default_factory=list)  # table: correctness (empty: infer)
    prices: dict[str, Any] = field(default_factory=dict)  # table: model -> cost per query
    prompt_column: str = "prompt"
    topic_column: str = "eval_name"
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

    def queries(
        self,
        topic: np.ndarray,
        rng: np.random.Generator,
        cost_unit: float,
        skill_offset: np.ndarray | None = None,
    ) -> RouterData:
        """Embeddings, true probabilities and one sampled evaluation of every model per query
        (``skill_offset`` [M]: the asking client's shift of every model's skill)."""
        n, dim = len(topic), self.centers.shape[1]
        skill = self.skill if skill_offset is None else self.skill + skill_offset[:, None]
        xi = rng.normal(size=(n, dim))
        emb = _unit(self.centers[topic] + self.spread * xi)
        observable = np.einsum("nd,nd->n", xi, self.hard_dirs[topic])
        difficulty = self.gamma * observable + np.sqrt(1 - self.gamma**2) * rng.normal(size=n)
        p_true = _sigmoid(self.sharpness * (skill[:, topic].T - difficulty[:, None]))
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
    if size < 2 <= len(allowed):
        warnings.warn(
            f"coverage {coverage} x {num_models} models gives each client {size} model: a "
            f"client-local router has nothing to choose from (raise workload.params.coverage "
            f"to >= {1.5 / num_models:.2f})",
            stacklevel=2,
        )
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
    offsets = np.zeros((num_clients, params.models))
    if params.client_skill > 0:  # own stream: the other draws stay those of client_skill = 0
        side = np.random.default_rng(np.random.SeedSequence([seed, 8008, 1]))
        offsets = params.client_skill * side.normal(size=offsets.shape)
    train, test = [], []
    for k in range(num_clients):
        for n, out in ((params.n_train, train), (params.n_test, test)):
            topic = rng.choice(params.topics, size=n, p=mixtures[k])
            out.append(world.queries(topic, rng, params.cost_unit, offsets[k]))
        train[k] = _observe(train[k], cov[k])
    global_topic = rng.choice(params.topics, size=params.n_global_test)
    global_test = world.queries(global_topic, rng, params.cost_unit)
    return Benchmark(train, test, global_test, cov, world.names, mixtures)


# -- real evaluation tables ----------------------------------------------------------------------


#: built-in text encoders (anything else names a sentence-transformers model)
TFIDF_ENCODERS = ("tfidf", "tfidf-ngrams")


def _tfidf(texts: list[str], encoder: str):
    """Sparse TF-IDF rows. ``tfidf``: word unigrams. ``tfidf-ngrams``: word 1-2 grams and
    within-word character 3-5 grams, each seen in at least two texts (a token of one prompt, such
    as an id, says nothing about the others), the two blocks unit-norm side by side."""
    from scipy.sparse import hstack
    from sklearn.feature_extraction.text import TfidfVectorizer

    if encoder == "tfidf":
        return TfidfVectorizer(sublinear_tf=True).fit_transform(texts)
    blocks = []
    for kind, ngrams in (("word", (1, 2)), ("char_wb", (3, 5))):
        try:
            vec = TfidfVectorizer(sublinear_tf=True, analyzer=kind, ngram_range=ngrams, min_df=2)
            blocks.append(vec.fit_transform(texts))
        except ValueError:  # no n-gram shared by two texts (a handful of prompts)
            vec = TfidfVectorizer(sublinear_tf=True, analyzer=kind, ngram_range=ngrams)
            blocks.append(vec.fit_transform(texts))
    return hstack(blocks).tocsr() / np.sqrt(len(blocks))


def embed_texts(texts: list[str], encoder: str = "tfidf", dim: int = 32, seed: int = 0):
    """Unit-norm text embeddings: TF-IDF (``TFIDF_ENCODERS``) + truncated SVD to ``dim``, or any
    installed ``sentence-transformers`` model (a name or local path) for ``encoder``."""
    if encoder in TFIDF_ENCODERS:
        from sklearn.decomposition import TruncatedSVD

        tfidf = _tfidf(texts, encoder)
        k = max(1, min(dim, tfidf.shape[1] - 1, len(texts) - 1))
        emb = TruncatedSVD(k, random_state=seed).fit_transform(tfidf)
    else:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ConfigError(
                f"encoder '{encoder}' needs sentence-transformers "
                f"(or use encoder={' or '.join(TFIDF_ENCODERS)})"
            ) from None
        emb = SentenceTransformer(encoder).encode(texts, convert_to_numpy=True)
    return _unit(np.asarray(emb, dtype=np.float64)).astype(np.float32)


def read_table(source: str | Path | pd.DataFrame) -> pd.DataFrame:
    """A table from CSV, parquet or pickle (by suffix), or a DataFrame as is."""
    if isinstance(source, pd.DataFrame):
        return source
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"evaluation table not found: {path}")
    reader = {".pkl": pd.read_pickle, ".parquet": pd.read_parquet}.get(path.suffix, pd.read_csv)
    return reader(path)


def table_models(frame: pd.DataFrame, models: list[str], prices: dict[str, Any]) -> list[str]:
    """The correctness columns: ``models`` if given, else every ``<m>`` with a ``<m>|total_cost``
    column or a ``prices`` entry (table order)."""
    if models:
        missing = [m for m in models if m not in frame.columns]
        if missing:
            raise ConfigError(
                f"evaluation table has no column '{missing[0]}' for "
                f"workload.params.model_columns "
                f"(columns: {', '.join(map(str, frame.columns))})"
            )
        return list(models)
    found = [c for c in frame.columns if f"{c}|total_cost" in frame.columns or c in prices]
    unknown = [m for m in prices if m not in frame.columns]
    if unknown:
        raise ConfigError(
            f"workload.params.prices names '{unknown[0]}', which is not a column of the table "
            f"(columns: {', '.join(map(str, frame.columns))})"
        )
    if not found:
        raise ConfigError(
            "evaluation table has no model columns: give '<model>' + '<model>|total_cost' "
            "columns, workload.params.prices ({model: cost}) or workload.params.model_columns"
        )
    return found


def table_costs(frame: pd.DataFrame, models: list[str], prices: dict[str, Any]) -> np.ndarray:
    """Per-query cost [n, M]: the ``<m>|total_cost`` column, else ``prices[m]``: a constant per
    query, or ``{per_token: P, tokens: COLUMN}`` (P x the token count; optional ``fixed``)."""
    out = np.empty((len(frame), len(models)))
    for j, m in enumerate(models):
        if f"{m}|total_cost" in frame.columns:
            out[:, j] = frame[f"{m}|total_cost"].to_numpy(np.float64)
            continue
        if m not in prices:
            raise ConfigError(
                f"no cost for model '{m}': add a '{m}|total_cost' column or "
                f"workload.params.prices.{m} (a number, or {{per_token: P, tokens: COLUMN}})"
            )
        spec = prices[m]
        if isinstance(spec, int | float) and not isinstance(spec, bool):
            out[:, j] = float(spec)
            continue
        if not isinstance(spec, dict) or set(spec) - {"per_token", "tokens", "fixed"}:
            raise ConfigError(
                f"workload.params.prices.{m} must be a number or a mapping with keys "
                f"per_token, tokens (and optional fixed), got {spec!r}"
            )
        column = spec.get("tokens")
        if column not in frame.columns:
            raise ConfigError(
                f"workload.params.prices.{m}.tokens: no column '{column}' "
                f"(columns: {', '.join(map(str, frame.columns))})"
            )
        tokens = frame[column].to_numpy(np.float64)
        out[:, j] = float(spec.get("per_token", 0.0)) * tokens + float(spec.get("fixed", 0.0))
    return out


def load_eval_table(
    source: str | Path | pd.DataFrame,
    encoder: str = "tfidf",
    dim: int = 32,
    cost_unit: float = 1000.0,
    seed: int = 0,
    *,
    model_columns: list[str] | None = None,
    prices: dict[str, Any] | None = None,
    prompt_column: str = "prompt",
    topic_column: str = "eval_name",
) -> tuple[RouterData, list[str]]:
    """A wide evaluation table: a prompt column, per model a correctness column in [0, 1] and a
    cost (``<model>|total_cost`` or ``prices``); ``topic_column`` (if present) becomes the topic,
    else K-means clusters of the embeddings. Missing cells are unobserved. Returns all rows as one
    RouterData (outcomes double as "true" values)."""
    frame = read_table(source)
    prices = dict(prices or {})
    if prompt_column not in frame.columns:
        raise ConfigError(
            f"evaluation table needs a '{prompt_column}' column (workload.params.prompt_column; "
            f"columns: {', '.join(map(str, frame.columns))})"
        )
    names = table_models(frame, list(model_columns or []), prices)
    y = frame[names].apply(pd.to_numeric, errors="coerce").to_numpy(np.float64)
    bad = ~np.isnan(y) & ((y < 0) | (y > 1))
    if bad.any():
        col = names[int(np.argwhere(bad)[0][1])]
        raise ConfigError(f"model column '{col}' must hold correctness in [0, 1] (or be empty)")
    cost = table_costs(frame, names, prices) * cost_unit
    mask = ~(np.isnan(y) | np.isnan(cost))
    emb = embed_texts(frame[prompt_column].astype(str).tolist(), encoder, dim, seed)
    if topic_column in frame.columns:
        topic = pd.factorize(frame[topic_column])[0]
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
    return data, names


def _subset(data: RouterData, idx: np.ndarray) -> RouterData:
    return RouterData(*(getattr(data, f)[idx] for f in RouterData.__dataclass_fields__))


def group_values(values: pd.Series, num_clients: int) -> list[list[Any]]:
    """Split a column's distinct values into ``num_clients`` groups with balanced row counts
    (largest value first, onto the group with the fewest rows so far; ties by group index)."""
    counts = values.value_counts(sort=False)
    counts = counts.sort_values(kind="stable", ascending=False)
    if len(counts) < num_clients:
        raise ConfigError(
            f"clients.partition_by column '{values.name}' has {len(counts)} distinct values, "
            f"fewer than clients.num={num_clients}"
        )
    groups: list[list[Any]] = [[] for _ in range(num_clients)]
    rows = np.zeros(num_clients)
    for value, n in counts.items():
        k = int(np.argmin(rows))
        groups[k].append(value)
        rows[k] += n
    return groups


def make_table_benchmark(
    params: BenchmarkParams,
    num_clients: int,
    alpha: float,
    seed: int,
    partition_by: str | None = None,
) -> Benchmark:
    """Split a real table into a global test set and clients with model coverage.

    Clients are Dirichlet(alpha) topic mixtures, or (``partition_by``) groups of a column's
    values. Test rows need every model evaluated; rows with a missing evaluation train only.
    A Dirichlet draw from a topic that ran out is redrawn from the client's mixture over the
    topics that still have rows (counted in ``fallback_draws`` and warned about)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 8009]))
    frame = read_table(params.table_path)
    if partition_by is not None and partition_by not in frame.columns:
        raise ConfigError(
            f"clients.partition_by: no column '{partition_by}' in the evaluation table "
            f"(columns: {', '.join(map(str, frame.columns))})"
        )
    data, models = load_eval_table(
        frame, params.encoder, params.dim, params.cost_unit, seed,
        model_columns=params.model_columns, prices=params.prices, prompt_column=params.prompt_column,
        topic_column=params.topic_column,
    )  # fmt: skip
    complete = data.mask.all(axis=1)
    order = rng.permutation(len(data))
    n_global = min(params.n_global_test, int(complete.sum()) // 2)
    global_idx = order[complete[order]][:n_global]
    topics = int(data.topic.max()) + 1
    mean_cost = np.array([data.cost[data.mask[:, m], m].mean() for m in range(len(models))])
    cov = sample_coverage(
        rng, num_clients, mean_cost, params.coverage, params.coverage_bias, params.exclude_models
    )
    used = np.zeros(len(data), dtype=bool)
    used[global_idx] = True
    fallbacks = [0] * num_clients
    if partition_by is not None:
        groups = group_values(frame[partition_by], num_clients)
        tests, train_idx = [], []
        short = []
        for k, group in enumerate(groups):
            own = order[np.isin(frame[partition_by].to_numpy()[order], group) & ~used[order]]
            own_complete = own[complete[own]]
            n_test = min(params.n_test, len(own_complete) // 2)
            test_idx = own_complete[:n_test]
            rest = own[~np.isin(own, test_idx)][: params.n_train]
            if n_test < params.n_test or len(rest) < params.n_train:
                short.append(f"{k}: {len(rest)} train / {n_test} test")
            tests.append(_subset(data, test_idx))
            train_idx.append(rest)
        if short:
            warnings.warn(
                f"clients.partition_by={partition_by}: clients with fewer rows than "
                f"n_train={params.n_train} / n_test={params.n_test} use what they have "
                f"({'; '.join(short)})",
                stacklevel=2,
            )
        mixtures = np.stack(
            [np.bincount(data.topic[i], minlength=topics) / max(len(i), 1) for i in train_idx]
        )
    else:
        mixtures = _client_topics(rng, num_clients, topics, alpha)

        def draw(k: int, n: int, need_complete: bool) -> np.ndarray:
            eligible = complete if need_complete else np.ones(len(data), dtype=bool)
            left = np.bincount(data.topic[~used & eligible], minlength=topics)
            picked = []
            for t in rng.choice(topics, size=n, p=mixtures[k]):
                if left[t] == 0:  # topic ran out: redraw within the client's own mixture
                    weights = mixtures[k] * (left > 0)
                    if weights.sum() <= 0:
                        break
                    t = rng.choice(topics, p=weights / weights.sum())
                    fallbacks[k] += 1
                i = rng.choice(np.flatnonzero(~used & eligible & (data.topic == t)))
                used[i] = True
                left[t] -= 1
                picked.append(i)
            return np.asarray(picked, dtype=np.int64)

        tests = [_subset(data, draw(k, params.n_test, True)) for k in range(num_clients)]
        train_idx = [draw(k, params.n_train, False) for k in range(num_clients)]
        if sum(fallbacks):
            total = num_clients * (params.n_test + params.n_train)
            warnings.warn(
                f"evaluation table: {sum(fallbacks)} of {total} Dirichlet draws came from a topic "
                f"that ran out and were redrawn from the client's other topics (per client: "
                f"{fallbacks}); lower n_train / n_test or raise clients.alpha",
                stacklevel=2,
            )
    trains = []
    for k, idx in enumerate(train_idx):
        part = _subset(data, idx)
        observed = part.mask & cov[k][None, :]  # the table's own gaps stay unobserved
        part = _observe(part, cov[k])
        part.mask = observed
        trains.append(part)
    return Benchmark(trains, tests, _subset(data, global_idx), cov, models, mixtures, fallbacks)


@functools.lru_cache(maxsize=8)
def _benchmark_cached(key: str) -> Benchmark:
    spec = json.loads(key)
    params = BenchmarkParams(**spec["params"])
    if params.table_path:
        return make_table_benchmark(
            params, spec["num_clients"], spec["alpha"], spec["seed"], spec["partition_by"]
        )
    if spec["partition_by"] is not None:
        raise ConfigError(
            "clients.partition_by splits a real table: set workload.params.table_path "
            "(the synthetic benchmark uses clients.alpha)"
        )
    return make_synthetic_benchmark(params, spec["num_clients"], spec["alpha"], spec["seed"])


def benchmark_for(cfg: dict[str, Any]) -> Benchmark:
    """The (cached) benchmark of an experiment config: seed, clients.num, clients.alpha,
    clients.partition_by."""
    names = BenchmarkParams.__dataclass_fields__
    params = {k: v for k, v in cfg["workload"]["params"].items() if k in names}
    key = {
        "params": params,
        "num_clients": cfg["clients"]["num"],
        "alpha": cfg["clients"]["alpha"],
        "partition_by": cfg["clients"].get("partition_by"),
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
    personal_epochs: int = param(5, ge=0)  # personalised router: epochs of head fine-tuning


@dataclass
class KMeansConfig:
    clusters: int = param(20, ge=1)
    init_iters: int = param(10, ge=1)
    shrinkage: float = param(5.0, ge=0)  # pseudo-evaluations of the model's pooled mean
    bandwidth: float = param(0.1, ge=0)  # neighbour smoothing of the tables (0: off)
    neighbour_strength: float = param(20.0, ge=0)  # pseudo-evaluations of the neighbour prior
    temperature: float = param(0.05, ge=0)  # soft assignment when routing (0: nearest centroid)
    personal_strength: float = param(10.0, ge=0)  # personalised router: pseudo-evals of global


def fit_mlp_router(data: RouterData, cfg: MLPConfig, epochs: int, seed: int) -> RouterMLP:
    """One MLP router trained on ``data`` alone (centralised when ``data`` is the pool)."""
    torch.manual_seed(seed)
    model = RouterMLP(data.emb.shape[1], cfg.hidden, data.mask.shape[1])
    train_mlp(model, data, epochs, cfg.lr, cfg.batch_size, cfg.cost_weight, cfg.weight_decay, seed)
    return model


def personalise_mlp(model: RouterMLP, data: RouterData, cfg: MLPConfig, seed: int) -> RouterMLP:
    """A client's personalised router: the global trunk kept, a copy of the heads fine-tuned on
    the client's own evaluations (masked loss: rows of models it never evaluated stay global)."""
    personal = copy.deepcopy(model)
    for weight in personal.trunk.parameters():
        weight.requires_grad_(False)
    train_mlp(
        personal, data, cfg.personal_epochs, cfg.lr, cfg.batch_size, cfg.cost_weight, 0.0, seed
    )
    return personal


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


# ================================================================================================
# 5. Registration: client logic of the two routers
# ================================================================================================


class _RoutingWorkload(Workload):
    # Dirichlet topic mixtures per client, or clients split by a table column
    reads = frozenset({"clients.alpha", "clients.partition_by"})

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

    def personal_predict(
        self, arrays: ArrayRecord, data: dict[str, Any], partition_id: int, emb: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The client's personalised router (global router adapted to its own evaluations)."""
        raise NotImplementedError

    def evaluate(self, arrays: ArrayRecord, data: dict[str, Any], config: dict[str, Any]):
        """The global and the client's personalised router on the client's own test
        distribution (every model evaluated); personalised metrics are ``personal_*``."""
        test = data["test"]
        score = score_router(*self.predict(arrays, test.emb), test, size=self.params.lambdas)
        metrics = score_metrics(score, len(test))
        own = self.personal_predict(arrays, data, int(config["partition-id"]), test.emb)
        personal = score_router(*own, test, size=self.params.lambdas)
        for key in ("auc", "auc_norm", "apgr"):
            metrics[f"personal_{key}"] = getattr(personal, key)
        return metrics

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
    offers = frozenset({Capability.ROUTER_HEADS})

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

    def personal_predict(
        self, arrays: ArrayRecord, data: dict[str, Any], partition_id: int, emb: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        seed = client_seed(self.cfg["seed"], partition_id, 0, salt=2)
        return mlp_predict(
            personalise_mlp(self._load(arrays), data["train"], self.params, seed), emb
        )


@WORKLOADS.register(
    "routing-kmeans", "LLM router: federated Lloyd K-means + per-(cluster, model) tables"
)
class RoutingKMeans(_RoutingWorkload):
    offers = frozenset({Capability.KMEANS_STATISTICS})

    @dataclass
    class Params(BenchmarkParams, KMeansConfig):
        pass

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

    def router(self, arrays: ArrayRecord) -> KMeansRouter:
        a = {k: v.numpy() for k, v in arrays.items()}
        return KMeansRouter(a["router-centroids"], a["acc"], a["cost"], self.params.temperature)

    def predict(self, arrays: ArrayRecord, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.router(arrays).predict(emb)

    def personal_predict(
        self, arrays: ArrayRecord, data: dict[str, Any], partition_id: int, emb: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        own = self.router(arrays).personalised(data["train"], self.params.personal_strength)
        return own.predict(emb)

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
