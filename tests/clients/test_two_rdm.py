"""2RDM: early warning, participation ratio and interpretable eigenvectors on a deep linear network."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clients.workloads.two_rdm import (
    HEAT_CAPACITIES,
    DLNConfig,
    abs_corr,
    at_step,
    dln_gaussian_2rdm,
    dln_loss_gradients,
    dln_sgd_step,
    early_warning,
    init_dln,
    make_teacher,
    run_dln,
    spectrum,
    teacher_data,
    transition_steps,
)


@pytest.fixture(scope="module")
def dln():
    trace = run_dln(DLNConfig(seed=0))
    return trace, transition_steps(trace)


def test_transitions_are_sequential(dln):
    trace, steps = dln
    assert steps[0] < steps[1] < steps[2]
    assert trace.loss[-1] < 0.01 * trace.loss[0]


def test_trace_rises_decades_before_first_loss_drop(dln):
    trace, steps = dln
    warning = early_warning(trace, 0, (steps[0] + steps[1]) // 2, decades=3.0, fraction=0.05)
    # the fluctuation observable has risen 3 decades while the loss has not yet dropped 5 %
    assert warning.warning_step is not None
    assert warning.margin is not None and warning.margin >= 50
    assert warning.rise_at_loss_moved >= 3.0


def test_participation_ratio_low_at_transitions_high_after_convergence(dln):
    trace, steps = dln
    at_transition = [float(np.median(at_step(trace, trace.participation_ratio, s))) for s in steps]
    assert at_transition[0] <= 1.5 and at_transition[1] <= 1.5
    assert at_transition[2] <= 2.0
    converged = trace.participation_ratio[trace.steps >= steps[-1] + 1000]
    assert np.median(converged) >= 2.5
    assert np.median(converged) > max(at_transition) + 1.0


def test_top_eigenvector_aligns_with_the_mode_being_learned(dln):
    trace, steps = dln
    for m, s in enumerate(steps):
        vectors = at_step(trace, trace.top_vectors, s)
        corr = [float(np.median([abs_corr(v, sig) for v in vectors])) for sig in trace.signatures.T]
        assert corr[m] >= 0.9, (m, corr)
        assert corr[m] == max(corr)


def test_gaussian_2rdm_matches_linearisation():
    rng = np.random.default_rng(0)
    teacher = make_teacher(6, [3.0, 1.0], seed=0)
    params = init_dln(6, 8, 0.3, rng)
    for _ in range(200):
        x, y = teacher_data(teacher, 64, 0.0, rng)
        dln_sgd_step(params, x, y, 0.01)
    probe_x, probe_y = teacher_data(teacher, 16, 0.0, rng)
    sigma = 1e-4
    c = dln_gaussian_2rdm(params, probe_x, probe_y, sigma, 20000, rng)
    g = dln_loss_gradients(params, probe_x, probe_y)
    linear = sigma**2 * g @ g.T
    assert np.linalg.norm(c - linear) / np.linalg.norm(linear) < 0.05
    # a wrong gradient (the other layer's only) is far off: the check can fail
    half = sigma**2 * g[:, :48] @ g[:, :48].T
    assert np.linalg.norm(c - half) / np.linalg.norm(linear) > 0.2


def test_heat_capacity_is_pluggable_and_consistent():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(12, 12))
    c = a @ a.T
    values = {name: spectrum(c, name).heat_capacity for name in HEAT_CAPACITIES}
    assert all(math.isfinite(v) and v > 0 for v in values.values())
    assert values["entropy_variance"] == pytest.approx(values["entropy_susceptibility"], rel=1e-3)
    # a rank-one 2RDM has one occupied level: zero heat capacity, participation ratio 1
    v = rng.normal(size=12)
    one = spectrum(np.outer(v, v))
    assert one.participation_ratio == pytest.approx(1.0)
    assert one.heat_capacity == pytest.approx(0.0, abs=1e-6)


def test_federated_rounds_are_checkpoints(tmp_path):
    from clients.config import load_experiment
    from server.engines.inline import run_inline

    overrides = [
        "engine=inline", "rounds=3", f"output.dir={tmp_path}", "clients.num=2",
        "workload.params.init_scale=0.3", "workload.params.local_steps=10",
    ]  # fmt: skip
    losses: list[float] = []
    first = run_inline(
        load_experiment("two-rdm", overrides),
        on_round=lambda r, m: losses.append(m["central.loss"]),
    )["metrics"]
    second = run_inline(load_experiment("two-rdm", overrides))["metrics"]
    for key in ("train.dyn_pr", "train.gauss_pr", "train.dyn_shc", "central.rounds_pr"):
        assert math.isfinite(first[key]) and first[key] >= 1.0 - 1e-9
    assert losses[-1] < losses[0]  # FedAvg of the local steps trains the shared network

    def stable(m):
        return {k: v for k, v in m.items() if not k.startswith("time")}

    assert stable(first) == stable(second)  # same seed, same result
