"""Real evaluation tables: a prompt column, per model a correctness column and a cost (a
``<model>|total_cost`` column or ``prices``), embedded prompts, split into clients by topic
mixture or by a column's values."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.workloads.routing.data import (
    TFIDF_ENCODERS,
    Benchmark,
    BenchmarkParams,
    RouterData,
    client_topics,
    encoder_problem,
    observe,
    price_problem,
    sample_coverage,
    subset,
    table_problem,
    unit,
)


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
        problem = encoder_problem(encoder)
        if problem:
            raise ConfigError(problem)
        from sentence_transformers import SentenceTransformer

        emb = SentenceTransformer(encoder).encode(texts, convert_to_numpy=True)
    return unit(np.asarray(emb, dtype=np.float64)).astype(np.float32)


def read_table(source: str | Path | pd.DataFrame) -> pd.DataFrame:
    """A table from CSV, parquet or pickle (by suffix), or a DataFrame as is."""
    if isinstance(source, pd.DataFrame):
        return source
    problem = table_problem(str(source))
    if problem:
        raise ConfigError(problem)
    path = Path(source)
    reader: dict[str, Callable[[Path], pd.DataFrame]] = {
        ".csv": pd.read_csv,
        ".pkl": pd.read_pickle,
        ".parquet": pd.read_parquet,
    }
    return reader[path.suffix](path)


#: ``workload.params.prices[model]``: a cost per query, or ``{per_token, tokens, fixed}``
Price = float | dict[str, float | str]


def table_models(frame: pd.DataFrame, models: list[str], prices: Mapping[str, Price]) -> list[str]:
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


def table_costs(frame: pd.DataFrame, models: list[str], prices: Mapping[str, Price]) -> np.ndarray:
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
        problem = price_problem(m, spec)
        if problem:
            raise ConfigError(f"workload.params.prices: {problem}")
        if not isinstance(spec, dict):
            out[:, j] = float(spec)
            continue
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
    prices: Mapping[str, Price] | None = None,
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
    frame = read_table(cast(str, params.table_path))  # called when it is set
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
    complete = cast(np.ndarray, data.mask.all(axis=1))  # a row per query
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
            tests.append(subset(data, test_idx))
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
        mixtures = client_topics(rng, num_clients, topics, alpha)

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

        tests = [subset(data, draw(k, params.n_test, True)) for k in range(num_clients)]
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
        part = subset(data, idx)
        observed = part.mask & cov[k][None, :]  # the table's own gaps stay unobserved
        part = observe(part, cov[k])
        part.mask = observed
        trains.append(part)
    return Benchmark(trains, tests, subset(data, global_idx), cov, models, mixtures, fallbacks)
