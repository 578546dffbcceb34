"""fed-kmeans / fed-mlp: exact federated Lloyd, per-model head aggregation, through Flower."""

from __future__ import annotations

import random

import numpy as np
import torch
from flwr.app import ConfigRecord

from flowerbed.apps.client_app import app as client_app
from flowerbed.apps.inline import InlineGrid
from flowerbed.clients.core.config import Experiment, to_json
from flowerbed.clients.runtime import CONFIG_KEY
from flowerbed.clients.workloads import build_workload
from flowerbed.clients.workloads.routing.data import pool
from flowerbed.clients.workloads.routing.kmeans import (
    KMeansConfig,
    cluster_stats,
    kmeans_tables,
    kmeanspp,
    lloyd,
    lloyd_stats,
)
from flowerbed.server.experiment import load_experiment
from flowerbed.server.grid import OrderedGrid
from flowerbed.strategies.context import build_strategy
from flowerbed.strategies.fed_kmeans import aggregate_lloyd
from flowerbed.strategies.fed_mlp import aggregate_router_mlp

torch.set_num_threads(1)
SMALL = ["engine=inline", "clients.num=4", "clients.fraction_evaluate=0"]
SMALL += ["workload.params.n_train=60", "workload.params.n_global_test=100"]


def run_flower(cfg: Experiment) -> dict[int, dict[str, np.ndarray]]:
    """Drive the registered strategy on the in-process grid; the global arrays after each round."""
    seen: dict[int, dict[str, np.ndarray]] = {}

    def evaluate_fn(server_round: int, arrays):  # noqa: ANN001
        seen[server_round] = {k: v.numpy().copy() for k, v in arrays.items()}

    random.seed(cfg.seed)
    workload = build_workload(cfg)
    strategy = build_strategy(cfg, workload)
    config = ConfigRecord({CONFIG_KEY: to_json(cfg)})
    strategy.start(
        grid=OrderedGrid(InlineGrid(client_app, cfg.clients.num), lambda r, n: None),
        initial_arrays=workload.init_arrays(),
        num_rounds=cfg.rounds,
        train_config=config,
        evaluate_config=config,
        evaluate_fn=evaluate_fn,
    )
    return seen


def test_aggregated_lloyd_step_equals_centralised() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(n, 5)) + rng.normal(size=5) for n in (30, 7, 50)]
    pooled = np.concatenate(parts)
    c = kmeanspp(pooled, 6, rng)
    for _ in range(5):
        replies = []
        for x in parts:
            sums, counts = lloyd_stats(x, c)
            zeros = np.zeros((6, 2))
            replies.append({"sums": sums, "counts": counts, "acc-sum": zeros})
            replies[-1] |= {"evals": zeros, "cost-sum": zeros}
        fed = aggregate_lloyd(c, replies, KMeansConfig())["centroids"]
        np.testing.assert_allclose(fed, lloyd(pooled, c, 1), rtol=0, atol=1e-12)
        c = fed


def test_federated_lloyd_through_flower_equals_centralised_lloyd() -> None:
    cfg = load_experiment("routing-synthetic-kmeans", SMALL + ["rounds=5"])
    seen = run_flower(cfg)
    bench = build_workload(cfg).bench
    pooled = pool(bench.train)
    start = seen[1]["centroids"]  # after the init round
    assert seen[1]["ready"][0] == 0 and np.abs(start).sum() > 0
    final = seen[5]
    np.testing.assert_allclose(final["centroids"], lloyd(pooled.emb, start, 4), rtol=0, atol=1e-10)
    np.testing.assert_allclose(
        final["router-centroids"], lloyd(pooled.emb, start, 3), rtol=0, atol=1e-10
    )
    # router tables == shrunk statistics of the pooled data under the same centroids
    params = cfg.workload.params
    tables = KMeansConfig(**{k: getattr(params, k) for k in KMeansConfig.__dataclass_fields__})
    acc, cost = kmeans_tables(
        cluster_stats(pooled, final["router-centroids"]), final["router-centroids"], tables
    )
    np.testing.assert_allclose(final["acc"], acc, atol=1e-10)
    np.testing.assert_allclose(final["cost"], cost, atol=1e-10)
    # the mechanism matters: Lloyd moved the centroids
    assert np.abs(final["centroids"] - start).max() > 1e-3


def test_head_rows_are_averaged_over_evaluators_only() -> None:
    prev = {"trunk.0.weight": np.zeros((2, 3)), "acc_head.weight": np.zeros((3, 2))}
    prev["acc_head.bias"] = np.zeros(3)
    a = {"trunk.0.weight": np.ones((2, 3)), "acc_head.weight": np.ones((3, 2))}
    a["acc_head.bias"] = np.ones(3)
    b = {k: 3 * v for k, v in a.items()}
    evals = [[10, 0, 0], [30, 5, 0]]  # model 1: only client b; model 2: nobody
    out = aggregate_router_mlp([a, b], [100, 100], evals, prev)
    np.testing.assert_allclose(out["trunk.0.weight"], 2.0)  # trunk: plain query-weighted mean
    np.testing.assert_allclose(out["acc_head.weight"][0], 2.5)  # (10 * 1 + 30 * 3) / 40
    np.testing.assert_allclose(out["acc_head.weight"][1], 3.0)  # not diluted by client a
    np.testing.assert_allclose(out["acc_head.weight"][2], 0.0)  # no evaluator: prior kept
    np.testing.assert_allclose(out["acc_head.bias"], [2.5, 3.0, 0.0])


def test_model_no_client_evaluated_keeps_its_prior_head_through_flower() -> None:
    """With weight decay every local row drifts; fed-mlp keeps the never-evaluated model's
    rows at their initial value, stock FedAvg (the ablation) does not."""
    overrides = SMALL + ["rounds=2", "workload.params.exclude_models=[10]"]
    overrides += ["workload.params.weight_decay=0.1", "workload.params.local_epochs=1"]
    overrides += ["workload.params.hidden=16", "workload.params.lr=0.01"]
    overrides += ["workload.params.batch_size=16"]
    # the benchmark of the K-means preset (the MLP preset's own setting has 6 models)
    overrides += ["workload.params.models=11", "workload.params.coverage=0.3", "clients.alpha=0.1"]
    overrides += ["workload.params.n_test=200"]
    fed = run_flower(load_experiment("routing-synthetic-mlp", overrides))
    plain = run_flower(
        load_experiment("routing-synthetic-mlp", overrides + ["strategy.name=fedavg"])
    )
    bench = build_workload(load_experiment("routing-synthetic-mlp", overrides)).bench
    assert not bench.coverage[:, 10].any()
    for key in ("acc_head.weight", "acc_head.bias", "cost_head.weight", "cost_head.bias"):
        np.testing.assert_array_equal(fed[2][key][10], fed[0][key][10])
        assert np.abs(plain[2][key][10] - plain[0][key][10]).max() > 1e-4
        assert np.abs(fed[2][key][:10] - fed[0][key][:10]).max() > 1e-4  # others learned


def test_fed_kmeans_gets_its_params_and_the_workloads_tables_config_typed() -> None:
    """build(params, context): the strategy's own Params, and KMeansConfig through the
    routing workload's contract (values of the workload, not KMeansConfig's defaults)."""
    cfg = load_experiment(
        "routing-synthetic-kmeans",
        [*SMALL, "workload.params.clusters=7", "workload.params.shrinkage=2.5",
         "workload.params.temperature=0.2", "strategy.params.init_iters=3", "seed=4"],
    )  # fmt: skip
    strategy = build_strategy(cfg, build_workload(cfg))
    assert type(strategy.tables) is KMeansConfig
    assert (strategy.tables.clusters, strategy.tables.shrinkage) == (7, 2.5)
    assert strategy.tables.temperature == 0.2 and strategy.tables.init_iters == 10
    assert (strategy.init_iters, strategy.seed) == (3, 4)
