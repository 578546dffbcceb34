"""The model-stealing attack on the federated path: FedAvg victim, release defenses, attacker."""

from __future__ import annotations

import pytest

from flowerbed.apps.inline import run_inline
from flowerbed.clients.core.config import Experiment
from flowerbed.clients.core.errors import ConfigError

TINY = [
    "rounds=2", "clients.num=2", "workload.params.train_size=400", "workload.params.local_epochs=5",
    "workload.params.lr=0.01",
    "attack.params.steps=60", "attack.params.q=0.1",
]  # fmt: skip


def _run(inline_cfg, defenses: str) -> dict[str, float]:
    return run_inline(inline_cfg("filosofer", *TINY, f"defenses={defenses}"))["metrics"]


def test_release_defenses_through_a_federated_run(inline_cfg):
    none = _run(inline_cfg, "[]")
    filo = _run(inline_cfg, "[{name: filosofer}]")
    whole = _run(inline_cfg, "[{name: whole-model-tee}]")
    # everyone attacks the same victim with the same data
    assert none["attack.victim_accuracy"] == filo["attack.victim_accuracy"] >= 0.8
    assert none["attack.blackbox_accuracy"] == filo["attack.blackbox_accuracy"]
    # no defense: the exposed weights are the victim, the attacker keeps them as they are
    assert none["attack.exposed_accuracy"] == none["attack.victim_accuracy"]
    assert none["attack.surrogate_accuracy"] >= none["attack.victim_accuracy"]
    # FILOsofer: broken exposed model, small TEE, user accuracy back, surrogate below none
    assert filo["attack.exposed_accuracy"] <= 0.35
    assert filo["attack.tee_param_fraction"] <= 0.10
    assert filo["attack.user_accuracy"] >= filo["attack.exposed_accuracy"] + 0.3
    assert filo["attack.surrogate_accuracy"] < none["attack.surrogate_accuracy"]
    # whole model in the TEE: the attacker is exactly the black-box baseline
    assert whole["attack.surrogate_accuracy"] == whole["attack.blackbox_accuracy"]
    assert whole["attack.tee_flop_fraction"] == 1.0
    assert "attack.exposed_accuracy" not in whole


def test_model_stealing_needs_the_filosofer_workload(inline_cfg):
    with pytest.raises(ConfigError, match="needs model-release.*workloads that do: filosofer"):
        inline_cfg("quickstart", "attack.name=model-stealing")


def test_adaptive_stealing_reads_the_flip_fraction_from_the_published_mechanism(inline_cfg):
    from flowerbed.clients.defenses.filosofer import DEFAULT_RHO
    from flowerbed.clients.workloads import build_workload
    from flowerbed.server.wrappers import build_attack

    def rho(cfg: Experiment) -> float:
        attack, _ = build_attack(cfg, build_workload(cfg))
        return attack.wrap(None, None, None).hooks.params.rho

    assert rho(inline_cfg("filosofer", "defenses=[{name: filosofer, params: {rho: 0.05}}]")) == 0.05
    # shield-last-layer publishes no flips
    assert rho(inline_cfg("filosofer", "defenses=[{name: shield-last-layer}]")) == DEFAULT_RHO
