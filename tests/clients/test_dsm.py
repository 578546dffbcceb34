"""DSM: on-trajectory memorisation detection matches the curvature baseline at zero extra cost."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flowerbed.clients.workloads.dsm import (
    CondData,
    Denoiser,
    Schedule,
    audit,
    make_conditions,
    sample_ddim,
    train_denoiser,
)

torch.set_num_threads(1)

DUP, HIDDEN, STEPS = (
    16,
    256,
    1600,
)  # stronger duplication than the benchmark (dup 4) to fit the budget


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    x, cond, memorised, _ = make_conditions(0, dup=DUP)
    data = CondData(torch.from_numpy(x), torch.from_numpy(cond), memorised, len(memorised))
    schedule = Schedule()
    model = Denoiser(data.n_cond, HIDDEN)
    train_denoiser(model, data, STEPS, 0, schedule, lr=3e-3)
    return model, schedule, memorised, x


def test_dsm_detects_memorisation_at_the_first_step_like_the_curvature_baseline(trained):
    model, schedule, memorised, x = trained
    res = audit(model, np.arange(len(memorised)), memorised, schedule, seed=1, train_x=x)
    assert res["auroc_dsm_step0"] >= 0.85
    assert res["auroc_dsm_step0"] >= res["auroc_hess_step0"] - 0.05
    # memorised conditions reproduce their training image; general ones do not
    assert res["nn_dist_mem"] < res["nn_dist_gen"]
    # cost: DSM is free, the curvature baseline is not
    assert res["extra_forward_dsm"] == 0
    assert res["forward_calls_dsm_on"] == res["forward_calls_dsm_off"] == 2 * 50
    assert res["extra_forward_hess"] == 2 and res["extra_backward_hess"] == 2


def test_dsm_is_exactly_zero_without_guidance(trained):
    model, schedule, memorised, _ = trained
    cond = torch.arange(len(memorised))
    off = sample_ddim(model, cond, schedule, seed=3, sample_steps=10, guided=False)
    assert torch.equal(off.dsm, torch.zeros_like(off.dsm))
    on = sample_ddim(model, cond, schedule, seed=3, sample_steps=10, guided=True)
    assert bool((on.dsm > 0).all())


def test_forward_calls_do_not_depend_on_dsm():
    model = Denoiser(5, 16)
    cond = torch.arange(5)
    for track in (True, False):
        before = model.forward_calls
        sample_ddim(model, cond, Schedule(), seed=0, sample_steps=7, track_dsm=track)
        assert model.forward_calls - before == 14


def test_federated_run_reports_per_client_auroc(tmp_path):
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    overrides = [
        "engine=inline", "rounds=2", "clients.num=2", f"output.dir={tmp_path}",
        "workload.params.hidden=32", "workload.params.local_steps=5",
        "workload.params.per_condition=2", "workload.params.sample_steps=4",
    ]  # fmt: skip
    summary = run_inline(load_experiment("dsm", overrides))
    metrics = summary["metrics"]
    text = str(summary)
    for key in ("client0_auroc_dsm_step0", "client1_auroc_hess_step0", "auroc_dsm_step0"):
        assert key in text
    assert all(0.0 <= v <= 1.0 for k, v in metrics.items() if "auroc" in k)
