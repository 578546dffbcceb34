"""What a routing benchmark is: queries with their (partly observed) evaluations, per-client
train/test sets with model coverage, and the knobs of the data (synthetic or a real table)."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flowerbed.clients.core.params import param


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


#: built-in text encoders (anything else names a sentence-transformers model)
TFIDF_ENCODERS = ("tfidf", "tfidf-ngrams")
#: the evaluation-table formats ``tables.read_table`` reads, by suffix
TABLE_SUFFIXES = (".csv", ".parquet", ".pkl")
PRICE_KEYS = ("per_token", "tokens", "fixed")


def table_problem(path: str | None) -> str | None:
    """The rule of ``table_path``: unset (synthetic data), or an existing CSV, parquet or pickle."""
    if path is None:
        return None
    if Path(path).suffix not in TABLE_SUFFIXES:
        return f"'{path}' is not an evaluation table (allowed: a {', '.join(TABLE_SUFFIXES)} file)"
    if not Path(path).is_file():
        return f"evaluation table not found: {path}"
    return None


def column_problem(name: str) -> str | None:
    """The rule of a column name: a non-empty string."""
    return None if isinstance(name, str) and name else "a column name must be a non-empty string"


def columns_problem(names: list[str]) -> str | None:
    """The rule of ``model_columns``: distinct non-empty column names (empty list: infer)."""
    for name in names:
        problem = column_problem(name)
        if problem:
            return problem
    twice = sorted({n for n in names if names.count(n) > 1})
    return f"column '{twice[0]}' named twice (each model once)" if twice else None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def price_problem(model: str, spec: object) -> str | None:
    """What is wrong with ``prices[model]``: a cost per query (a number >= 0) or
    ``{per_token: P, tokens: COLUMN}`` (optional ``fixed``: a cost added per query)."""
    if _number(spec):
        return None
    if (
        isinstance(spec, dict)
        and not set(spec) - set(PRICE_KEYS)
        and isinstance(spec.get("tokens"), str)
        and all(_number(spec[k]) for k in ("per_token", "fixed") if k in spec)
    ):
        return None
    return (
        f"'{model}' must be a number >= 0 or a mapping with keys per_token, tokens (a column; "
        f"and optional fixed), got {spec!r}"
    )


def prices_problem(prices: Mapping[str, object]) -> str | None:
    """The rule of ``prices``: each model's cost per query (``price_problem``)."""
    return next((p for m, spec in prices.items() if (p := price_problem(m, spec))), None)


def encoder_problem(encoder: str) -> str | None:
    """The rule of ``encoder``: a TF-IDF encoder, or a sentence-transformers model (a name or a
    local path) when sentence-transformers is installed."""
    if encoder in TFIDF_ENCODERS:
        return None
    if importlib.util.find_spec("sentence_transformers") is None:
        return (
            f"encoder '{encoder}' needs sentence-transformers, which is not installed "
            f"(allowed: {', '.join(TFIDF_ENCODERS)}, or a sentence-transformers model)"
        )
    return None if encoder else "encoder must be a non-empty name"


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
    exclude_models: list[int] = param(factory=list, ge=0)  # model indexes no client evaluates
    table_path: str | None = param(None, check=table_problem)
    #: table: the correctness columns (empty: every column with a cost)
    model_columns: list[str] = param(factory=list, check=columns_problem)
    prices: dict[str, Any] = param(factory=dict, check=prices_problem)  # table: model -> cost
    prompt_column: str = param("prompt", check=column_problem)
    topic_column: str = param("eval_name", check=column_problem)
    encoder: str = param("tfidf", check=encoder_problem)
    cost_unit: float = param(1000.0, gt=0)
    lambdas: int = param(41, ge=2)


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


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


def observe(data: RouterData, models: np.ndarray) -> RouterData:
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


def client_topics(
    rng: np.random.Generator, num_clients: int, topics: int, alpha: float
) -> np.ndarray:
    return rng.dirichlet(np.full(topics, alpha), size=num_clients)


def subset(data: RouterData, idx: np.ndarray) -> RouterData:
    return RouterData(*(getattr(data, f)[idx] for f in RouterData.__dataclass_fields__))


def pool(parts: list[RouterData]) -> RouterData:
    fields = RouterData.__dataclass_fields__
    return RouterData(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))
