"""Flower's Krum, MultiKrum and Bulyan through their adapters: built from a config, fed Flower
Messages, they hold against 20 % sign-flipped replies where FedAvg does not (the Byzantine
tolerance claimed by Blanchard et al. 2017 and El Mhamdi et al. 2018), and publish whom they kept."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from flowerbed.clients.core.errors import ConfigError
from tests.cli_helpers import one_line_exit_2, run_cli
from tests.strategies.robust_fixture import SEEDS, build, config, population, run_round

N, F = 15, 3  # 20 % malicious; Bulyan needs n >= 4f + 3
ROBUST = {
    "krum": [f"strategy.params.num_malicious={F}"],
    "multikrum": [f"strategy.params.num_malicious={F}", f"strategy.params.num_selected={N - F}"],
    "bulyan": [f"strategy.params.num_malicious={F}"],
}


@pytest.fixture
def frozen_heap():
    """Flower's Bulyan calls ``gc.collect()`` per selected reply (``to_numpy_ndarrays``), ~0.45 s
    each with torch loaded; objects alive before the test are moved out of the collector's way."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("seed", SEEDS)
def test_krum_family_holds_under_sign_flip_where_fedavg_does_not(seed: int, frozen_heap) -> None:
    pop = population(seed, n=N)
    sent = np.zeros(pop.updates.shape[1])
    fedavg = run_round(build("fedavg", N), sent, sent + pop.updates).aggregate
    assert np.linalg.norm(fedavg - pop.honest_mean) > 1.5  # dragged to -1.2 × the honest mean
    for name, params in ROBUST.items():
        out = run_round(build(name, N, *params), sent, sent + pop.updates)
        error = np.linalg.norm(out.aggregate - pop.honest_mean)
        assert error < 0.5, (name, error)
        assert not set(out.kept) & set(pop.malicious), (name, out.kept)  # no attacker kept
        expected = {"krum": 1, "multikrum": N - F, "bulyan": N - 2 * F}[name]
        assert len(out.kept) == expected, (name, out.kept)


def test_too_few_clients_for_the_rule_are_refused_at_config_time() -> None:
    with pytest.raises(
        ConfigError, match=r"Bulyan needs n >= 4f\+3 = 15 inputs, but a round samples 14"
    ):
        config("bulyan", 14, f"strategy.params.num_malicious={F}")
    with pytest.raises(ConfigError, match=r"Krum needs n >= 2f\+3 = 9"):
        config("krum", 8, "strategy.params.num_malicious=3")
    config("krum", 9, "strategy.params.num_malicious=3")  # enough


@pytest.mark.parametrize("name", ["krum", "geomed", "flame", "fedmedian"])
def test_a_robust_aggregator_behind_secure_aggregation_is_refused_by_the_cli(tmp_path, name) -> None:  # fmt: skip
    """Secure aggregation withholds the individual updates every robust aggregator needs: the
    pairing is refused when the config is resolved, one line naming both, exit 2, nothing written."""
    result, out = run_cli(
        tmp_path, "quickstart", f"strategy.name={name}", "clients.num=5", "clients.min_clients=5",
        "defenses=[{name: secagg}]",
    )  # fmt: skip
    one_line_exit_2(
        result, out,
        f"strategy '{name}' needs individual-updates, which defense 'secagg' withholds from the server",
    )  # fmt: skip


@pytest.mark.parametrize(("name", "least", "most"), [("krum", 1, 1), ("flame", 3, 5)])
def test_a_run_with_a_selecting_rule_logs_whom_it_kept_each_round(tmp_path, name, least, most) -> None:  # fmt: skip
    """The run's own path (inline engine, Flower's driver loop, the runner's metrics tap): the
    summary's ``kept_partitions`` holds, per round, the clients the rule let in (Krum: one; FLAME:
    its majority cluster of 5, at least 3), out of those sampled (``train_partitions``)."""
    import json

    result, out = run_cli(
        tmp_path, "digits-classifier", f"strategy.name={name}",
        "rounds=2", "clients.num=5", "clients.fraction_evaluate=0", "output.plots=false",
        "workload.params.hidden=[16]", "workload.params.local_epochs=1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["kept_partitions"]) == 2
    for kept, sampled in zip(summary["kept_partitions"], summary["train_partitions"], strict=True):
        assert least <= len(kept) <= most and set(kept) <= set(sampled)
    assert summary["metrics"]["central.accuracy"] > 0.3  # trained: 10 classes, chance 0.1
