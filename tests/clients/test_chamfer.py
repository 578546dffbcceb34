"""Chamfer under l_p: unbiased, accurate estimates from crude upper bounds + importance sampling."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from flowerbed.clients.workloads.chamfer import (
    ToeplitzJL,
    add_outliers,
    chamfer_estimate,
    chamfer_exact,
    chamfer_uniform,
    client_similarity,
    crude_estimates,
    lp_embedding,
    make_clustered,
    nearest_lp,
    nearest_lp_brute,
    nearest_neighbour_agreement,
)

torch.set_num_threads(1)


@functools.lru_cache(maxsize=8)
def _sets(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return make_clustered(n, d, rng), make_clustered(n, d, rng)


@functools.lru_cache(maxsize=8)
def _exact(n: int, d: int, p: float) -> float:
    return chamfer_exact(*_sets(n, d), p)


def test_pruned_lp_equals_brute_force() -> None:
    a, b = _sets(2000, 16)
    for p in (1.2, 1.5):
        np.testing.assert_allclose(
            nearest_lp(a[:300], b, p), nearest_lp_brute(a[:300], b, p), rtol=1e-12
        )


@pytest.mark.parametrize("p", [1.5, 2.0])
def test_estimate_within_5_percent_in_9_of_10_seeds(p: float) -> None:
    a, b = _sets(5000, 32)
    exact = _exact(5000, 32, p)
    errors = [
        abs(chamfer_estimate(a, b, p, eps=0.05, seed=s).estimate / exact - 1) for s in range(10)
    ]
    assert sum(e <= 0.05 for e in errors) >= 9, errors


def test_mean_over_50_seeds_is_unbiased() -> None:
    a, b = _sets(1000, 16)
    exact = _exact(1000, 16, 1.5)
    ratios = [chamfer_estimate(a, b, 1.5, samples=100, seed=s).estimate / exact for s in range(50)]
    assert abs(np.mean(ratios) - 1) <= 0.01


@pytest.mark.parametrize("p", [1.5, 2.0])
def test_crude_estimates_bound_the_truth(p: float) -> None:
    a, b = _sets(2000, 32)
    opt = nearest_lp(a, b, p)
    crude = crude_estimates(a, b, p, np.random.default_rng(0))
    assert np.all(crude >= opt * (1 - 1e-12))
    assert crude.sum() <= 3 * opt.sum()
    # the grids matter: a random point of B per a (the fallback alone) is far worse
    rnd = np.linalg.norm(
        a - b[np.random.default_rng(0).integers(len(b), size=len(a))], ord=p, axis=1
    )
    assert rnd.sum() > 3 * opt.sum()


def test_toeplitz_fft_equals_explicit_product_and_preserves_norm() -> None:
    rng = np.random.default_rng(0)
    jl = ToeplitzJL.draw(64, 24, rng)
    x = rng.standard_normal((100, 64))
    np.testing.assert_allclose(jl(x), x @ jl.matrix().T, atol=1e-10)
    ratios = []
    for s in range(1000):
        jl = ToeplitzJL.draw(64, 24, np.random.default_rng(s))
        ratios.append((jl(x[:1]) ** 2).sum() / (x[:1] ** 2).sum())
    assert abs(np.mean(ratios) - 1) < 0.05


@pytest.mark.parametrize("p", [1.5, 2.0])
def test_embedding_preserves_lp_in_expectation(p: float) -> None:
    """Over fresh embeddings, ``E||F(x) - F(y)||_1 = ||x - y||_p``; heavy upper tail for p < 2."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((1, 32)), rng.standard_normal((1, 32))
    target = np.linalg.norm((x - y)[0], ord=p)
    ratio = []
    for _ in range(2000):
        f = lp_embedding(32, p, 24, rng)
        ratio.append(np.abs(f(x) - f(y)).sum() / target)
    ratio = np.array(ratio)
    assert abs(np.mean(ratio) - 1) < 0.05
    if p == 2:
        assert np.mean(ratio < 0.5) <= 0.01 and np.quantile(ratio, 0.999) < 2
    else:
        assert np.quantile(ratio, 0.999) > 2  # p-stable: no expansion only in expectation


def test_importance_beats_uniform_with_far_outliers() -> None:
    rng = np.random.default_rng(3)
    a = add_outliers(make_clustered(2000, 16, rng), 0.01, 20.0, rng)
    b = make_clustered(2000, 16, rng)
    exact = chamfer_exact(a, b, 1.5)
    imp = [chamfer_estimate(a, b, 1.5, samples=100, seed=s).estimate / exact for s in range(20)]
    uni = [chamfer_uniform(a, b, 1.5, samples=100, seed=s) / exact for s in range(20)]
    assert np.std(imp) <= np.std(uni) / 3, (np.std(imp), np.std(uni))


def test_similarity_groups_families() -> None:
    profiles = np.array([[1.0, 5.0], [1.1, 5.2], [4.0, 1.0], [4.2, 0.9]])
    sim = client_similarity(profiles)
    assert nearest_neighbour_agreement(sim, np.array([0, 0, 1, 1])) == 1.0
    assert nearest_neighbour_agreement(sim, np.array([0, 1, 0, 1])) == 0.0


def test_federated_inline_run(tmp_path) -> None:
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    cfg = load_experiment(
        "chamfer",
        ["engine=inline", "rounds=2", "clients.num=8", f"output.dir={tmp_path}",
         "output.plots=false", "workload.params.points=400", "workload.params.reference_points=400",
         "workload.params.subsample=50"],
    )  # fmt: skip
    summary = run_inline(cfg)
    assert summary["failures"] == 0
    m = summary["metrics"]
    assert m["train.rel_error_max"] <= 0.1
    assert m["train.crude_ratio"] >= 1.0
    assert m["central.similarity_nn_agreement"] == 1.0  # clients of the same shape find each other
    assert m["central.similarity_same_family"] > m["central.similarity_other_family"]
