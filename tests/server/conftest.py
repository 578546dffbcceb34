"""Shared fixtures of the server tests: a two-node loopback Ray cluster (one per module that asks
for it: tests/server/test_ray_run.py; each test looks only at the actors its own run started),
Flower's own simulation set-up in this process."""

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


@pytest.fixture(scope="module")
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


@pytest.fixture
def flower_simulation():
    """``make(nodes, state_cls)``: Flower's own simulation set-up in this process, no Ray: its
    in-memory link state (of ``state_cls``), ``nodes`` virtual nodes registered by
    ``vce_api._register_nodes``, one run and its Grid. Returns (state, grid, {node id:
    partition id} as Flower registered them)."""
    from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
    from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState, RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid

    def make(nodes: int, state_cls: type = InMemoryLinkState):
        federation = NoOpFederationManager()
        factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, federation, ObjectStoreFactory())
        factory.state_instance = state_cls(federation, ObjectStoreFactory().store())
        mapping = _register_nodes(nodes, factory)
        run = Run.create_empty(7)
        run.primary_task_id, run.federation_id = 9, NOOP_FEDERATION_ID
        factory.state().run_ids[7] = RunRecord(run=run)
        factory.state().task_store[9] = Task(task_id=9, run_id=7)
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 7, 9, 1
        grid = InMemoryGrid(state_factory=factory)
        grid.set_run(run)
        return factory.state(), grid, mapping

    return make
