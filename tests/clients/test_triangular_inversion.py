"""Triangular inversion for DeltaNet: exactness of every inverse, and the low-precision claim."""

from __future__ import annotations

import math

import pytest
import torch

from flowerbed.clients.workloads.triangular_inversion import (
    METHODS,
    delta_keys,
    delta_rule_chunked,
    delta_rule_recurrent,
    growth_flagged,
    invert_unit_lower,
    log_decays,
    make_A,
    make_recall,
    neumann_growth,
    reference_inverse,
    relative_error,
)

torch.set_num_threads(1)


def _sequence(dtype: torch.dtype, gated: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    bsz, length, dim = 2, 64, 16
    q = delta_keys(bsz, length, dim, 0.0, g)
    k = delta_keys(bsz, length, dim, 0.0, g)
    v = torch.randn(bsz, length, dim, generator=g, dtype=torch.float64)
    beta = torch.rand(bsz, length, generator=g, dtype=torch.float64)
    decay = log_decays(bsz, length, g) if gated else None
    cast = lambda x: None if x is None else x.to(dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), cast(beta), cast(decay)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("method", list(METHODS))
def test_chunked_equals_recurrent(method: str, gated: bool) -> None:
    for dtype, precision, tol in [(torch.float64, "fp64", 1e-10), (torch.float32, "fp32", 1e-4)]:
        q, k, v, beta, decay = _sequence(dtype, gated)
        ref = delta_rule_recurrent(q, k, v, beta, decay)
        out = delta_rule_chunked(q, k, v, beta, decay, chunk=32, method=method, precision=precision)
        assert (out - ref).abs().max() / ref.abs().max() < tol


def test_chunked_with_wrong_inverse_disagrees() -> None:
    """The comparison above can fail: dropping the inverse (T = diag(beta)) breaks the equality."""
    q, k, v, beta, _ = _sequence(torch.float64, False)
    ref = delta_rule_recurrent(q, k, v, beta)
    import flowerbed.clients.workloads.triangular_inversion as ti

    saved = ti.METHODS["fwd"]
    ti.METHODS["fwd"] = lambda lower: torch.eye(lower.shape[-1], dtype=lower.dtype).expand_as(lower)
    try:
        out = delta_rule_chunked(q, k, v, beta, chunk=32, method="fwd", precision="fp64")
    finally:
        ti.METHODS["fwd"] = saved
    assert (out - ref).abs().max() / ref.abs().max() > 1e-3


@pytest.mark.parametrize("gated", [False, True])
def test_fp64_agrees_with_inv(gated: bool) -> None:
    for corr in (0.0, 0.5):
        a = make_A(64, 64, 64, corr, gated=gated, seed=1)
        inv = torch.linalg.inv(torch.eye(64, dtype=torch.float64) + a)
        for method in METHODS:
            err = relative_error(invert_unit_lower(a, method, "fp64"), inv).max()
            if method == "neumann":
                if corr == 0.0:
                    assert err < 1e-8
            else:
                assert err < 1e-12, (method, corr, float(err))


def test_newton_schulz_refines_a_perturbed_inverse() -> None:
    a = make_A(32, 64, 64, 0.5, seed=2)
    ref = reference_inverse(a)
    rough = invert_unit_lower(a, "blocked", "fp32")
    refined = invert_unit_lower(a, "blocked", "fp32", refine=1).to(torch.float64)
    from flowerbed.clients.workloads.triangular_inversion import newton_schulz

    noisy = ref + 1e-3 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(0)).tril(-1)
    once = newton_schulz(a, noisy, 1)
    assert relative_error(once, ref).max() < 1e-2 * relative_error(noisy, ref).max()
    assert relative_error(refined, ref).median() < 3 * relative_error(rough, ref).median()


def test_bf16_blocked_keeps_forward_substitution_accuracy_neumann_blows_up() -> None:
    a = make_A(256, 64, 64, 0.5, seed=0)
    ref = reference_inverse(a)
    err = {m: relative_error(invert_unit_lower(a, m, "bf16"), ref).median() for m in METHODS}
    assert err["blocked"] <= 1.5 * err["fwd"]
    assert err["blocked-neumann8"] <= 1.5 * err["fwd"]
    assert err["neumann"] >= 100 * err["fwd"]
    # same matrices at corr 0: Neumann is as good as the others, so the failure is the growth
    a0 = make_A(256, 64, 64, 0.0, seed=0)
    ref0 = reference_inverse(a0)
    err0 = {m: relative_error(invert_unit_lower(a0, m, "bf16"), ref0).median() for m in METHODS}
    assert err0["neumann"] <= 1.5 * err0["fwd"]


def test_fp16_neumann_at_corr_09_nonfinite_or_flagged() -> None:
    a = make_A(256, 64, 64, 0.9, seed=0)
    x = invert_unit_lower(a, "neumann", "fp16")
    growth = neumann_growth(a)
    bad = ~torch.isfinite(x).all(-1).all(-1) | growth_flagged(growth, "fp16")
    assert bad.float().mean() > 0.5
    # the monitor stays quiet where Neumann is fine (near-orthogonal keys)
    assert not growth_flagged(neumann_growth(make_A(256, 64, 64, 0.0, seed=0)), "fp16").any()
    assert math.isfinite(
        float(relative_error(invert_unit_lower(a, "blocked", "fp16"), reference_inverse(a)).max())
    )


def test_recall_task_targets_are_bound_values() -> None:
    data = make_recall(8, 32, 16, 16, 6, seed=0)
    for tokens, targets in zip(data.tokens, data.targets, strict=True):
        bindings = dict(zip(tokens[0:12:2].tolist(), tokens[1:12:2].tolist(), strict=True))
        for pos in (targets >= 0).nonzero().flatten().tolist():
            assert bindings[int(tokens[pos])] == int(targets[pos])


def test_federated_inline_run(tmp_path) -> None:
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    cfg = load_experiment(
        "triangular-inversion",
        ["engine=inline", "rounds=3", "clients.num=2", f"output.dir={tmp_path}", "output.plots=false",
         "workload.params.local_steps=12", "workload.params.train_size=64",
         "workload.params.test_size=32"],
    )  # fmt: skip
    summary = run_inline(cfg)
    assert summary["failures"] == 0
    metrics = summary["metrics"]
    assert metrics["eval.inv_err_median"] < 1e-2  # bf16 blocked on the clients' real A
    assert metrics["eval.growth_max"] > 0 and metrics["train.diverged"] == 0
    # the FedAvg'd model learns recall (seeds 0/1/2: 0.107 / 0.119 / 0.143; chance 1/16; a server
    # that skips aggregation leaves the initial model at 0.000-0.006)
    assert metrics["eval.recall_accuracy"] >= 0.08


def test_differentiable_path_matches_and_backpropagates() -> None:
    """Training differentiates through the inverses; gradients match LAPACK's (autograd) solve."""
    a = make_A(4, 32, 16, 0.5, seed=3)
    weights = torch.randn(
        4, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    ref_in = a.clone().requires_grad_(True)
    (reference_inverse(ref_in) * weights).sum().backward()
    for method in METHODS:
        x_in = a.clone().requires_grad_(True)
        x = invert_unit_lower(x_in, method, "fp64")
        (x * weights).sum().backward()
        assert (x.detach() - reference_inverse(a)).abs().max() < 1e-10
        assert (x_in.grad.tril(-1) - ref_in.grad.tril(-1)).abs().max() < 1e-8, method
