"""Loopback federation: TLS + SuperNode auth, quickstart on it, refusals, clean teardown."""

import json
import subprocess
import time

import psutil
import pytest

from flowerbed.server import deploy
from flowerbed.server.engines.deployment import run_deployment
from flowerbed.server.experiment import load_experiment
from flowerbed.server.processes import flower_env, stop_process_tree


def _flower_procs(directory) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "flower-super" in cmd and str(directory) in cmd:
            found.append(proc)
    return found


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fed")
    state = deploy.up(2, directory)
    yield state
    deploy.down(directory)


def _refused(cmd: list[str], directory, name: str) -> str:
    """Run a SuperNode in the same environment ``deploy.up`` gives its own, expect it to give up."""
    log = directory / f"{name}.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=flower_env(directory), stdout=fh, stderr=subprocess.STDOUT)
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        stop_process_tree(proc.pid)
        pytest.fail(f"{name}: a SuperNode that should be refused kept running: {log.read_text()}")
    return f"exit {code}: {log.read_text()}"


def test_quickstart_on_tls_federation_matches_inline(federation, tmp_path):
    from flowerbed.apps.inline import run_inline

    overrides = ["clients.num=2", "rounds=1", f"deployment.dir={federation['dir']}"]
    cfg = load_experiment("quickstart", [*overrides, "engine=deployment", f"output.dir={tmp_path}"])
    run_dir = tmp_path / "deployed"
    summary = run_deployment(cfg, run_dir)
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "report.md"):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "summary.json").read_text())["engine"] == "deployment"
    inline = run_inline(
        load_experiment("quickstart", [*overrides, "engine=inline", f"output.dir={tmp_path}/i"])
    )
    assert summary["metrics"]["central.accuracy"] == pytest.approx(
        inline["metrics"]["central.accuracy"], abs=1e-6
    )


def test_unregistered_key_is_refused(federation, tmp_path):
    key = tmp_path / "stranger"
    deploy.make_node_key(key)
    state = dict(federation, node_ports=[deploy.free_port()])
    cmd = deploy.supernode_command(state, 0, key, insecure=False)
    outcome = _refused(cmd, tmp_path, "stranger")
    assert "exit 0" not in outcome, outcome
    assert "Failed to activate SuperNode" in outcome, outcome


def test_insecure_supernode_cannot_talk_to_tls_superlink(federation, tmp_path):
    state = dict(federation, node_ports=[deploy.free_port()])
    cmd = deploy.supernode_command(state, 0, None, insecure=True)
    outcome = _refused(cmd, tmp_path, "insecure")
    assert "exit 0" not in outcome, outcome
    assert "Failed to initialize the connection to the SuperLink" in outcome, outcome


def test_down_leaves_no_process(tmp_path):
    state = deploy.up(1, tmp_path, insecure=True)
    pids = list(state["pids"].values())
    assert all(psutil.pid_exists(p) for p in pids)
    deploy.down(tmp_path)
    time.sleep(0.5)
    alive = [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert not alive
    assert not _flower_procs(tmp_path)
