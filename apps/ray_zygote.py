"""The simulation engine's Ray worker zygote: ClientApp actors forked from one warm process.

Every Flower ClientApp actor is a Ray worker; started by Ray, each is a new interpreter that
imports Ray, flwr and torch and takes torch's first optimizer step (~6 CPU s, paid again per
actor and by Ray's ``setup_worker.py`` before it). This process pays that once, while Ray and the
SuperLink start: it imports Ray's worker entry point, Flower's actor, flowerbed's ClientApp and
runtime, warms torch up (one thread), freezes what it holds (``apps/zygote._freeze``), then
listens on a Unix socket. The head's worker launcher (``apps/ray_launch.py``) sends each worker's
command, environment, working directory and stdio; the zygote forks a child that takes them on
and runs Ray's ``default_worker.py`` as ``__main__``, unchanged: Ray connects it, registers it with
the raylet (its startup token is in its arguments) and runs Flower's actor in it as in a fresh
worker. Nothing of a run's state lives here: every client seeds its own work, NumPy's global state
is reseeded in each child, and each child is its own process (a crash stays in it).

A child ends when its launcher does (the launcher holds the other end of the child's
connection: a thread in the child exits on end of file) and when the zygote dies (the parent-death
signal); the zygote ends at the end of its input (its parent, the engine, closing it) or SIGTERM.
Started by ``server/engines/simulation.LocalSuperLink`` with the engine's own head only.
"""

from __future__ import annotations

import array
import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading

from flowerbed.apps.ray_launch import PREFLIGHT_SUFFIX
from flowerbed.apps.zygote import _die_with_parent, _freeze, _fresh_random_state

#: what a worker imports before its first task, less Ray itself: Ray's C++ core reads the
#: worker's identity (``RAY_JOB_ID``...) from the environment once per process, when Ray is first
#: imported, so each worker imports Ray (~0.1 CPU s once these are loaded). Flower's ClientApp
#: runtime and actor module's dependencies (flwr.server, flwr.superlink: sqlalchemy, alembic,
#: fastapi...), Ray's own Python dependencies, flowerbed's ClientApp and runtime. A module
#: missing here is imported by the worker itself: slower, never different.
MODULES = (
    "flwr.clientapp",
    "flwr.server",
    "flwr.superlink",
    "flwr.cli",
    "flwr.simulation.ray_transport",
    "grpc",
    "google.protobuf",
    "psutil",
    "msgpack",
    "aiohttp",
    "jsonschema",
    "requests",
    "filelock",
    "packaging",
    "flowerbed.apps.client_app",
    "flowerbed.clients.runtime",
)
MAX_REQUEST = 1 << 22


#: what ``flowerbed run``'s pre-flight imports (config, dataset, workload: torch among them);
#: loaded first, so the pre-flight child can be forked while the rest loads
PREFLIGHT_MODULES = (
    "flowerbed.apps.preflight",
    "flowerbed.server.experiment",
    "flowerbed.clients.datasets",
    "flowerbed.clients.datasets.partition",
    "flowerbed.clients.workloads",
)
MAX_REQUEST = 1 << 22


def serve(path: str) -> None:
    """Fork one child per connection until stdin closes or SIGTERM: the pre-flight's on
    ``path`` + :data:`PREFLIGHT_SUFFIX` once :data:`PREFLIGHT_MODULES` are in (while the rest
    loads, between modules), the workers' on ``path`` once :data:`MODULES` are in and torch
    took its first optimizer step (one thread). Each socket appears only when it is served."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    for name in PREFLIGHT_MODULES:
        importlib.import_module(name)
    _freeze()
    listeners = [_listen(path + PREFLIGHT_SUFFIX)]
    for name in MODULES:
        importlib.import_module(name)
        _serve_ready(listeners, 0.0)
    from flowerbed.clients import runtime

    runtime.warm_up()
    _freeze()
    listeners.append(_listen(path))
    while True:
        _serve_ready(listeners, 0.5)


def _listen(path: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.rename(path + ".tmp", path)  # the path appears once it is listened on
    listener.listen(64)
    return listener


def _serve_ready(listeners: list[socket.socket], timeout: float) -> None:
    """Fork a child for each connection waiting on ``listeners``; exit at the end of stdin."""
    ready, _, _ = select.select([*listeners, sys.stdin], [], [], timeout)
    _reap()
    if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
        os._exit(0)
    for listener in listeners:
        if listener in ready:
            conn, _ = listener.accept()
            with contextlib.suppress(OSError, ValueError):
                _fork_child(listeners, conn)
            conn.close()


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data = b""
    fds: list[int] = []
    while not data.endswith(b"\n"):
        chunk, ancdata, _, _ = conn.recvmsg(MAX_REQUEST, socket.CMSG_LEN(3 * 4))
        if not chunk:
            raise ValueError("launcher closed")
        data += chunk
        for level, kind, raw in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += array.array("i", raw[: len(raw) - len(raw) % 4]).tolist()
    return json.loads(data), fds


def _fork_child(listeners: list[socket.socket], conn: socket.socket) -> None:
    """Fork the child ``conn`` asks for: Ray's worker script (``argv[0]``) or a ``module``."""
    request, fds = _receive(conn)
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        return
    code = 1
    try:
        for listener in listeners:
            listener.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _die_with_parent(signal.SIGKILL)
        _become(request, fds)
        threading.Thread(target=_exit_with_launcher, args=(conn,), daemon=True).start()
        _fresh_random_state()
        if request.get("module"):
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(request["argv"][0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _become(request: dict, fds: list[int]) -> None:
    """Take on the requester's stdio, environment, working directory and command line."""
    for target, fd in zip((0, 1, 2), fds, strict=False):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    sys.argv = list(argv)
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # sys.path[0] as ``python -m MODULE`` (the working directory) or ``python SCRIPT`` sets it
    if request.get("module"):
        first = request["cwd"]
    else:
        first = os.path.dirname(os.path.abspath(argv[0]))
    sys.path[:] = [first, *dict.fromkeys([*extra, *sys.path[1:]])]


def _exit_with_launcher(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while conn.recv(4096):
            pass
    os._exit(1)


if __name__ == "__main__":
    serve(sys.argv[1])
