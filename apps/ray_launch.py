"""Ray's worker launcher on the simulation engine's own head: a worker forked from a warm zygote.

Ray's raylet starts every worker of a job with a runtime environment (Flower's actors always have
one) as ``python SETUP_WORKER --serialized-runtime-env-context=... --language=PYTHON
default_worker.py ARGS`` (``RayParams.setup_worker_path``; Ray's own ``setup_worker.py`` imports
Ray, then ``exec``\\ s bash, which ``exec``\\ s a new interpreter that imports Ray, flwr and torch:
~6 CPU s per actor). The engine's head points ``setup_worker_path`` at this file
(``server/ray_local.start_hook``); it imports nothing heavy and asks the run's zygote
(``apps/ray_zygote.py``, socket in ``FLOWERBED_RAY_ZYGOTE``) to fork the worker: the child runs
Ray's ``default_worker.py`` unchanged, with this process's arguments, environment (the runtime
environment's variables applied as Ray's ``setup_worker.py`` does), working directory and
stdin/stdout/stderr. This process then waits for the worker to end (and the worker ends when
this process dies: the raylet's kill reaches it either way).

Anything this launcher does not handle (no zygote, another language, a runtime environment with a
command prefix, another interpreter or a different entry point, variables to expand) goes to
Ray's own ``setup_worker.py`` (``FLOWERBED_RAY_SETUP_WORKER``), exactly as without it.
"""

from __future__ import annotations

import array
import json
import os
import socket
import sys

#: the zygote's socket (set on the head by ``server/ray_local.py``)
ZYGOTE_ENV = "FLOWERBED_RAY_ZYGOTE"
#: Ray's own setup_worker.py, for what the zygote does not handle
SETUP_WORKER_ENV = "FLOWERBED_RAY_SETUP_WORKER"
#: the zygote's PID: while it lives and its socket is not there yet, it is warming up
ZYGOTE_PID_ENV = "FLOWERBED_RAY_ZYGOTE_PID"
#: longest wait for a warming zygote (seconds); then Ray's setup_worker starts the worker
WAIT_S = 60.0
#: the zygote's socket for ``flowerbed run``'s pre-flight: the workers' with this suffix
PREFLIGHT_SUFFIX = ".pre"
CONTEXT_FLAG = "--serialized-runtime-env-context"
LANGUAGE_FLAG = "--language"


def split_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """(``--serialized-runtime-env-context`` and ``--language`` values, the worker's command)."""
    flags: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in (CONTEXT_FLAG, LANGUAGE_FLAG):
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            flags[name] = value
        else:
            rest.append(arg)
        i += 1
    return flags, rest


def fork_request(argv: list[str], environ: dict[str, str]) -> dict | None:
    """What the zygote needs to fork this worker, or None if it is not a case it handles."""
    flags, command = split_args(argv)
    if flags.get(LANGUAGE_FLAG, "PYTHON") != "PYTHON" or not command:
        return None
    if not command[0].endswith("default_worker.py"):
        return None
    context = json.loads(flags.get(CONTEXT_FLAG) or "{}")
    executable = context.get("py_executable") or sys.executable
    if context.get("command_prefix") or context.get("override_worker_entrypoint"):
        return None
    if executable != sys.executable or context.get("java_jars"):
        return None
    env_vars = {str(k): str(v) for k, v in (context.get("env_vars") or {}).items()}
    if any("${" in v for v in env_vars.values()):  # Ray expands these: leave it to Ray
        return None
    return {"argv": command, "env": {**environ, **env_vars}, "cwd": os.getcwd()}


def zygote_ready(address: str, pid: int, wait_s: float = WAIT_S) -> bool:
    """Whether the zygote listens at ``address``, waiting while it warms up (alive, no socket)."""
    import time

    deadline = time.monotonic() + wait_s
    while not os.path.exists(address):
        if pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except (OSError, ValueError):
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def request_fork(address: str, request: dict, fds: list[int]) -> socket.socket | None:
    """Ask the zygote at ``address`` to fork a child with ``request`` and ``fds`` as its
    stdin, stdout and stderr; the connection it is held by (it closes when the child exits), or
    None if the zygote did not fork one."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(address)
        payload = json.dumps(request).encode() + b"\n"
        conn.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        answer = json.loads(conn.makefile("rb").readline() or b"{}")
    except (OSError, ValueError):
        answer = {}
    if "pid" not in answer:
        conn.close()
        return None
    return conn


def launch(argv: list[str]) -> int:
    """Have the zygote fork the worker and wait for it; falls back to Ray's setup_worker."""
    address = os.environ.get(ZYGOTE_ENV, "")
    request = fork_request(argv, dict(os.environ)) if address else None
    if request is not None and not zygote_ready(address, int(os.environ.get(ZYGOTE_PID_ENV, 0))):
        request = None
    conn = request_fork(address, request, [0, 1, 2]) if request is not None else None
    if conn is None:
        setup_worker = os.environ[SETUP_WORKER_ENV]
        os.execv(sys.executable, [sys.executable, setup_worker, *argv])
    while conn.recv(4096):  # the worker holds the other end until it exits
        pass
    return 0


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
