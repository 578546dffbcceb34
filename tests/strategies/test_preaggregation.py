"""Pre-aggregation in front of a robust rule: nearest-neighbour mixing (Allouah et al. 2023) lets
Krum find the honest mean under heterogeneity, where Krum alone picks one client's skewed update;
bucketing (Karimireddy et al. 2022) cuts centered clipping's heterogeneity bias, hands the rule
bucket means and maps its selection back to the buckets' members."""

from __future__ import annotations

import numpy as np
import pytest

from tests.strategies.robust_fixture import DIM, SEEDS, build, run_round

N, F = 15, 3


def _axes(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A unit honest direction and a unit skew direction orthogonal to it."""
    direction = rng.normal(size=DIM)
    direction /= np.linalg.norm(direction)
    skew = rng.normal(size=DIM)
    skew -= (skew @ direction) * direction
    return direction, skew / np.linalg.norm(skew)


def heterogeneous(seed: int, gap: float = 1.0) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Honest clients in two groups, ``±gap`` off their mean along one direction (label skew);
    20 % malicious send -10 × the honest mean."""
    rng = np.random.default_rng(seed)
    direction, skew = _axes(rng)
    malicious = sorted(rng.choice(N, F, replace=False).tolist())
    honest = [i for i in range(N) if i not in malicious]
    updates = np.empty((N, DIM))
    for k, i in enumerate(honest):
        side = gap if k % 2 else -gap
        updates[i] = direction + side * skew + rng.normal(size=DIM) * 0.1 / np.sqrt(DIM)
    mean = updates[honest].mean(axis=0)
    updates[malicious] = -10.0 * mean
    return updates, mean, malicious


@pytest.mark.parametrize("seed", SEEDS)
def test_nnm_lets_krum_find_the_honest_mean_under_heterogeneity(seed: int) -> None:
    updates, mean, malicious = heterogeneous(seed)
    sent = np.zeros(DIM)
    krum = f"strategy.params.num_malicious={F}"
    alone = run_round(build("krum", N, krum), sent, updates)
    mixed = run_round(
        build("krum", N, krum, "strategy.params.pre_aggregation=nnm", f"strategy.params.nnm_malicious={F}"),
        sent, updates,
    )  # fmt: skip
    assert np.linalg.norm(alone.aggregate - mean) > 0.9  # one skewed client: ~gap off
    assert np.linalg.norm(mixed.aggregate - mean) < 0.05  # the mean of the n-f nearest
    assert not set(mixed.kept) & set(malicious)


def skewed(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """14 honest clients, three in four at +1 and one in four at -3 along a skew direction (their
    mean has no skew), and one malicious at -10 × the honest mean."""
    rng = np.random.default_rng(seed)
    direction, skew = _axes(rng)
    malicious = int(rng.integers(N))
    honest = [i for i in range(N) if i != malicious]
    updates = np.empty((N, DIM))
    for k, i in enumerate(honest):
        side = 1.0 if k % 4 else -3.0
        updates[i] = direction + side * skew + rng.normal(size=DIM) * 0.1 / np.sqrt(DIM)
    mean = updates[honest].mean(axis=0)
    updates[malicious] = -10.0 * mean
    return updates, mean


def test_bucketing_cuts_centered_clippings_heterogeneity_bias() -> None:
    """Karimireddy, He & Jaggi 2022: under heterogeneity a robust rule is biased towards the
    majority's skew (centered clipping lands ~0.72 off the honest mean); averaging buckets of 2
    first (drawn from the config seed) brings it closer on every seed, and by ~half on average."""
    alone, bucketed = [], []
    for seed in SEEDS:
        updates, mean = skewed(seed)
        sent = np.zeros(DIM)
        seeded = f"seed={seed}"
        plain = run_round(build("centered-clipping", N, seeded), sent, updates)
        mixed = run_round(build(
            "centered-clipping", N, seeded, "strategy.params.pre_aggregation=bucketing",
            "strategy.params.bucket_size=2",
        ), sent, updates)  # fmt: skip
        alone.append(np.linalg.norm(plain.aggregate - mean))
        bucketed.append(np.linalg.norm(mixed.aggregate - mean))
    assert min(alone) > 0.6
    assert all(b < a - 0.02 for a, b in zip(alone, bucketed, strict=True)), (alone, bucketed)
    assert np.mean(bucketed) < 0.7 * np.mean(alone), (alone, bucketed)


def test_bucketing_averages_buckets_and_reports_the_kept_buckets_members() -> None:
    """MultiKrum (f = 0, m = 1) behind buckets of 3: the aggregate is the mean of one bucket's
    three updates, and ``kept-partitions`` names those three clients."""
    rng = np.random.default_rng(0)
    updates = rng.normal(size=(N, DIM))
    strategy = build(
        "multikrum", N, "strategy.params.num_selected=1", "strategy.params.pre_aggregation=bucketing",
        "strategy.params.bucket_size=3",
    )  # fmt: skip
    out = run_round(strategy, np.zeros(DIM), updates)
    assert len(out.kept) == 3
    assert np.allclose(out.aggregate, updates[out.kept].mean(axis=0), rtol=0, atol=1e-12)
    again = run_round(strategy, np.zeros(DIM), updates)
    assert again.kept == out.kept  # the buckets are drawn from (seed, round)
