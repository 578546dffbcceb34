"""Claim tests of the DP audit (``dp.epsilon_audit_step``), per DP code path: DP-SGD through Opacus
(classifier workloads) and through ``privatize`` (tabular diffusion), Flower's local DP mod, and
central DP with client- and server-side clipping.

(a) With the noise in place the audited lower bound stays below the accountant's epsilon of the
audited step (at the audit's 95 % confidence; 3 seeds). (b) With the noise removed inside the real
code path -- the accountant still reporting its epsilon -- the audit's bound exceeds that epsilon:
the mutant is exposed. Measured numbers: docs/methods/dp-sgd.md and flower-dp.md, "Auditing"."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from flowerbed.clients.core.dp_audit import AUTO, epsilon_lower_bound, trials_for
from flowerbed.clients.defenses import DefenseContext, dp_sgd
from flowerbed.clients.defenses.central_dp import CentralDp
from flowerbed.clients.defenses.dp_sgd import OPACUS, PER_SAMPLE, DpSgd, step_epsilon
from flowerbed.clients.defenses.local_dp import LocalDp

CFG = DefenseContext(seed=0, rounds=1, num_clients=3, sampled_clients=3, run_key="audit")
SEEDS = (0, 1, 2)


def _dp_sgd(trials: int) -> DpSgd:
    return DpSgd({"noise_multiplier": 4.0, "max_grad_norm": 0.5, "audit_trials": trials}, CFG)


def _central(clipping: str, trials: int) -> CentralDp:
    params = {"noise_multiplier": 4.0, "clipping_norm": 0.5, "clipping": clipping, "audit_trials": trials}  # fmt: skip
    return CentralDp(params, CFG)


def _local(trials: int) -> LocalDp:
    return LocalDp({"clipping_norm": 0.5, "sensitivity": 0.5, "epsilon": 2.0, "audit_trials": trials}, CFG)  # fmt: skip


def _no_torch_noise(shape, std, generator, dtype):  # noqa: ANN001, ANN202
    return torch.zeros(shape, dtype=dtype)


def _no_opacus_noise(std, reference, generator=None, secure_mode=False):  # noqa: ANN001, ANN202
    return torch.zeros_like(reference)


def _no_flower_noise(arrays, std_dev):  # noqa: ANN001, ANN202
    return None


# the real noise source of each path, and how a mutant removes it (epsilon is still reported)
PATHS = {
    "dp-sgd/per-sample": (lambda t: _dp_sgd(t), PER_SAMPLE,
                          [(dp_sgd, "gaussian_noise", _no_torch_noise)]),
    "dp-sgd/opacus": (lambda t: _dp_sgd(t), OPACUS,
                      [("opacus.optimizers.optimizer", "_generate_noise", _no_opacus_noise)]),
    "local-dp": (lambda t: _local(t), "",
                 [("flwr.clientapp.mod.localdp_mod", "add_gaussian_noise_inplace", _no_flower_noise)]),
    "central-dp/client": (lambda t: _central("client", t), "",
                          [("flwr.serverapp.strategy.dp_fixed_clipping", "add_gaussian_noise_inplace", _no_flower_noise)]),
    "central-dp/server": (lambda t: _central("server", t), "",
                          [("flwr.serverapp.strategy.dp_fixed_clipping", "add_gaussian_noise_inplace", _no_flower_noise)]),
}  # fmt: skip


def test_clopper_pearson_bound_is_zero_without_signal_and_capped_by_trials():
    rng = np.random.default_rng(0)
    same = epsilon_lower_bound(rng.normal(size=400), rng.normal(size=400), 1e-5)
    assert same.epsilon == 0.0  # identical distributions: no evidence of any epsilon
    separated = epsilon_lower_bound(np.ones(400), np.zeros(400), 1e-5)
    assert separated.epsilon == pytest.approx(separated.epsilon_max)
    assert 4.0 < separated.epsilon_max < 4.5  # ln((1 - a) / a') with a = 1 - (0.05 / 16) ** (1/400)


@pytest.mark.parametrize("path", list(PATHS))
def test_audit_stays_below_the_accountant_with_noise(path):
    make, route, _ = PATHS[path]
    for seed in SEEDS:
        out = make(100).audit(route, seed)
        assert out["epsilon_audit_step"] <= out["epsilon_step"], (path, seed, out)
        assert (
            out["epsilon_audit_step_max"] > out["epsilon_step"]
        )  # the audit could have exposed it


@pytest.mark.parametrize("path", list(PATHS))
def test_audit_exposes_the_noise_removed_from_its_code_path(path, monkeypatch):
    make, route, mutants = PATHS[path]
    for target, name, replacement in mutants:
        module = importlib.import_module(target) if isinstance(target, str) else target
        monkeypatch.setattr(module, name, replacement)
    out = make(100).audit(route, 0)
    assert out["epsilon_audit_step"] > out["epsilon_step"], (path, out)


def test_automatic_trials_are_enough_to_expose_the_accountant_epsilon():
    assert trials_for(AUTO, step_epsilon(1.0, 1e-5), 1e-5) == 1000  # 4.73 < 5.15 (500: 4.46)
    assert trials_for(AUTO, step_epsilon(4.0, 1e-5), 1e-5) == 100  # 1.01 < 2.82
    assert trials_for(AUTO, float("inf"), 1e-5) == 100  # nothing promised, nothing to expose
    assert trials_for(300, 1.0, 1e-5) == 300 and trials_for(0, 1.0, 1e-5) == 0


def test_audit_trials_zero_turns_it_off():
    assert "epsilon_audit_step" not in _dp_sgd(0).audit(PER_SAMPLE, 0)
    assert "epsilon_audit_step" not in _central("server", 0).audit("", 0)


def _summary(inline_cfg, defenses: str) -> dict[str, float]:
    from flowerbed.apps.inline import run_inline

    cfg = inline_cfg("quickstart", "rounds=1", "clients.num=2", "dataset.max_rows=1000",
                     "output.plots=false", f"defenses={defenses}")  # fmt: skip
    return run_inline(cfg)["metrics"]


OPACUS_RUN = "[{name: dp-sgd, params: {noise_multiplier: 4.0, audit_trials: 100}}]"


def test_run_summary_has_the_audit_beside_the_accountant(inline_cfg):
    """tabular-mlp trains through Opacus; its run summary audits that path."""
    metrics = _summary(inline_cfg, OPACUS_RUN)
    assert 0 < metrics["dp.epsilon"] < metrics["dp.epsilon_step"]  # subsampled, amplified
    assert metrics["dp.epsilon_audit_step"] <= metrics["dp.epsilon_step"]
    assert metrics["dp.audit_trials"] == 100


def test_run_summary_exposes_a_run_whose_optimizer_adds_no_noise(inline_cfg, monkeypatch):
    """Opacus' noise removed for the whole run (training and audit); the accountant still
    reports its epsilon, and the audit in the same summary exceeds it."""
    monkeypatch.setattr(importlib.import_module("opacus.optimizers.optimizer"), "_generate_noise",
                        _no_opacus_noise)  # fmt: skip
    metrics = _summary(inline_cfg, OPACUS_RUN)
    assert metrics["dp.epsilon_audit_step"] > metrics["dp.epsilon"] > 0
