"""Defenses against Goliath on a fixed small case: more DP noise or a smaller top-k fraction
lowers the attack's TabLeak cell accuracy (the mechanism the attack-vs-defense sweep measures)."""

import pytest

from flowerbed.apps.inline import run_inline

BASE = ["rounds=1", "clients.num=2", "attack.params.target_clients=[0]", "attack.params.iterations=10",
        "output.plots=false"]  # fmt: skip


def _accuracy(inline_cfg, defenses: str) -> float:
    summary = run_inline(inline_cfg("goliath-adult-mixed", *BASE, f"defenses={defenses}"))
    return summary["metrics"]["attack.cell_accuracy"]


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
