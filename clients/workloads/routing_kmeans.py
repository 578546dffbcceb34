"""``routing-kmeans``: the LLM router as federated Lloyd K-means plus per-(cluster, model)
quality / cost tables; clients send sufficient statistics, the server half is ``fed-kmeans``.
The shared routing code: ``clients/workloads/routing/``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS
from flowerbed.clients.workloads.routing.data import BenchmarkParams
from flowerbed.clients.workloads.routing.federated import RoutingShard, RoutingWorkload
from flowerbed.clients.workloads.routing.kmeans import (
    KMeansConfig,
    KMeansRouter,
    cluster_stats,
    fit_kmeans_router,
    lloyd_stats,
    local_kmeans_init,
)
from flowerbed.clients.workloads.routing.metrics import score_router


@WORKLOADS.register(
    "routing-kmeans", "LLM router: federated Lloyd K-means + per-(cluster, model) tables"
)
class RoutingKMeans(RoutingWorkload):
    offers = frozenset({Capability.KMEANS_STATISTICS})

    @dataclass
    class Params(BenchmarkParams, KMeansConfig):
        pass

    params: Params

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
        self, arrays: ArrayRecord, data: RoutingShard, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        """``phase=init``: local centroids and sizes; ``phase=lloyd``: per-centroid sums and
        counts plus per-(cluster, model) correctness/evaluation/cost sums, all sufficient stats."""
        train = data["train"]
        if config.get("phase") == "init":
            seed = client_seed(self.ctx.seed, config["partition-id"], 0, salt=1)
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
        metrics: dict[str, float] = {"num-examples": len(train)}
        return ArrayRecord({k: _array(v) for k, v in out.items()}), metrics

    def router(self, arrays: ArrayRecord) -> KMeansRouter:
        a = {k: v.numpy() for k, v in arrays.items()}
        return KMeansRouter(a["router-centroids"], a["acc"], a["cost"], self.params.temperature)

    def predict(self, arrays: ArrayRecord, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.router(arrays).predict(emb)

    def personal_predict(
        self, arrays: ArrayRecord, data: RoutingShard, partition_id: int, emb: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        own = self.router(arrays).personalised(data["train"], self.params.personal_strength)
        return own.predict(emb)

    def evaluate(self, arrays: ArrayRecord, data: RoutingShard, config: RoundConfig):
        """The global and personalised routers (``RoutingWorkload.evaluate``) and, as the
        baseline of the paper's claim, ``local_*``: the client-local router (the same learner on
        the client's own evaluations alone, as many Lloyd steps as the federated run, routing only
        to the models the client evaluated) on the same test set."""
        if float(arrays["ready"].numpy()[0]) == 0:
            return {"num-examples": len(data["test"])}
        metrics = super().evaluate(arrays, data, config)
        pid, test = int(config["partition-id"]), data["test"]
        iters = max(1, self.ctx.rounds - 1)
        own = fit_kmeans_router(data["train"], self.params, iters, self.ctx.seed + pid)
        local = score_router(*own.predict(test.emb), test, allowed=data["coverage"],
                             size=self.params.lambdas)  # fmt: skip
        for key in ("auc", "auc_norm", "apgr"):
            metrics[f"local_{key}"] = getattr(local, key)
        return metrics

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        if float(arrays["ready"].numpy()[0]) == 0:
            return None
        return super().server_evaluate(server_round, arrays)


def _array(value: np.ndarray) -> Array:
    return Array(np.ascontiguousarray(value, dtype=np.float64))
