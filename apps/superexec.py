"""``flowerbed superexec``: Flower's SuperExec with a warm executor for ClientApp tasks.

Flower 1.42's SuperExec starts one ``flwr-clientapp`` process per message: a new interpreter
that imports flwr, torch and the app every time (seconds per message). This command runs
Flower's own SuperExec (``flower-superexec``: its flags, Runtime API client, TLS, SuperExec auth,
health server and signal handling) with one change, the executor behind its ``subprocess``
choice: :class:`WarmExecutor` keeps a *zygote*, a single-threaded process that imported flwr's
ClientApp runtime, torch and flowerbed's ClientApp once, and forks one fresh child per task. The
child runs Flower's ``run_clientapp`` (the body of ``flwr-clientapp``) with the task's token and
exits, so every message still runs in its own process (a crash, a leak or global state never
crosses tasks) without paying the interpreter start and the imports.

Only apps the zygote is warmed for are forked: a ClientApp task whose FAB is installed in
``$FLWR_HOME/apps`` and names a ClientApp under a warm package (``flowerbed`` by default) that
the FAB does not ship itself. Everything else (ServerApp and simulation tasks, other apps, the
first message of a FAB this node has never installed) goes to Flower's ``SubprocessExecutor``.

Lifetimes: the zygote dies with the SuperExec (``PR_SET_PDEATHSIG`` and end of its socket); each
child watches the SuperExec's PID like ``flwr-clientapp --parent-pid`` does, so ``kill -9`` of
the SuperExec leaves nothing behind. A zygote that dies is started again from a fresh interpreter.
The zygote itself is in ``apps/zygote.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Mapping, Sequence
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.supercore import log
from flwr.supercore.constant import ExecutorType, TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResult, SubprocessExecutor

from flowerbed.apps.zygote import TASK, TaskRequest, _die_with_parent, serve
from flowerbed.clients.core.diskcache import CACHE_ENV

#: what the zygote imports before it forks: Flower's ClientApp runtime, torch, flowerbed's
#: ClientApp and the quickstart's workload (``--warm-module`` adds more)
WARM_MODULES = (
    "flwr.supernode.runtime.run_clientapp",
    "torch",
    "pandas",
    "flowerbed.apps.client_app",
    "flowerbed.clients.workloads.tabular_mlp",
)
#: ClientApps under these top-level packages run in forked children
WARM_PACKAGES = ("flowerbed",)
#: the SuperExec's task poll (Flower's ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, default 1 s)
TASK_POLL_S = "0.2"
#: how long the zygote may take to import its modules, and to answer a fork request
START_TIMEOUT_S = 300.0
#: in an app directory :func:`install_once` installed: the FAB's full SHA-256
INSTALLED_MARK = ".flowerbed-fab-sha256"
FORK_TIMEOUT_S = 30.0


def install_once(fab_file: Path | bytes, install_dir: Path | None = None, skip_prompt: bool = False) -> Path:  # fmt: skip
    """Flower's ``install_from_fab``, skipped when this FAB is installed already.

    ``flwr-clientapp`` unpacks, verifies and re-installs the FAB for every message (about a
    second for flowerbed's); a directory this function installed carries the FAB's full SHA-256
    in :data:`INSTALLED_MARK`, and a match is reused as it is.
    """
    from flwr.cli.install import install_from_fab

    if isinstance(fab_file, bytes) and install_dir is None:
        digest = hashlib.sha256(fab_file).hexdigest()
        for app_dir in _app_dirs(digest):
            with contextlib.suppress(OSError):
                if (app_dir / INSTALLED_MARK).read_text() == digest:
                    return app_dir
        installed = install_from_fab(fab_file, install_dir, skip_prompt)
        tmp = installed / f".{INSTALLED_MARK}.{os.getpid()}"
        tmp.write_text(digest)
        os.replace(tmp, installed / INSTALLED_MARK)
        return installed
    return install_from_fab(fab_file, install_dir, skip_prompt)


def _app_dirs(fab_hash: str) -> list[Path]:
    from flwr.common.constant import APP_DIR, FAB_HASH_TRUNCATION
    from flwr.supercore.utils import get_flwr_home

    return sorted((get_flwr_home() / APP_DIR).glob(f"*.{fab_hash[:FAB_HASH_TRUNCATION]}"))


def run_task(request: TaskRequest) -> int:
    """Flower's ``flwr-clientapp`` body for one task, in this process; returns its exit code."""
    import flwr.supernode.runtime.run_clientapp as flower_clientapp
    from flwr.supercore.tls import validate_and_resolve_root_certificates

    flower_clientapp.install_from_fab = install_once  # this process runs this one task only
    run_clientapp = flower_clientapp.run_clientapp
    try:
        run_clientapp(
            runtime_api_address=request["runtime_api_address"],
            token=request["token"],
            insecure=request["insecure"],
            certificates=validate_and_resolve_root_certificates(
                request["root_certificates_path"], request["insecure"]
            ),
            parent_pid=request["parent_pid"],
            runtime_dependency_install=request["runtime_dependency_install"],
        )
    except SystemExit as exc:  # flwr_exit: the task's own exit code
        return exc.code if isinstance(exc.code, int) else 1
    return 0


class Zygote:
    """The executor's handle on a zygote process (forked here, or a fresh interpreter)."""

    def __init__(self, modules: Sequence[str], task: str = TASK) -> None:
        self.modules = tuple(modules)
        self.task = task
        self.pid = 0
        self.sock: socket.socket | None = None
        self._reader: Any = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Fork the zygote if this process has one thread, else start a fresh interpreter."""
        parent, child = socket.socketpair()
        if threading.active_count() == 1:
            pid = os.fork()
            if pid == 0:  # the zygote
                parent.close()
                _die_with_parent()
                try:
                    serve(child, self.modules, self.task)
                finally:
                    os._exit(1)
        else:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            pid = subprocess.Popen(
                [sys.executable, "-m", "flowerbed.apps.superexec", str(child.fileno()),
                 self.task, *self.modules],
                pass_fds=[child.fileno()], env=env,
            ).pid  # fmt: skip
        child.close()
        self.pid, self.sock = pid, parent
        parent.settimeout(START_TIMEOUT_S)
        self._reader = parent.makefile("r", encoding="utf-8")
        ready = self._reader.readline()
        if not ready:
            raise RuntimeError("the warm zygote exited while importing its modules")
        parent.settimeout(FORK_TIMEOUT_S)

    def alive(self) -> bool:
        if not self.pid:
            return False
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return done == 0

    def fork(self, spec: ExecutionSpec) -> int:
        """Start one child for ``spec``; returns its PID (raises if the zygote is gone)."""
        return self.request({
            "runtime_api_address": spec.runtime_api_address, "token": spec.token,
            "insecure": spec.insecure, "root_certificates_path": spec.root_certificates_path,
            "parent_pid": spec.parent_pid or os.getpid(),
            "runtime_dependency_install": spec.runtime_dependency_install,
        })  # fmt: skip

    def request(self, request: Mapping[str, object]) -> int:
        """Have the zygote fork a child that runs its task with ``request``; the child's PID."""
        with self._lock:
            assert self.sock is not None
            self.sock.sendall((json.dumps(request) + "\n").encode())
            answer = self._reader.readline()
        if not answer:
            raise RuntimeError("the warm zygote is gone")
        reply = json.loads(answer)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return int(reply["pid"])

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)


# ---- the executor --------------------------------------------------------------------------------
def installed_clientapp(fab_hash: str) -> tuple[str, Path] | None:
    """``(clientapp reference, app dir)`` of the FAB installed under ``$FLWR_HOME/apps``, if any."""
    for app_dir in _app_dirs(fab_hash):
        try:
            config = tomllib.loads((app_dir / "pyproject.toml").read_text())
            return str(config["tool"]["flwr"]["app"]["components"]["clientapp"]), app_dir
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            continue
    return None


class WarmExecutor:
    """Flower's :class:`Executor` protocol: warm forks for ClientApps it knows, else subprocesses."""

    def __init__(
        self,
        zygote: Zygote,
        packages: Sequence[str] = WARM_PACKAGES,
        fallback: SubprocessExecutor | None = None,
    ) -> None:
        self.zygote = zygote
        self.packages = tuple(packages)
        self.fallback = fallback or SubprocessExecutor()
        self._warm: dict[str, bool] = {}
        self.launched = {"warm": 0, "subprocess": 0}

    def is_warm_for(self, spec: ExecutionSpec) -> bool:
        """A ClientApp task of an installed FAB whose ClientApp the zygote has imported."""
        if spec.task_type != TaskType.CLIENT_APP or not spec.fab_hash:
            return False
        if spec.fab_hash not in self._warm:
            found = installed_clientapp(spec.fab_hash)
            if found is None:
                return False  # not installed yet: Flower's flwr-clientapp installs it
            reference, app_dir = found
            package = reference.split(":")[0].split(".")[0]
            shipped = (app_dir / package).is_dir() or (app_dir / f"{package}.py").is_file()
            self._warm[spec.fab_hash] = package in self.packages and not shipped
            log(INFO, "FAB %s (%s): %s", spec.fab_hash[:8], reference,
                "warm" if self._warm[spec.fab_hash] else "not warmed, subprocess")  # fmt: skip
        return self._warm[spec.fab_hash]

    def get_eligible_capacity(
        self,
        supported_task_types: set[TaskType],
        *,
        insecure: bool = False,
        root_certificates_path: str | None = None,
    ) -> tuple[set[TaskType], set[str]]:
        return self.fallback.get_eligible_capacity(
            supported_task_types, insecure=insecure, root_certificates_path=root_certificates_path
        )

    def wait_for_capacity(
        self,
        task_type: TaskType | None = None,
        *,
        fab_hash: str | None = None,
        insecure: bool = False,
        root_certificates_path: str | None = None,
    ) -> None:
        self.fallback.wait_for_capacity(
            task_type, fab_hash=fab_hash, insecure=insecure,
            root_certificates_path=root_certificates_path,
        )  # fmt: skip

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        if self.is_warm_for(spec):
            try:
                self.zygote.fork(spec)
                self.launched["warm"] += 1
                return LaunchResult.accepted()
            except (OSError, RuntimeError) as exc:
                log(WARNING, "warm fork failed (%s); starting flwr-clientapp instead", exc)
        self.launched["subprocess"] += 1
        return self.fallback.launch(spec)

    def reconcile(self) -> None:
        """Start the zygote again if it died (a fresh interpreter: this process has threads)."""
        if not self.zygote.alive():
            log(ERROR, "the warm zygote (pid %s) is gone; starting a new one", self.zygote.pid)
            self.zygote.close()
            try:
                self.zygote.start()
            except (OSError, RuntimeError) as exc:
                log(ERROR, "could not start a warm zygote: %s", exc)
        self.fallback.reconcile()

    def close(self) -> None:
        self.zygote.close()
        self.fallback.close()


def run(flower_args: Sequence[str], modules: Sequence[str] = WARM_MODULES) -> None:
    """``flower-superexec FLOWER_ARGS`` with :class:`WarmExecutor` as its subprocess executor.

    Flower parses the arguments first (a bad flag costs no zygote) and builds its executor before
    it starts a thread, so the zygote is forked from a single-threaded process; with Flower's
    telemetry on (a thread by then) it starts from a fresh interpreter instead.
    """
    import flwr.supercore.superexec.run_superexec as flower_run
    from flwr.supercore.cli.flower_superexec import flower_superexec

    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", TASK_POLL_S)
    from flwr.supercore.utils import get_flwr_home

    os.environ.setdefault(CACHE_ENV, str(get_flwr_home() / "flowerbed-cache"))
    original = flower_run.get_executor

    def get_executor(executor_type: ExecutorType, *args: Any, **kwargs: Any) -> Any:
        if executor_type != ExecutorType.SUBPROCESS:
            return original(executor_type, *args, **kwargs)
        zygote = Zygote(modules)
        zygote.start()
        return WarmExecutor(zygote)

    flower_run.get_executor = get_executor
    sys.argv = ["flower-superexec", *flower_args]
    flower_superexec()


if __name__ == "__main__":  # a zygote started from a fresh interpreter: FD TASK MODULE...
    _die_with_parent()
    serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[3:], sys.argv[2])
