"""The warm SuperExec's pieces on their own: the zygote's forks, the executor's routing."""

import json
import os
import random
import signal
import time
from pathlib import Path

import numpy
import psutil
import pytest
from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResult

from flowerbed.apps.superexec import WarmExecutor, Zygote


def record_task(request: dict) -> int:
    """A zygote task for these tests: write what this process is, or die like a crashing app;
    ``built``: first tell the zygote to prepare these configs (as a ClientApp that built them)."""
    if request.get("crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    if request.get("linger"):  # an app that ignores SIGTERM and outlives its zygote if allowed
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        Path(request["out"]).write_text(json.dumps({"pid": os.getpid()}))
        time.sleep(120)
        return 0
    for config in request.get("built", []):
        import flowerbed.clients.runtime as runtime

        runtime.on_built(config, 0, 1)
    out = {"pid": os.getpid(), "random": random.random(), "numpy": numpy.random.random()}
    Path(request["out"]).write_text(json.dumps(out))
    return 0


def _wait_for(path: Path, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text():
            return json.loads(path.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written")


@pytest.fixture
def zygote():
    numpy.random.random()  # NumPy seeds its global state at first use: let the zygote have used it
    z = Zygote(["numpy"], task="tests.apps.test_superexec:record_task")
    z.start()
    yield z
    z.close()


def test_each_task_is_a_fresh_forked_process_and_a_crash_stays_in_its_own(zygote, tmp_path):
    crashed = zygote.request({"crash": True, "runtime_api_address": "127.0.0.1:9",
                              "insecure": True, "root_certificates_path": None, "token": "t"})  # fmt: skip
    seen = []
    for i in range(3):
        pid = zygote.request({"out": str(tmp_path / f"{i}.json")})
        seen.append((pid, _wait_for(tmp_path / f"{i}.json")))
    assert zygote.alive(), "a crashing child took its zygote down"
    pids = [pid for pid, _ in seen]
    assert len({*pids, crashed, zygote.pid, os.getpid()}) == 6
    assert all(out["pid"] == pid for pid, out in seen)
    # each child's random state is its own (OS-seeded), not a copy of the zygote's: Python
    # reseeds `random` after a fork, NumPy's global state is reseeded by the zygote's child
    assert len({out["random"] for _, out in seen}) == 3
    assert len({out["numpy"] for _, out in seen}) == 3
    time.sleep(1.5)  # the zygote reaps its children every 0.5 s
    zombies = [c for c in psutil.Process(zygote.pid).children() if c.pid in pids]
    assert not zombies
    # the crash's reporter (no SuperNode listens here) gives up: nothing is left behind
    reporters = psutil.Process(zygote.pid).children(recursive=True)
    zygote.close()
    _, alive = psutil.wait_procs(reporters, timeout=20)
    assert not alive


def test_zygote_ends_when_its_superexec_closes_it(zygote):
    pid = zygote.pid
    zygote.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_task_child_dies_with_its_zygote_even_when_it_ignores_sigterm(zygote, tmp_path):
    """kill -9 of the SuperExec ends its zygote (death signal); the zygote's end must take the
    tasks it forked with it, or they run on under PID 1 (found by hand: a child survived)."""
    pid = zygote.request({"linger": True, "out": str(tmp_path / "linger.json")})
    assert _wait_for(tmp_path / "linger.json")["pid"] == pid
    child = psutil.Process(pid)
    os.kill(zygote.pid, signal.SIGKILL)
    child.wait(timeout=10)  # raises TimeoutExpired if the child outlives its zygote


class _Recorder:
    def __init__(self) -> None:
        self.calls: list = []

    def fork(self, spec: ExecutionSpec) -> int:
        self.calls.append(spec.task_id)
        return 1

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        self.calls.append(spec.task_id)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        pass


def _install(home: Path, fab_hash: str, clientapp: str, ships: str | None = None) -> None:
    app_dir = home / "apps" / f"pub.app.1.0.0.{fab_hash[:8]}"
    app_dir.mkdir(parents=True)
    (app_dir / "pyproject.toml").write_text(
        f'[tool.flwr.app.components]\nclientapp = "{clientapp}"\nserverapp = "x:y"\n'
    )
    if ships:
        (app_dir / ships).mkdir()


def _spec(task_id: int, fab_hash: str | None, task_type: TaskType = TaskType.CLIENT_APP):
    return ExecutionSpec(
        task_type=task_type, runtime_api_address="127.0.0.1:1", token="t", insecure=True,
        root_certificates_path=None, runtime_dependency_install=False, parent_pid=None,
        suppress_output=False, task_id=task_id, fab_hash=fab_hash,
    )  # fmt: skip


def test_only_installed_flowerbed_clientapps_are_forked(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    _install(tmp_path, "a" * 64, "flowerbed.apps.client_app:app")
    _install(tmp_path, "b" * 64, "bare_client:app")
    _install(tmp_path, "c" * 64, "flowerbed.apps.client_app:app", ships="flowerbed")
    warm, cold = _Recorder(), _Recorder()
    executor = WarmExecutor(warm, fallback=cold)  # type: ignore[arg-type]
    specs = [
        _spec(1, "a" * 64),  # flowerbed's ClientApp, installed: forked
        _spec(2, "b" * 64),  # another app: Flower's flwr-clientapp
        _spec(3, "c" * 64),  # a FAB that ships its own flowerbed: the zygote's would shadow it
        _spec(4, "d" * 64),  # never installed here yet: flwr-clientapp installs it
        _spec(5, None),
        _spec(6, "a" * 64, TaskType.SERVER_APP),
        _spec(7, "a" * 64),
    ]
    for spec in specs:
        assert executor.launch(spec).status == "accepted"
    assert warm.calls == [1, 7]
    assert cold.calls == [2, 3, 4, 5, 6]
    assert executor.launched == {"warm": 2, "subprocess": 5}


def test_a_failing_fork_falls_back_to_flowers_subprocess(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    _install(tmp_path, "a" * 64, "flowerbed.apps.client_app:app")

    class Gone(_Recorder):
        def fork(self, spec: ExecutionSpec) -> int:
            raise RuntimeError("the warm zygote is gone")

    cold = _Recorder()
    executor = WarmExecutor(Gone(), fallback=cold)  # type: ignore[arg-type]
    assert executor.launch(_spec(1, "a" * 64)).status == "accepted"
    assert cold.calls == [1]


def test_a_fab_is_unpacked_and_verified_once_then_reused_while_its_bytes_match(
    tmp_path, monkeypatch
):
    import hashlib

    import flwr.cli.install
    from flwr.cli.build import build_fab_from_disk

    from flowerbed.apps.superexec import INSTALLED_MARK, install_once

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    fab = build_fab_from_disk(Path(__file__).resolve().parents[2] / "benchmarks" / "bare_flower")
    first = install_once(fab, skip_prompt=True)
    assert (first / "bare_client.py").is_file()
    assert (first / INSTALLED_MARK).read_text() == hashlib.sha256(fab).hexdigest()
    calls = []
    flower_install = flwr.cli.install.install_from_fab

    def counted(*args, **kwargs):
        calls.append(1)
        return flower_install(*args, **kwargs)

    monkeypatch.setattr(flwr.cli.install, "install_from_fab", counted)
    assert install_once(fab, skip_prompt=True) == first
    assert calls == []  # same bytes: Flower's unpack + verify skipped
    # a mark that names other bytes (another FAB with the same 8-hex prefix): Flower's install
    (first / INSTALLED_MARK).write_text("0" * 64)
    assert install_once(fab, skip_prompt=True) == first
    assert calls == [1]


def test_a_dead_zygote_is_started_again_from_a_fresh_interpreter(zygote, tmp_path):
    """The SuperExec has threads by then, so the new zygote is not forked from it."""
    import threading

    executor = WarmExecutor(zygote, fallback=_Recorder())  # type: ignore[arg-type]
    first = zygote.pid
    os.kill(first, signal.SIGKILL)
    time.sleep(0.2)
    busy = threading.Event()
    helper = threading.Thread(target=busy.wait)  # like Flower's health and monitor threads
    helper.start()
    try:
        executor.reconcile()
    finally:
        busy.set()
        helper.join()
    assert zygote.alive() and zygote.pid != first
    assert "flowerbed.apps.superexec" in " ".join(psutil.Process(zygote.pid).cmdline())
    pid = zygote.request({"out": str(tmp_path / "after.json")})
    assert _wait_for(tmp_path / "after.json")["pid"] == pid


def _slow_prepare(path: str, partition_id: int, num_partitions: int) -> None:
    started = time.time()
    time.sleep(3.0)
    Path(path).write_text(json.dumps([started, time.time()]))


def test_a_waiting_fork_goes_before_the_next_prepare(tmp_path, monkeypatch):
    """Two configs to prepare (3 s each) and a fork request arriving during the first: the
    zygote forks before it starts the second, so the request waits for one build, not two."""
    import flowerbed.clients.runtime as runtime

    monkeypatch.setattr(runtime, "prepare", _slow_prepare)  # the forked zygote inherits it
    zygote = Zygote(["numpy"], task="tests.apps.test_superexec:record_task")
    zygote.start()
    try:
        first, second = str(tmp_path / "p1.json"), str(tmp_path / "p2.json")
        zygote.request({"out": str(tmp_path / "a.json"), "built": [first, second]})
        _wait_for(tmp_path / "a.json")
        time.sleep(0.5)  # the zygote is preparing the first config now
        sent = time.time()
        zygote.request({"out": str(tmp_path / "c.json")})
        answered = time.time()
        _wait_for(tmp_path / "c.json")
        one, two = _wait_for(Path(first)), _wait_for(Path(second), timeout=60)
    finally:
        zygote.close()
    assert one[0] < sent < one[1], "the request did not arrive during the first build"
    assert answered < two[1] - 1.5, "the fork request waited for the second build too"
