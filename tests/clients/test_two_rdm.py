"""2RDM: early warning, participation ratio and interpretable eigenvectors on a deep linear network."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flowerbed.clients.workloads.two_rdm import (
    HEAT_CAPACITIES,
    DLNConfig,
    abs_corr,
    at_step,
    dln_gaussian_2rdm,
    dln_loss_gradients,
    dln_sgd_step,
    early_warnings,
    init_dln,
    make_teacher,
    rise_above_recent_minimum,
    run_dln,
    spectrum,
    teacher_data,
    transition_steps,
)


@pytest.fixture(scope="module")
def dln():
    """Langevin saddle-to-saddle run (the mechanism) and its ablation, minibatch SGD (batch 256)
    on the same teacher: minibatch noise scales with the unlearned residual."""
    torch.set_num_threads(1)
    traces = {}
    for name, config in (("langevin", DLNConfig(seed=0)),
                         ("sgd", DLNConfig(seed=0, batch_size=256, steps=6500))):  # fmt: skip
        trace = run_dln(config)
        traces[name] = (trace, transition_steps(trace), early_warnings(trace, decades=2.0))
    return traces


def test_transitions_are_sequential(dln):
    for trace, steps, _ in dln.values():
        assert steps[0] < steps[1] < steps[2]
        assert trace.loss[-1] < 1e-3 * trace.loss[0]


def test_trace_rises_before_each_loss_drop(dln):
    trace, steps, warnings = dln["langevin"]
    margins = [w.margin for w in warnings]
    print("early-warning margins (steps):", margins)
    # log10 tr C is >= 2 decades above its minimum since the previous transition, and stays so,
    # >= 150 steps before the loss has fallen 5 % of each drop
    for w in warnings:
        assert w.warning_step is not None and w.margin >= 150, w
        assert w.rise_at_loss_moved >= 4.0, w
        assert w.loss_moved_step < w.transition_step
    # ablation: with minibatch noise the fluctuations of the learned modes bury drops 1 and 2
    _, _, sgd = dln["sgd"]
    assert all(w.warning_step is None and w.rise_at_loss_moved < 1.5 for w in sgd[1:]), sgd


def test_no_false_alarm_after_convergence(dln):
    trace, _, _ = dln["langevin"]
    converged = trace.log_trace[trace.steps >= 0.75 * trace.steps[-1]]
    assert rise_above_recent_minimum(converged).max() < 2.0


def test_participation_ratio_low_at_transitions_high_after_convergence(dln):
    def ratios(trace, steps):
        at = [float(np.median(at_step(trace, trace.participation_ratio, s))) for s in steps]
        converged = np.median(trace.participation_ratio[trace.steps >= 0.75 * trace.steps[-1]])
        return at, float(converged)

    at_transition, converged = ratios(*dln["langevin"][:2])
    assert max(at_transition) <= 1.1, at_transition
    assert converged >= 3.0
    # ablation: under minibatch noise the later transitions are no longer one-dimensional
    sgd_at, _ = ratios(*dln["sgd"][:2])
    assert max(sgd_at[1:]) > 1.3, sgd_at


def test_top_eigenvector_aligns_with_the_mode_being_learned(dln):
    def corrs(trace, s):
        vectors = at_step(trace, trace.top_vectors, s)
        return [float(np.median([abs_corr(v, sig) for v in vectors])) for sig in trace.signatures.T]

    trace, steps, warnings = dln["langevin"]
    for m, s in enumerate(steps):
        corr = corrs(trace, s)
        assert corr[m] >= 0.9, (m, corr)
        assert max(c for k, c in enumerate(corr) if k != m) < 0.5, (m, corr)
        # already at the warning, hundreds of steps earlier, it names the mode that is coming
        v = at_step(trace, trace.top_vectors, warnings[m].warning_step, half_width=0)[0]
        early = [abs_corr(v, sig) for sig in trace.signatures.T]
        assert early[m] >= 0.9 and max(c for k, c in enumerate(early) if k != m) < 0.5, early
    # ablations: under minibatch noise the last mode is missed; a random covariance aligns with none
    sgd, sgd_steps, _ = dln["sgd"]
    assert corrs(sgd, sgd_steps[2])[2] < 0.9
    rng = np.random.default_rng(0)
    increments = rng.normal(size=(DLNConfig().window, trace.signatures.shape[0]))
    top = spectrum(increments.T @ increments).eigenvectors[:, 0]
    assert max(abs_corr(top, sig) for sig in trace.signatures.T) < 0.9


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
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

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
