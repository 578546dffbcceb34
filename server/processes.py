"""Processes flowerbed starts (SuperLinks, SuperNodes, ``flwr run``): their environment, ports,
start-up waits and shutdown by PID. Shared by the simulation and deployment engines and
``flowerbed deploy``.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import psutil

from flowerbed.clients.core.config import configs_dir


def app_dir() -> Path:
    """The Flower App (the project root, where pyproject.toml declares the components)."""
    return configs_dir().parent


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


# ---- certificates and keys ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flower_env(home: Path) -> dict[str, str]:
    """Environment for Flower processes: private home, Ray temp dir, no telemetry or installs."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["FLWR_HOME"] = str(home / "flwr")
    env["RAY_TMPDIR"] = str(home / "ray")
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    env["PYTHONPATH"] = str(app_dir()) + os.pathsep + env.get("PYTHONPATH", "")
    (home / "ray").mkdir(parents=True, exist_ok=True)
    return env


def wait_for_port(port: int, pid: int, timeout: float = 60.0) -> None:
    """Until ``port`` accepts connections; fails fast if process ``pid`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            raise RuntimeError(f"the SuperLink (pid {pid}) exited during start-up")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"the SuperLink did not open port {port} within {timeout:.0f} s")


def stop_process_tree(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM a process and its descendants, then SIGKILL what is left."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = [root, *root.children(recursive=True)]
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def process_identity(pid: int, timeout: float = 10.0) -> dict:
    """What tells this process apart from a later one reusing its PID: start time and command.

    Right after ``exec`` the kernel may not show the new command line yet; wait for it.
    """
    proc = psutil.Process(pid)
    deadline = time.monotonic() + timeout
    cmdline = proc.cmdline()
    while not cmdline and time.monotonic() < deadline:
        time.sleep(0.05)
        cmdline = proc.cmdline()
    if not cmdline:
        raise RuntimeError(f"process {pid} shows no command line (did it exit at once?)")
    return {"pid": pid, "started": proc.create_time(), "cmdline": cmdline}


def is_same_process(identity: dict) -> bool:
    """Whether ``identity`` (from :func:`process_identity`) still names a live process."""
    try:
        proc = psutil.Process(identity["pid"])
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            same_start = abs(proc.create_time() - identity["started"]) < 0.01
            return same_start and proc.cmdline() == identity["cmdline"]
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError):
        return False
