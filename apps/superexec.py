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
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import hashlib
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Sequence
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.supercore import log
from flwr.supercore.constant import ExecutorType, TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResult, SubprocessExecutor

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
#: what a forked child runs with its request (``module:function``)
TASK = "flowerbed.apps.superexec:run_task"
#: ClientApps under these top-level packages run in forked children
WARM_PACKAGES = ("flowerbed",)
#: the SuperExec's task poll (Flower's ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, default 1 s)
TASK_POLL_S = "0.2"
#: how long the zygote may take to import its modules, and to answer a fork request
START_TIMEOUT_S = 300.0
#: a child's note to the zygote (config JSON, partition): one datagram at most this long
MAX_NOTE_BYTES = 1 << 20
#: in an app directory :func:`install_once` installed: the FAB's full SHA-256
INSTALLED_MARK = ".flowerbed-fab-sha256"
FORK_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1


# ---- the zygote ----------------------------------------------------------------------------------
def _die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: send ``sig`` to this process when its parent exits (no-op elsewhere).

    A parent that died before the call (the fork/prctl race) leaves this process orphaned under
    another parent: it exits at once instead.
    """
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        os._exit(1)


def serve(sock: socket.socket, modules: Sequence[str], task: str = TASK) -> None:
    """The zygote's loop: import ``modules``, then fork one child per request on ``sock``.

    A request is one JSON line (the task's :class:`ExecutionSpec` fields); the answer is one JSON
    line, ``{"pid": N}`` or ``{"error": "..."}``. End of input ends the zygote. ``task``
    (``module:function``) is what a child runs with the request. A child that ends without
    saying it is done (killed, segfault, ``os._exit`` in the app) had no chance to reply: the
    zygote forks a reporter that sends the task's error reply (:func:`report_crash`).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the SuperExec's
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    for name in modules:
        importlib.import_module(name)
    module, _, function = task.partition(":")
    run = getattr(importlib.import_module(module), function)
    notes, note_sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    runtime = sys.modules.get("flowerbed.clients.runtime")
    if runtime is not None:
        runtime.warm_up()
        runtime.on_built = functools.partial(_note, note_sender, "built")
    _freeze()
    children: dict[int, dict[str, Any]] = {}
    done: set[int] = set()
    reader = sock.makefile("r", encoding="utf-8")
    sock.sendall(b'{"ready": true}\n')

    to_prepare: list[list[Any]] = []

    def read_notes() -> None:
        while True:
            try:
                kind, *args = json.loads(notes.recv(MAX_NOTE_BYTES, socket.MSG_DONTWAIT))
            except BlockingIOError:
                return
            if kind == "done":
                done.add(int(args[0]))
            elif runtime is not None and args not in to_prepare:
                to_prepare.append(args)

    while True:
        ready, _, _ = select.select([sock, notes], [], [], 0.5)
        read_notes()
        _reap(children, done, read_notes)
        if sock not in ready:
            if to_prepare:  # nothing waits for a fork: build what later children will need
                _prepare(runtime, to_prepare.pop(0))
            continue
        line = reader.readline()
        if not line:
            os._exit(0)
        try:
            request = json.loads(line)
            pid = _fork(functools.partial(_task_child, run, request, note_sender), sock)
            children[pid] = request
            answer: dict[str, Any] = {"pid": pid}
        except Exception as exc:  # noqa: BLE001 - told to the executor, which logs it
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sock.sendall((json.dumps(answer) + "\n").encode())


def _note(sender: socket.socket, kind: str, *args: Any) -> None:
    """One datagram from a child to its zygote (``built``: build this config too; ``done``)."""
    with contextlib.suppress(OSError):  # too large or the zygote is gone: nothing is lost
        sender.send(json.dumps([kind, *args]).encode())


def _prepare(runtime: Any, args: list[Any]) -> None:
    try:
        runtime.prepare(*args)
    except Exception as exc:  # noqa: BLE001 - the child that needs it builds it and reports
        log(WARNING, "warm zygote could not prepare a workload: %s", exc)
    _freeze()


def _freeze() -> None:
    """Keep what the zygote holds out of its children's garbage collection.

    A collection in a child would write to every object it visits, copying the zygote's pages
    into the child; frozen objects are never visited, so their pages stay shared.
    """
    gc.collect()
    gc.freeze()


def _reap(children: dict[int, dict[str, Any]], done: set[int], read_notes: Any) -> None:
    """Collect ended children; report the tasks of those that crashed.

    A child says ``done`` before it exits, so once its exit is seen its note is waiting:
    the notes are read again before a child without one counts as crashed.
    """
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in done:
            read_notes()
        request = children.pop(pid, None)
        if request is None or pid in done:
            done.discard(pid)
            continue
        if os.WIFSIGNALED(status):
            reason = f"ClientApp process {pid} was killed by signal {os.WTERMSIG(status)}"
        else:
            reason = f"ClientApp process {pid} exited with {os.waitstatus_to_exitcode(status)}"
        log(ERROR, "%s before it replied; sending the error reply", reason)
        with contextlib.suppress(OSError):
            _fork(functools.partial(report_crash, request, reason), None)


def _fork(child: Any, sock: socket.socket | None) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # a fresh process for one task, then os._exit (never back into the zygote's loop)
        if sock is not None:
            with contextlib.suppress(
                OSError
            ):  # the zygote's end: its death must reach the SuperExec
                os.close(sock.fileno())
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # the death signal is not inherited over fork: a task child (or crash reporter) whose
        # zygote is gone (its SuperExec killed) is killed too, whatever handlers the app installs
        _die_with_parent(signal.SIGKILL)
        _fresh_random_state()
        code = child()
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _task_child(run: Any, request: dict[str, Any], sender: socket.socket) -> int:
    code = run(request)
    _note(sender, "done", os.getpid())  # it got to the end: its reply (or error) was sent
    return code


def _fresh_random_state() -> None:
    """What a new interpreter would have: OS-seeded NumPy global state (``random`` reseeds
    itself after a fork)."""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def report_crash(request: dict[str, Any], reason: str) -> int:
    """Send the error reply of a task whose process died before replying (its token still holds).

    What ``flwr-clientapp`` sends when the app raises, with Flower's ``CLIENT_APP_CRASHED`` code:
    the run goes on without this node's reply, as with any failed reply, and nobody waits for
    the token to expire.
    """
    from flwr.app import Context, Message, RecordDict
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.common.serde import message_from_proto
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.interceptors import (
        RuntimeTokenHttpInterceptor,
        RuntimeVersionHttpInterceptor,
    )
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

    if request.get("parent_pid"):
        start_parent_process_monitor(int(request["parent_pid"]))
    retry = make_simple_http_retry_invoker()
    retry.max_tries = 3
    client = RuntimeHttpClient.from_server_address(
        server_address=request["runtime_api_address"],
        insecure=request["insecure"],
        root_certificates=validate_and_resolve_root_certificates(
            request["root_certificates_path"], request["insecure"]
        ),
        interceptors=[
            RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
            RuntimeTokenHttpInterceptor(request["token"]),
        ],
        retry_invoker=retry,
    )
    try:
        pulled = client.PullMessages(PullAppMessagesRequest())
        if pulled.messages_list:
            message = message_from_proto(pulled.messages_list[0])
            message.metadata.__dict__["_message_id"] = pulled.message_object_trees[0].object_id
            reply = Message(
                Error(code=ErrorCode.CLIENT_APP_CRASHED, reason=reason), reply_to=message
            )
            context = Context(
                run_id=message.metadata.run_id, node_id=message.metadata.dst_node_id,
                node_config={}, state=RecordDict(), run_config={},
            )  # fmt: skip
            push_message(client, reply, context)
            log(INFO, "sent the error reply of message %s: %s", message.metadata.message_id, reason)
        push_task_output(client, None, SubStatus.FAILED, reason)
    finally:
        client.close()
    return 0


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


def run_task(request: dict[str, Any]) -> int:
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

    def request(self, request: dict[str, Any]) -> int:
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
