"""Engines: quickstart learns, failures are injected and survived, inline == simulation."""

import json

import psutil
import pytest

from flowerbed.apps.inline import run_inline


def test_quickstart_beats_majority_by_five_points(inline_cfg):
    summary = run_inline(inline_cfg("quickstart"))
    metrics = summary["metrics"]
    assert metrics["central.accuracy"] >= metrics["central.majority_accuracy"] + 0.05
    assert summary["failures"] == 0


def test_failure_injection_run_completes_and_reports(inline_cfg):
    summary = run_inline(inline_cfg("quickstart", "clients.failure_rate=0.3", "rounds=3"))
    per_round = summary["failures_per_round"]
    assert len(per_round) == 3 and sum(per_round) == summary["failures"] > 0
    assert all(f < 10 for f in per_round)
    assert summary["metrics"]["central.accuracy"] > summary["metrics"]["central.majority_accuracy"]


def test_same_seed_same_result_and_seed_matters(inline_cfg):
    a = run_inline(inline_cfg("quickstart", "rounds=1", "clients.num=4"))["metrics"]
    b = run_inline(inline_cfg("quickstart", "rounds=1", "clients.num=4"))["metrics"]
    c = run_inline(inline_cfg("quickstart", "rounds=1", "clients.num=4", "seed=1"))["metrics"]
    assert a["central.accuracy"] == b["central.accuracy"]
    assert a["central.loss"] != c["central.loss"]


def test_fraction_sampling_and_dirichlet(inline_cfg):
    summary = run_inline(
        inline_cfg(
            "quickstart",
            "clients.num=20",
            "clients.fraction=0.25",
            "rounds=2",
            "clients.partitioner=dirichlet",
            "clients.alpha=0.3",
        )  # fmt: skip
    )
    assert summary["metrics"]["central.accuracy"] > 0.7


def _strip_timing(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith("time.")}


def _carrying(home: str) -> list[psutil.Process]:
    """Live processes whose environment points at ``home`` (the engine's private FLWR_HOME):
    exactly the processes that engine started, whoever else runs Flower on the machine."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("FLWR_HOME") == home and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def test_inline_and_simulation_agree(inline_cfg, monkeypatch):
    """The same experiment and seed give the same final metrics on both engines (Ray, flwr run),
    and the simulation engine leaves none of the processes it started running."""
    from flowerbed.server.engines import simulation
    from flowerbed.server.results import default_run_dir

    homes: list[str] = []
    flower_env = simulation.flower_env

    def recording_env(home):  # noqa: ANN001, ANN202
        env = flower_env(home)
        homes.append(env["FLWR_HOME"])
        return env

    monkeypatch.setattr(simulation, "flower_env", recording_env)
    cfg = inline_cfg("quickstart", "rounds=2", "clients.num=4")
    inline = run_inline(json.loads(json.dumps(cfg)))
    cfg["engine"] = "simulation"
    simulated = simulation.run_simulation(cfg, default_run_dir(cfg))
    assert _strip_timing(simulated["metrics"]) == pytest.approx(
        _strip_timing(inline["metrics"]), abs=1e-6
    )
    assert len(homes) == 1
    leftovers = _carrying(homes[0])
    assert not leftovers, f"the simulation engine left {[p.pid for p in leftovers]} running"
