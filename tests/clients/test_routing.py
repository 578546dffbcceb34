"""Routing workload: benchmark generator, masked loss, metrics, table loader, federated path."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from flowerbed.apps.inline import run_inline
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.workloads import build_workload
from flowerbed.clients.workloads.routing.data import BenchmarkParams, pool, sample_coverage
from flowerbed.clients.workloads.routing.kmeans import KMeansConfig, fit_kmeans_router
from flowerbed.clients.workloads.routing.metrics import ndch, score_router
from flowerbed.clients.workloads.routing.mlp import (
    MLPConfig,
    RouterMLP,
    masked_router_loss,
    train_mlp,
)
from flowerbed.clients.workloads.routing.synthetic import make_synthetic_benchmark
from flowerbed.clients.workloads.routing.tables import load_eval_table
from flowerbed.server.experiment import load_experiment, resolve
from tests.clients.routing_fixture import make_table

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
    kcfg = KMeansConfig(clusters=12)
    central = fit_kmeans_router(pool(bench.train), kcfg, 10, seed=0)
    local_auc, fed_auc = [], []
    for k in range(8):
        test = bench.test[k]
        own = fit_kmeans_router(bench.train[k], kcfg, 10, seed=0)
        local = score_router(*own.predict(test.emb), test, allowed=bench.coverage[k])
        local_auc.append(local.auc)
        fed_auc.append(score_router(*central.predict(test.emb), test).auc)
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
    assert len(build_workload(cfg).bench.global_test) == 60
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
        assert hasattr(cfg.workload.params, name)


# -- real tables by config ------------------------------------------------------------------------

FIXTURE = Path(__file__).parent / "data" / "routing_evals.csv"
PRICES = {"small-7b": 0.5, "coder-13b": {"per_token": 1e-3, "tokens": "prompt_tokens"}}


def test_shipped_fixture_is_the_generators_output() -> None:
    assert make_table().to_csv(index=False) == FIXTURE.read_text()


def test_table_costs_from_prices_or_cost_columns() -> None:
    frame = pd.read_csv(FIXTURE).head(50)
    data, models = load_eval_table(frame, dim=4, cost_unit=1.0, prices=PRICES)
    # prices name two models; large-api brings its own cost column; mid-70b has neither
    assert models == ["small-7b", "coder-13b", "large-api"]
    np.testing.assert_allclose(data.cost[:, 0], 0.5)
    np.testing.assert_allclose(data.cost[:, 1], 1e-3 * frame["prompt_tokens"], rtol=1e-6)
    np.testing.assert_allclose(data.cost[:, 2], frame["large-api|total_cost"], rtol=1e-6)
    named, _ = load_eval_table(frame, dim=4, prices=PRICES, model_columns=["small-7b"])
    assert named.y.shape == (50, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prices": {"gpt-5": 1.0}}, "prices names 'gpt-5', which is not a column"),
        ({"model_columns": ["mid-70b"]}, "no cost for model 'mid-70b'"),
        (
            {"prices": {"mid-70b": {"per_token": 1.0, "tokens": "n"}}},
            "prices.mid-70b.tokens: no column",
        ),
        (
            {"prices": {"mid-70b": {"per_token": 1.0}}},
            "'mid-70b' must be a number >= 0 or a mapping",
        ),
        ({"prices": {"mid-70b": "cheap"}}, "'mid-70b' must be a number >= 0 or a mapping"),
        ({"prompt_column": "question"}, "needs a 'question' column"),
        ({"model_columns": ["subject"], "prices": {"subject": 1.0}}, "correctness in [0, 1]"),
    ],
)
def test_table_errors_name_the_problem(kwargs: dict, message: str) -> None:
    frame = pd.read_csv(FIXTURE).head(20)
    frame["subject"] = 3.0  # not a correctness column
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_eval_table(frame, dim=4, **kwargs)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("table_path=evals.xlsx", "table_path: 'evals.xlsx' is not an evaluation table (allowed: a .csv, .parquet, .pkl file)"),
        ("table_path=missing.csv", "table_path: evaluation table not found: missing.csv"),
        ("exclude_models=[-1]", "every value of workload.params.exclude_models must be >= 0 (got [-1])"),
        ("model_columns=[small-7b,small-7b]", "model_columns: column 'small-7b' named twice (each model once)"),
        ("prices.small-7b=-1", "prices: 'small-7b' must be a number >= 0 or a mapping with keys per_token, tokens"),
        ("prices.small-7b.per_token=0.1", "prices: 'small-7b' must be a number >= 0 or a mapping"),
        ("prompt_column=''", "workload.params.prompt_column: a column name must be a non-empty string"),
        ("encoder=bert-base", "encoder 'bert-base' needs sentence-transformers, which is not installed (allowed: tfidf, tfidf-ngrams, or a sentence-transformers model)"),
    ],
)  # fmt: skip
def test_bad_data_source_is_one_line_exit_2(tmp_path: Path, override: str, needle: str) -> None:
    """Each data-source field has a rule: a bad value stops the CLI before anything starts."""
    from tests.cli_helpers import one_line_exit_2, run_cli

    if override.startswith("encoder=") and importlib.util.find_spec("sentence_transformers"):
        pytest.skip("sentence-transformers is installed: any model name passes the rule")
    one_line_exit_2(
        *run_cli(tmp_path, "routing-synthetic-kmeans", f"workload.params.{override}"), needle
    )


def _table_cfg(tmp_path: Path, kind: str = "kmeans", extra: list[str] = ()) -> dict:
    base = str(Path(__file__).parent / "data" / f"routing-table-{kind}.yaml")
    overrides = ["engine=inline", f"output.dir={tmp_path}", "output.plots=false"]
    overrides.append(f"workload.params.table_path={FIXTURE}")
    return load_experiment(base, overrides + list(extra))


def test_partition_by_gives_each_client_a_group_of_values(tmp_path: Path) -> None:
    cfg = _table_cfg(tmp_path)
    bench = build_workload(cfg).bench
    frame = pd.read_csv(FIXTURE)
    subjects = pd.factorize(frame["subject"])[0]
    seen = [set(np.flatnonzero(np.bincount(t.topic, minlength=6)).tolist()) for t in bench.train]
    assert [len(s) for s in seen] == [2, 2, 2]  # 6 subjects in 3 groups, disjoint
    assert set().union(*seen) == set(subjects.tolist())
    for train, test in zip(bench.train, bench.test, strict=True):
        assert set(test.topic.tolist()) <= set(train.topic.tolist())
        assert len(train) == 400 and len(test) == 100
    assert (bench.coverage.sum(1) == 2).all()  # coverage 0.5 of 4 models
    with pytest.raises(ConfigError, match="6 distinct values, fewer than clients.num=7"):
        build_workload(_table_cfg(tmp_path, extra=["clients.num=7"]))
    with pytest.raises(ConfigError, match="no column 'grade'"):
        build_workload(_table_cfg(tmp_path, extra=["clients.partition_by=grade"]))
    with pytest.raises(ConfigError, match="needs workload.params.table_path|set workload.params"):
        build_workload(load_experiment("routing-synthetic-kmeans", ["clients.partition_by=x"]))
    with pytest.raises(ConfigError, match="does not use clients.partition_by"):
        load_experiment("quickstart", ["clients.partition_by=subject"])
    # a resolved config (partition_by: null) resolves again, as the ServerApp does
    assert resolve(load_experiment("quickstart").to_dict()).clients.partition_by is None


def test_dirichlet_draws_never_cross_topics_silently(tmp_path: Path) -> None:
    """More queries asked of a topic than it has: the shortfall is redrawn from the client's
    own mixture and reported with its count."""
    overrides = ["clients.partition_by=null", "clients.alpha=0.05", "workload.params.n_train=500"]
    overrides += ["workload.params.n_test=60"]
    with pytest.warns(UserWarning, match=r"Dirichlet draws came from a topic that ran out"):
        bench = build_workload(_table_cfg(tmp_path, extra=overrides)).bench
    assert sum(bench.fallback_draws) > 0
    assert all(len(t) == 500 for t in bench.train)


def test_coverage_of_fewer_than_two_models_warns() -> None:
    rng = np.random.default_rng(0)
    with pytest.warns(UserWarning, match="gives each client 1 model"):
        cov = sample_coverage(rng, 4, np.array([1.0, 2.0]), 0.3, 0.5)
    assert (cov.sum(1) == 1).all()


# -- claim tests: learned routers beat the best mix of single models ------------------------------

CLAIM = ["engine=inline", "output.plots=false", "clients.num=6", "clients.fraction_evaluate=0"]
CLAIM += ["clients.alpha=1.0", "workload.params.n_test=50", "workload.params.n_global_test=600"]


def _central(preset: str, tmp_path: Path, overrides: list[str]) -> dict[str, float]:
    cfg = load_experiment(preset, [*CLAIM, f"output.dir={tmp_path}", *overrides])
    return run_inline(cfg)["metrics"]


def test_fed_kmeans_beats_the_single_model_hull_and_its_cluster_blind_ablation(tmp_path) -> None:
    """Claim: the federated K-means router routes clearly better than the best mix of single
    models (normalised AUC on the global test set, 3 seeds); with one cluster (cluster-blind) it
    is that mix exactly."""
    small = ["rounds=6", "workload.params.clusters=12", "workload.params.coverage=0.5"]
    small.append("workload.params.n_train=100")
    norms = [
        _central("routing-synthetic-kmeans", tmp_path, [*small, f"seed={s}"]) for s in range(3)
    ]
    blind = _central("routing-synthetic-kmeans", tmp_path, [*small, "workload.params.clusters=1"])
    assert min(m["central.auc_norm"] for m in norms) > 0.4
    assert abs(blind["central.auc_norm"]) < 0.02
    assert norms[0]["central.auc_norm"] > blind["central.auc_norm"] + 0.4
    assert norms[0]["central.apgr"] > blind["central.apgr"] + 0.05  # same seed, same hull ends


def test_fed_mlp_beats_the_single_model_hull(tmp_path) -> None:
    """Claim: the federated MLP router beats the best mix of single models (normalised AUC on
    the global test set, mean over 3 seeds; a constant router scores <= 0)."""
    small = ["rounds=8", "workload.params.local_epochs=3", "workload.params.coverage=0.7"]
    small += ["workload.params.n_train=250", "workload.params.models=6"]
    norms = [
        _central("routing-synthetic-mlp", tmp_path, [*small, f"seed={s}"])["central.auc_norm"]
        for s in range(3)
    ]
    assert np.mean(norms) > 0.3 and min(norms) > 0.15


# -- claim test: personalisation pays where clients' quality differs ------------------------------

PERSONAL = ["engine=inline", "output.plots=false", "clients.num=4", "clients.alpha=1.0"]
PERSONAL += ["workload.params.client_skill=2.0", "workload.params.models=6"]
PERSONAL += ["workload.params.coverage=0.7", "workload.params.n_train=150"]
PERSONAL += ["workload.params.n_test=100", "workload.params.n_global_test=200"]


@pytest.mark.parametrize(
    ("preset", "extra"),
    [
        ("routing-synthetic-mlp", ["rounds=2", "workload.params.local_epochs=5", "workload.params.personal_epochs=60"]),
        ("routing-synthetic-kmeans", ["rounds=4", "workload.params.clusters=8"]),
    ],
    ids=["mlp", "kmeans"],
)  # fmt: skip
def test_personalised_router_beats_the_global_one_where_clients_quality_differs(
    preset: str, extra: list[str], tmp_path: Path
) -> None:
    """Claim: when each client's users find the models better or worse than the population does
    (``client_skill``: per-(client, model) skill offsets the query does not reveal), the client's
    personalised router routes its own test queries better than the global router (AUC of the
    accuracy-cost curve on the client's test set, every seed, 3 seeds); a personalisation that
    returns the global router ties exactly."""
    gains = []
    for seed in range(3):
        cfg = load_experiment(preset, [*PERSONAL, *extra, f"seed={seed}", f"output.dir={tmp_path}"])
        metrics = run_inline(cfg)["metrics"]
        gains.append(metrics["eval.personal_auc"] - metrics["eval.auc"])
    assert min(gains) > 0.005, (
        gains
    )  # measured: MLP +0.094 +0.032 +0.018, K-means +0.012 +0.021 +0.063
    assert np.mean(gains) > 0.02, gains


def test_ngram_encoder_ignores_tokens_of_one_prompt() -> None:
    """``tfidf-ngrams`` keeps only word / character n-grams seen in two prompts, so prompts that
    differ by an id alone embed alike (plain ``tfidf`` keeps the ids); other prompts stay apart."""
    from flowerbed.clients.workloads.routing.tables import embed_texts

    texts = [f"easy question: cell gene #{d * 4}" for d in "123"]
    texts += [f"hard question: court tort #{d * 4}" for d in "456"]
    ngrams = embed_texts(texts, "tfidf-ngrams", dim=5)
    assert np.allclose(np.linalg.norm(ngrams, axis=1), 1.0, atol=1e-5)
    assert np.allclose(ngrams[:3], ngrams[0], atol=1e-5) and np.allclose(
        ngrams[3:], ngrams[3], atol=1e-5
    )
    assert ngrams[0] @ ngrams[3] < 0.9
    plain = embed_texts(texts, "tfidf", dim=5)
    assert not np.allclose(plain[0], plain[1], atol=1e-3)
    assert embed_texts(["alpha beta", "gamma delta"], "tfidf-ngrams", dim=3).shape == (2, 1)
