"""The robust aggregators of flowerbed's own (norm bounding, centered clipping, geometric median,
FLAME), each built from its config and fed Flower Messages, against FedAvg on the same replies:
the literature's headline of each, on 3 seeds, with the ablation that removes its mechanism."""

from __future__ import annotations

import numpy as np
import pytest

from flowerbed.strategies import flame
from tests.strategies.robust_fixture import SEEDS, build, population, run_round

N = 15


def _error(name: str, seed: int, *params: str, attack: str = "sign-flip", frac: float = 0.2) -> float:  # fmt: skip
    pop = population(seed, n=N, frac=frac, attack=attack)
    sent = np.full(pop.updates.shape[1], 0.5)
    out = run_round(build(name, N, *params), sent, sent + pop.updates)
    return float(np.linalg.norm(out.aggregate - sent - pop.honest_mean))


@pytest.mark.parametrize("seed", SEEDS)
def test_geomed_and_centered_clipping_hold_under_sign_flip_where_fedavg_does_not(seed: int) -> None:
    """20 % of replies at -10 × the honest mean: FedAvg lands at -1.2 × it; the geometric median
    (breakdown point 1/2) and centered clipping (each far update moves the centre by <= tau/n per
    iteration) stay within 0.5 of it (the honest updates' own spread is 0.3)."""
    assert _error("fedavg", seed) > 1.5
    assert _error("geomed", seed) < 0.5
    assert _error("centered-clipping", seed, "strategy.params.tau=1.0") < 0.5


@pytest.mark.parametrize("seed", SEEDS)
def test_norm_bounding_cuts_a_boosted_backdoor_update(seed: int) -> None:
    """Sun et al. 2019: 20 % of clients send a boosted update (10 × a backdoor direction);
    FedAvg moves 2.0 along it, bounding every update to the honest norm (M = 1.1) moves <= 0.25,
    while the honest direction keeps >= 90 % of what FedAvg gives it."""
    pop = population(seed, n=N, attack="backdoor")
    sent = np.zeros(pop.updates.shape[1])
    plain = run_round(build("fedavg", N), sent, pop.updates).aggregate
    bounded = run_round(build("norm-bounding", N, "strategy.params.norm_bound=1.1"), sent, pop.updates)  # fmt: skip
    assert pop.backdoor_share(plain) > 1.9
    assert pop.backdoor_share(bounded.aggregate) < 0.25
    honest = pop.honest_mean / np.linalg.norm(pop.honest_mean)
    assert bounded.aggregate @ honest >= 0.9 * (plain @ honest)
    assert bounded.metrics["clipped-fraction"] >= 0.2


def test_norm_bounding_noise_is_seeded_and_of_the_configured_size() -> None:
    pop = population(0, n=N)
    sent = np.zeros(pop.updates.shape[1])
    params = ("strategy.params.norm_bound=100", "strategy.params.noise_std=0.5")
    a = run_round(build("norm-bounding", N, *params), sent, pop.updates).aggregate
    b = run_round(build("norm-bounding", N, *params), sent, pop.updates).aggregate
    noise = a - pop.updates.mean(axis=0)
    assert np.array_equal(a, b)  # same seed, same round: same draw
    assert 0.3 < noise.std() < 0.7


@pytest.mark.parametrize("seed", SEEDS)
def test_flame_drops_the_backdoor_clients_clipping_alone_does_not(seed: int, monkeypatch) -> None:
    """Nguyen et al. 2022: HDBSCAN on cosine distances admits only the honest majority (every
    malicious client dropped; HDBSCAN also calls some honest ones noise), so the backdoor
    direction gets ~0 (noise only). The ablation without the filter (every update admitted, then
    clipped to the median norm) still moves >= 0.2 along it; FedAvg moves 3.0."""
    pop = population(seed, n=N, frac=0.3, attack="backdoor")
    sent = np.zeros(pop.updates.shape[1])
    out = run_round(build("flame", N), sent, pop.updates)
    honest = set(range(N)) - set(pop.malicious)
    assert not set(out.kept) & set(pop.malicious)  # true-positive rate 1
    assert len(set(out.kept) & honest) >= len(honest) / 2  # an honest majority admitted
    assert abs(pop.backdoor_share(out.aggregate)) < 0.1
    monkeypatch.setattr(flame, "majority_cluster", lambda updates: list(range(len(updates))))
    unfiltered = run_round(build("flame", N), sent, pop.updates)
    assert pop.backdoor_share(unfiltered.aggregate) > 0.2


@pytest.mark.parametrize("seed", SEEDS)
def test_flame_clips_boosted_updates_its_filter_admits(seed: int) -> None:
    """A boosted update pointing where the honest ones do (10 × the client's own honest update)
    passes the cosine filter (some of them; HDBSCAN calls others noise); FLAME's clipping to the median norm S bounds it, so the aggregate's
    norm stays <= S (FedAvg: ~2.8 × the honest mean)."""
    pop = population(seed, n=N, attack="boost")
    sent = np.zeros(pop.updates.shape[1])
    out = run_round(build("flame", N, "strategy.params.noise_factor=0"), sent, pop.updates)
    plain = run_round(build("fedavg", N), sent, pop.updates).aggregate
    assert set(pop.malicious) & set(out.kept)  # same direction: (some) admitted
    assert np.linalg.norm(out.aggregate) <= out.metrics["clip-bound"] + 1e-9
    assert np.linalg.norm(plain) > 2.0 * out.metrics["clip-bound"]
