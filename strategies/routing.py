"""Server side of federated LLM routing ("Federate the Router"): ``fed-mlp`` and ``fed-kmeans``.

Both are Flower Message-API ``FedAvg`` subclasses with their own ``aggregate_train``:

- ``fed-mlp`` averages the shared trunk by queries, but row m of the accuracy/cost heads only over
  the clients that evaluated model m (weighted by their evaluation counts); a model no client
  evaluated keeps its previous (prior) row. Plain FedAvg would dilute a model's head with the
  untouched rows of clients that never saw it.
- ``fed-kmeans`` runs an init round (server-side weighted k-means++ over the clients' local
  centroids), then rounds of federated Lloyd: clients return per-centroid sums and counts, so the
  new centroids are exactly centralised Lloyd from the same start, together with per-(cluster,
  model) correctness / evaluation / cost sums that become the router's tables with shrinkage.
  Init replies and Lloyd replies have different key sets, which stock FedAvg rejects.

The math is in pure numpy functions over ``dict[str, ndarray]`` so tests call it directly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flowerbed.clients.core.params import param
from flowerbed.clients.workloads.routing import (
    HEAD_PREFIXES,
    KMeansConfig,
    kmeans_tables,
    server_kmeans_init,
)
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.fedavg import sampling_kwargs

EVALS_KEY = "n-evals-per-model"


def _numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def _record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def _scalar_metrics(replies: list[Message]) -> MetricRecord:
    """Example-weighted mean of the scalar metrics (list-valued ones are per-client data)."""
    records = [next(iter(r.content.metric_records.values())) for r in replies]
    weights = np.array([float(r["num-examples"]) for r in records])
    out: dict[str, Any] = {"num-examples": int(weights.sum())}
    keys = set.intersection(*(set(r.keys()) for r in records)) - {"num-examples", "partition-id"}
    for key in sorted(keys):
        if all(isinstance(r[key], int | float) for r in records):
            values = np.array([float(r[key]) for r in records])
            out[key] = float((values * weights).sum() / max(weights.sum(), 1e-12))
    return MetricRecord(out)


def _valid(replies: Iterable[Message]) -> list[Message]:
    return [r for r in replies if not r.has_error()]


# ================================================================================================
# fed-mlp
# ================================================================================================


def is_head_key(key: str) -> bool:
    return key.startswith(HEAD_PREFIXES)


def aggregate_router_mlp(
    states: list[dict[str, np.ndarray]],
    num_examples: list[float],
    evals_per_model: list[list[float]],
    previous: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """Trunk: mean weighted by queries. Head rows (first axis = model): mean over the clients
    that evaluated the model, weighted by their evaluation counts; no evaluator -> previous row."""
    n = np.asarray(num_examples, dtype=np.float64)
    counts = np.asarray(evals_per_model, dtype=np.float64)  # [clients, M]
    out = {}
    for key in states[0]:
        stack = np.stack([s[key].astype(np.float64) for s in states])
        if is_head_key(key):
            total = counts.sum(0)  # [M]
            shape = (len(states), -1) + (1,) * (stack.ndim - 2)
            w = counts / np.maximum(total, 1.0)
            mean = (stack * w.reshape(shape)).sum(0)
            keep = (total == 0).reshape((-1,) + (1,) * (stack.ndim - 2))
            merged = np.where(keep, previous[key].astype(np.float64), mean)
        else:
            merged = np.tensordot(n / n.sum(), stack, axes=1)
        out[key] = merged.astype(states[0][key].dtype)
    return out


class FedRouterMLP(FedAvg):
    """FedAvg with per-model head rows averaged only over the clients that evaluated the model."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._global: dict[str, np.ndarray] | None = None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._global = _numpy(arrays)
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = _valid(replies)
        if not valid or self._global is None:
            return None, None
        records = [next(iter(r.content.metric_records.values())) for r in valid]
        states = [_numpy(next(iter(r.content.array_records.values()))) for r in valid]
        merged = aggregate_router_mlp(
            states,
            [float(m["num-examples"]) for m in records],
            [list(m[EVALS_KEY]) for m in records],
            self._global,
        )
        return _record(merged), _scalar_metrics(valid)


@STRATEGIES.register(
    "fed-mlp", "Federated MLP router: trunk FedAvg, per-model heads over their evaluators only"
)
class FedMLPEntry:
    @staticmethod
    def build(cfg: dict[str, Any]) -> FedRouterMLP:
        return FedRouterMLP(**sampling_kwargs(cfg))


# ================================================================================================
# fed-kmeans
# ================================================================================================


def aggregate_lloyd(
    centroids: np.ndarray,
    replies: list[dict[str, np.ndarray]],
    cfg: KMeansConfig,
) -> dict[str, np.ndarray]:
    """One federated Lloyd step + router tables from summed sufficient statistics.

    ``router-centroids`` are the centroids the statistics were collected under; ``centroids``
    the Lloyd update (an empty cluster keeps its centroid), sent out next round."""
    total = {k: np.sum([r[k] for r in replies], axis=0) for k in replies[0]}
    counts = total["counts"]
    new = np.array(centroids, dtype=np.float64, copy=True)
    hit = counts > 0
    new[hit] = total["sums"][hit] / counts[hit, None]
    stats = (total["acc-sum"], total["evals"], total["cost-sum"])
    acc, cost = kmeans_tables(stats, np.asarray(centroids, dtype=np.float64), cfg)
    return {
        "centroids": new,
        "router-centroids": np.asarray(centroids, dtype=np.float64),
        "acc": acc,
        "cost": cost,
        "ready": np.ones(1),
    }


class FedRouterKMeans(FedAvg):
    """Round 1 ``phase=init`` (local centroids -> global k-means++ start), then ``phase=lloyd``."""

    def __init__(self, tables: KMeansConfig, init_iters: int, seed: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tables = tables
        self.init_iters, self.seed = init_iters, seed
        self._current: dict[str, np.ndarray] | None = None

    @staticmethod
    def phase(server_round: int) -> str:
        return "init" if server_round == 1 else "lloyd"

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._current = _numpy(arrays)
        config["phase"] = self.phase(server_round)
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = _valid(replies)
        if not valid or self._current is None:
            return None, None
        states = [_numpy(next(iter(r.content.array_records.values()))) for r in valid]
        if self.phase(server_round) == "init":
            start = server_kmeans_init(
                [s["local-centroids"] for s in states],
                [s["local-sizes"] for s in states],
                self.tables.clusters,
                self.init_iters,
                self.seed,
            )
            merged = dict(self._current, centroids=start)
        else:
            merged = aggregate_lloyd(self._current["centroids"], states, self.tables)
        return _record(merged), _scalar_metrics(valid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        valid = _valid(replies)
        return _scalar_metrics(valid) if valid else None


@STRATEGIES.register(
    "fed-kmeans", "Federated K-means router: exact federated Lloyd + shrunk cluster tables"
)
class FedKMeansEntry:
    @dataclass
    class Params:
        init_iters: int = param(20, ge=1)

    @staticmethod
    def build(cfg: dict[str, Any]) -> FedRouterKMeans:
        workload = cfg["workload"]["params"]
        tables = KMeansConfig(
            **{k: workload[k] for k in KMeansConfig.__dataclass_fields__ if k in workload}
        )
        return FedRouterKMeans(
            tables=tables,
            init_iters=cfg["strategy"]["params"]["init_iters"],
            seed=cfg["seed"],
            **sampling_kwargs(cfg),
        )
