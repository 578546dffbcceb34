"""FairTune: proper scoring, equilibrium honesty, welfare vs oracle, and the kappa = 0 ablation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flowerbed.clients.workloads.fairtune import (
    Mechanism,
    best_response_equilibrium,
    build_market,
    expected_payment,
    market_outcome,
    saving_curve,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def market():
    return build_market(0)  # 12 sellers x 16 buyers, measured checkpoints and SGD costs


def test_expected_payment_is_maximised_at_the_true_quality(market) -> None:
    curve = saving_curve(market)
    grid = np.round(np.arange(0.0, 1.0 + 1e-9, 0.001), 6)
    for q in (0.3, 0.6, 0.9):
        pay = expected_payment(grid, q, market.m, Mechanism("fairtune"), curve)
        assert abs(grid[np.argmax(pay)] - q) <= 0.01
        base = expected_payment(grid, q, market.m, Mechanism("report-priced"), curve)
        at_q = base[np.argmin(np.abs(grid - q))]
        assert base[-1] >= at_q  # report-priced: inflating never hurts ...
        if q < 0.9:
            assert base[-1] > at_q + 0.05  # ... and pays wherever the price is not saturated


@pytest.fixture(scope="module")
def outcomes(market) -> dict[str, dict[str, float]]:
    out = {}
    for name, mech in {
        "fairtune": Mechanism("fairtune"),
        "kappa0": Mechanism("fairtune", kappa=0.0),
        "baseline": Mechanism("report-priced"),
    }.items():
        out[name] = market_outcome(market, best_response_equilibrium(market, mech), mech)
    return out


def test_truthful_fixed_point_under_fairtune_and_inflation_under_the_baseline(outcomes) -> None:
    assert outcomes["fairtune"]["misreport_rate"] <= 0.05
    assert outcomes["baseline"]["misreport_rate"] >= 0.4


def test_fairtune_welfare_and_cost_reduction_beat_the_baseline(outcomes) -> None:
    fair, base = outcomes["fairtune"], outcomes["baseline"]
    assert fair["welfare_vs_oracle"] >= 0.9
    assert fair["cost_reduction"] >= 0.5
    assert fair["welfare_vs_oracle"] > base["welfare_vs_oracle"]
    assert fair["cost_reduction"] > base["cost_reduction"]
    assert fair["participation"] == 1.0  # every seller's expected profit is >= 0


def test_without_the_scoring_weight_misreporting_returns(outcomes) -> None:
    assert outcomes["kappa0"]["misreport_rate"] >= 0.3
    assert outcomes["kappa0"]["welfare_vs_oracle"] < outcomes["fairtune"]["welfare_vs_oracle"]


def test_federated_market_through_run_inline(tmp_path) -> None:
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    def run(mechanism: str) -> dict[str, float]:
        overrides = [
            "engine=inline", "rounds=2", f"output.dir={tmp_path}",
            f"workload.params.mechanism={mechanism}",
        ]  # fmt: skip
        return run_inline(load_experiment("fairtune", overrides))["metrics"]

    fair, base = run("fairtune"), run("report-priced")
    assert fair["central.misreport_rate"] <= 0.05 < 0.4 <= base["central.misreport_rate"]
    assert fair["central.welfare_vs_oracle"] > base["central.welfare_vs_oracle"]
    assert fair["central.cost_reduction"] >= 0.5
