"""Routing workload: benchmark generator, masked loss, metrics, table loader, federated path."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from flowerbed.apps.inline import run_inline
from flowerbed.clients.workloads.routing import (
    BenchmarkParams,
    MLPConfig,
    RouterMLP,
    benchmark_for,
    fit_kmeans_router,
    kmeans_predict,
    load_eval_table,
    make_synthetic_benchmark,
    masked_router_loss,
    ndch,
    pool,
    score_router,
    train_mlp,
)
from flowerbed.server.experiment import load_experiment

torch.set_num_threads(1)
TINY = ["engine=inline", "output.plots=false", "clients.num=4", "rounds=2"]
SMALL = ["workload.params.n_train=60", "workload.params.n_test=60"]
SMALL += ["workload.params.n_global_test=300"]


def test_benchmark_is_seeded_and_covers_every_model() -> None:
    params = BenchmarkParams(n_train=50, n_test=40, n_global_test=100, coverage=0.3)
    a = make_synthetic_benchmark(params, 6, 0.1, seed=3)
    b = make_synthetic_benchmark(params, 6, 0.1, seed=3)
    np.testing.assert_array_equal(a.train[2].emb, b.train[2].emb)
    np.testing.assert_array_equal(a.coverage, b.coverage)
    assert (a.coverage.sum(1) == round(0.3 * params.models)).all()
    assert a.coverage.any(0).all()  # every model evaluated by someone
    for k in range(6):
        assert (a.train[k].mask == a.coverage[k][None, :]).all()
        assert (a.train[k].y[:, ~a.coverage[k]] == 0).all()
        assert a.test[k].mask.all()  # test sets evaluate every model
    assert ((a.global_test.p_true > 0) & (a.global_test.p_true < 1)).all()
    # small alpha concentrates each client's topics
    big = make_synthetic_benchmark(params, 6, 100.0, seed=3)
    assert a.mixtures.max(1).mean() > big.mixtures.max(1).mean() + 0.3


def test_masked_loss_ignores_models_a_client_lacks() -> None:
    params = BenchmarkParams(n_train=64, n_test=10, n_global_test=10, coverage=0.3)
    data = make_synthetic_benchmark(params, 4, 1.0, seed=0).train[0]
    lacked = ~data.mask[0]
    torch.manual_seed(0)
    model = RouterMLP(params.dim, 16, params.models)
    loss = masked_router_loss(model, data, slice(None), 0.5)
    loss.backward()
    for head in (model.acc_head, model.cost_head):
        assert head.weight.grad[lacked].abs().max() == 0
        assert head.bias.grad[lacked].abs().max() == 0
        assert head.weight.grad[~lacked].abs().max() > 0
    # garbage in unobserved cells changes nothing; ablation: without the mask it does
    noisy = pool([data])
    noisy.y[:, lacked], noisy.cost[:, lacked] = 1.0, 1e6
    assert torch.equal(masked_router_loss(model, noisy, slice(None), 0.5), loss.detach())
    noisy.mask[:] = True
    assert masked_router_loss(model, noisy, slice(None), 0.5) > loss + 1.0
    # a full local step leaves the lacked rows untouched
    before = model.acc_head.weight.detach().clone()
    train_mlp(model, data, 1, 1e-2, 16, 0.5, 0.0, seed=1)
    assert torch.equal(model.acc_head.weight[lacked], before[lacked])
    assert not torch.equal(model.acc_head.weight[~lacked], before[~lacked])


def test_hull_and_auc_bounds() -> None:
    rng = np.random.default_rng(0)
    costs, accs = rng.random(30), rng.random(30)
    hx, hy = ndch(costs, accs)
    assert (np.diff(hx) > 0).all() and (np.diff(hy) >= 0).all()
    slopes = np.diff(hy) / np.diff(hx)
    assert (np.diff(slopes) <= 1e-12).all()  # concave
    bench = make_synthetic_benchmark(BenchmarkParams(n_train=80, n_test=80), 4, 1.0, seed=1)
    test = bench.global_test
    for quality in (test.p_true, np.full_like(test.p_true, 0.5), rng.random(test.p_true.shape)):
        score = score_router(quality, test.cost_true, test)
        assert 0 <= score.auc <= score.oracle_auc + 1e-12
        assert score.auc <= score.max_acc + 1e-12
    perfect = score_router(test.p_true, test.cost_true, test)
    assert perfect.auc_norm == pytest.approx(1.0) and perfect.subopt == pytest.approx(0.0)


def test_federation_beats_client_local_kmeans_at_low_coverage() -> None:
    """The paper's claim on a tiny case: pooled statistics (what federated K-means computes,
    exactly) route better than each client's own router restricted to the models it evaluated."""
    params = BenchmarkParams(n_train=120, n_test=150, coverage=0.3)
    bench = make_synthetic_benchmark(params, 8, 0.1, seed=0)
    central = fit_kmeans_router(pool(bench.train), 12, 10, 5.0, seed=0)
    local_auc, fed_auc = [], []
    for k in range(8):
        test = bench.test[k]
        own = fit_kmeans_router(bench.train[k], 12, 10, 5.0, seed=0)
        local = score_router(*kmeans_predict(*own, test.emb), test, allowed=bench.coverage[k])
        local_auc.append(local.auc)
        fed_auc.append(score_router(*kmeans_predict(*central, test.emb), test).auc)
    assert np.mean(fed_auc) > np.mean(local_auc) + 0.02


def test_eval_table_loader_and_federated_run(tmp_path) -> None:
    rng = np.random.default_rng(0)
    words = {"math": "solve the equation for x", "code": "write a python function that sorts"}
    words |= {"trivia": "who was the capital city king"}
    rows = []
    for i in range(240):
        name = list(words)[i % 3]
        row = {"prompt": f"{words[name]} {rng.integers(1000)}", "eval_name": name}
        for m, price in (("small", 0.1), ("big", 1.0), ("coder", 0.2)):
            good = 0.9 if m == "big" or (m == "coder" and name == "code") else 0.4
            row[m] = float(rng.random() < good)
            row[f"{m}|total_cost"] = price * (1 + 0.1 * rng.random())
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame.loc[5, "big"] = np.nan
    path = tmp_path / "evals.csv"
    frame.to_csv(path, index=False)
    data, models = load_eval_table(path, dim=8, cost_unit=1.0)
    assert models == ["small", "big", "coder"]
    assert data.emb.shape == (240, 8) and not data.mask[5, 1] and data.mask.sum() == 719
    np.testing.assert_allclose(np.linalg.norm(data.emb, axis=1), 1.0, atol=1e-5)
    assert len(set(data.topic.tolist())) == 3
    overrides = TINY + [f"output.dir={tmp_path}", f"workload.params.table_path={path}"]
    # more SVD dimensions asked for than the tiny vocabulary has: the router follows the data
    assert load_eval_table(path, dim=1000)[0].emb.shape[1] < 1000
    overrides += ["workload.params.dim=1000", "workload.params.n_train=30"]
    overrides += ["workload.params.n_test=20"]
    overrides += ["workload.params.n_global_test=60", "workload.params.coverage=0.5"]
    overrides += ["workload.params.clusters=4"]
    cfg = load_experiment("routing-synthetic-kmeans", overrides)
    assert len(benchmark_for(cfg).global_test) == 60
    summary = run_inline(cfg)
    assert summary["failures"] == 0 and 0 < summary["metrics"]["central.auc"] <= 1


@pytest.mark.parametrize("preset", ["routing-synthetic-mlp", "routing-synthetic-kmeans"])
def test_presets_run_federated(preset: str, tmp_path) -> None:
    cfg = load_experiment(preset, TINY + SMALL + [f"output.dir={tmp_path}"])
    summary = run_inline(cfg)
    metrics = summary["metrics"]
    assert summary["failures"] == 0
    assert metrics["central.auc"] <= metrics["central.oracle_auc"] + 1e-9
    assert "eval.auc" in metrics and "central.subopt" in metrics


def test_mlp_config_matches_workload_params() -> None:
    cfg = load_experiment("routing-synthetic-mlp", TINY)
    for name in MLPConfig.__dataclass_fields__:
        assert name in cfg["workload"]["params"]
