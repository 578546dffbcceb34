"""Claim tests of the client-side defenses against the unaware Goliath on a fixed small case: DP-SGD
noise, a small top-k fraction, 2-bit quantisation and Flower's local DP each lower the attack's
TabLeak cell accuracy far below the undefended 1.0 (the mechanism the attack-vs-defense sweep
measures). Each fails when its defense is replaced by the identity (docs/methods, mutants)."""

import pytest

from flowerbed.apps.inline import run_inline

BASE = ["rounds=1", "clients.num=2", "attack.params.target_clients=[0]", "attack.params.iterations=10",
        "output.plots=false"]  # fmt: skip


def _accuracy(inline_cfg, defenses: str) -> float:
    summary = run_inline(inline_cfg("goliath-adult-mixed", *BASE, f"defenses={defenses}"))
    metrics = summary["metrics"]
    if "dp.epsilon" in metrics:  # DP runs audit their code path (tests/clients/test_dp_audit.py)
        assert metrics["dp.epsilon_audit_step"] <= metrics["dp.epsilon_step"]
    return metrics["attack.cell_accuracy"]


@pytest.fixture(scope="module")
def undefended(tmp_path_factory):
    from flowerbed.server.experiment import load_experiment

    out = tmp_path_factory.mktemp("undefended")
    cfg = load_experiment("goliath-adult-mixed", ["engine=inline", f"output.dir={out}", *BASE])
    return run_inline(cfg)["metrics"]["attack.cell_accuracy"]


def test_dp_sgd_noise_lowers_goliath(inline_cfg, undefended):
    noisy = _accuracy(
        inline_cfg, "[{name: dp-sgd, params: {noise_multiplier: 2.0, max_grad_norm: 1.0}}]"
    )
    assert undefended > 0.9
    assert noisy < undefended - 0.2


def test_smaller_topk_lowers_goliath(inline_cfg, undefended):
    dense = _accuracy(inline_cfg, "[{name: topk, params: {fraction: 1.0}}]")
    sparse = _accuracy(inline_cfg, "[{name: topk, params: {fraction: 0.001}}]")
    assert dense == pytest.approx(undefended)
    assert sparse < dense - 0.2


def test_two_bit_quantisation_lowers_goliath(inline_cfg, undefended):
    fine = _accuracy(inline_cfg, "[{name: quantize, params: {bits: 16}}]")
    coarse = _accuracy(inline_cfg, "[{name: quantize, params: {bits: 2}}]")
    assert fine > 0.9  # 16 bits: the closed form still reads the update
    assert coarse < undefended - 0.2


def test_flower_local_dp_lowers_goliath(inline_cfg, undefended):
    noisy = _accuracy(inline_cfg, "[{name: local-dp, params: {clipping_norm: 1.0, epsilon: 1.0}}]")
    assert noisy < undefended - 0.2
