"""What both routing workloads share: the (cached) benchmark of an experiment config and the
client logic (partitions, evaluation of the global and the personalised router)."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import TypedDict

import numpy as np
from flwr.app import ArrayRecord

from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import Workload, WorkloadContext
from flowerbed.clients.workloads.routing.data import Benchmark, BenchmarkParams, RouterData
from flowerbed.clients.workloads.routing.metrics import score_metrics, score_router
from flowerbed.clients.workloads.routing.synthetic import make_synthetic_benchmark
from flowerbed.clients.workloads.routing.tables import make_table_benchmark


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


def benchmark_for(params: BenchmarkParams, ctx: WorkloadContext) -> Benchmark:
    """The (cached) benchmark of a routing workload's data params and its run: seed, clients.num,
    clients.alpha, clients.partition_by."""
    key = {
        "params": dataclasses.asdict(params),
        "num_clients": ctx.num_clients,
        "alpha": ctx.alpha,
        "partition_by": ctx.partition_by,
        "seed": ctx.seed,
    }
    return _benchmark_cached(json.dumps(key, sort_keys=True))


class RoutingShard(TypedDict):
    """A client's partition: its train and test evaluations and which models it has evaluated."""

    train: RouterData
    test: RouterData
    coverage: np.ndarray  # [M] bool


class RoutingWorkload(Workload):
    # Dirichlet topic mixtures per client, or clients split by a table column
    reads = frozenset({"clients.alpha", "clients.partition_by"})
    params: BenchmarkParams

    def __init__(
        self, params: BenchmarkParams | Mapping[str, object], ctx: WorkloadContext
    ) -> None:
        super().__init__(params, ctx)
        self.bench = benchmark_for(self.contract(BenchmarkParams), ctx)
        self.dim = int(self.bench.global_test.emb.shape[1])  # an encoder may differ from params.dim

    def load_partition(self, partition_id: int, num_partitions: int) -> RoutingShard:
        return {
            "train": self.bench.train[partition_id],
            "test": self.bench.test[partition_id],
            "coverage": self.bench.coverage[partition_id],
        }

    def predict(self, arrays: ArrayRecord, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def personal_predict(
        self, arrays: ArrayRecord, data: RoutingShard, partition_id: int, emb: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The client's personalised router (global router adapted to its own evaluations)."""
        raise NotImplementedError

    def evaluate(self, arrays: ArrayRecord, data: RoutingShard, config: RoundConfig):
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
