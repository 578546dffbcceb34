"""Shared fixtures of the server tests: a two-node loopback Ray cluster (one for the session:
tests/server/test_ray_run.py and test_ray_sweep.py both use it; each test looks only at the
actors its own run started)."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from flowerbed.server.processes import free_port, stop_process_tree


def ray_root() -> str | None:
    """Ray's socket paths are length-limited: keep its directories short (RAY_TMPDIR or /tmp)."""
    return os.environ.get("RAY_TMPDIR") or None


@pytest.fixture(scope="session")
def two_nodes(tmp_path_factory):
    """A loopback Ray cluster: a head and a second node (1 CPU each, own custom resource, own
    temp dir, ports from free_port), started with ``ray start`` and stopped by PID; its
    ``HOST:PORT``."""
    logs = tmp_path_factory.mktemp("cluster")
    temp = Path(tempfile.mkdtemp(prefix="fb2-", dir=ray_root()))
    port = free_port()
    ray_bin = str(Path(sys.executable).parent / "ray")
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
              "--dashboard-agent-listen-port"]  # fmt: skip
    head = [ray_bin, "start", "--head", "--port", str(port), "--temp-dir", str(temp),
            "--include-dashboard", "false", "--disable-usage-stats", *common, str(free_port()),
            "--resources", '{"head_node": 1}']  # fmt: skip
    second = [ray_bin, "start", "--address", f"127.0.0.1:{port}", *common, str(free_port()),
              "--resources", '{"second_node": 1}']  # fmt: skip
    procs: list[subprocess.Popen] = []
    try:
        _start(head, logs / "head.log", procs)
        _start(second, logs / "second.log", procs)
        yield f"127.0.0.1:{port}"
    finally:
        for proc in reversed(procs):
            stop_process_tree(proc.pid)
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _start(command: list[str], log_path: Path, procs: list, attempts: int = 3) -> None:
    """``ray start --block`` until it reports the node up. On a loaded machine a node can miss
    Ray's fixed 30 s registration wait and exit; it is started again (the GCS keeps running)."""
    for attempt in range(attempts):
        with log_path.open("w") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        if _wait_for(log_path, "Ray runtime started", proc) or attempt == attempts - 1:
            assert proc.poll() is None, log_path.read_text()[-2000:]
            return
        stop_process_tree(proc.pid)
        proc.wait()
        procs.remove(proc)


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float = 180) -> bool:
    """Whether ``text`` appeared in ``log`` while ``proc`` ran (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.3)
    return True
