"""``fed-kmeans``: the federated K-means router's server (exact federated Lloyd + shrunk cluster
tables; see ``strategies/routing.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Unpack

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.workloads.routing.kmeans import (
    KMeansConfig,
    kmeans_tables,
    server_kmeans_init,
)
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import SamplingKwargs, StrategyEntry
from flowerbed.strategies.routing import as_numpy, as_record, scalar_metrics, valid_replies


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

    def __init__(
        self, tables: KMeansConfig, init_iters: int, seed: int, **kwargs: Unpack[SamplingKwargs]
    ) -> None:
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
        self._current = as_numpy(arrays)
        config["phase"] = self.phase(server_round)
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = valid_replies(replies)
        if not valid or self._current is None:
            return None, None
        states = [as_numpy(next(iter(r.content.array_records.values()))) for r in valid]
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
        return as_record(merged), scalar_metrics(valid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        valid = valid_replies(replies)
        return scalar_metrics(valid) if valid else None


@STRATEGIES.register(
    "fed-kmeans", "Federated K-means router: exact federated Lloyd + shrunk cluster tables"
)
class FedKMeansEntry(StrategyEntry):
    #: init and Lloyd statistics in the replies, and the method's tables config (``KMeansConfig``,
    #: which the workload's params extend): ``routing-kmeans``
    needs = frozenset({Capability.KMEANS_STATISTICS})

    @dataclass
    class Params:
        init_iters: int = param(20, ge=1)

    params: Params

    def strategy(self) -> FedRouterKMeans:
        workload = self.ctx.workload
        if workload is None:
            raise TypeError("fed-kmeans needs the server's workload (kmeans-statistics)")
        return FedRouterKMeans(
            tables=workload.contract(KMeansConfig),
            init_iters=self.params.init_iters,
            seed=self.ctx.seed,
            **self.ctx.sampling.kwargs(),
        )
