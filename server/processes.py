"""Processes flowerbed starts (SuperLinks, SuperNodes, ``flwr run``): their environment, ports,
start-up waits and shutdown by PID. Shared by the simulation and deployment engines and
``flowerbed deploy``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TypedDict

import psutil

from flowerbed.clients.core.config import DeploymentConfig, configs_dir


def app_dir() -> Path:
    """The Flower App (the project root, where pyproject.toml declares the components).

    Found through a real file of ``flowerbed.configs``: the strict editable install
    (``editable_mode=strict``, for static tools) links each file from a tree under ``build/``.
    """
    return (configs_dir() / "__init__.py").resolve().parent.parent


def app_manifest(home: Path) -> Path:
    """A Flower App directory holding only flowerbed's Flower manifest, under ``home``.

    The ServerApp and ClientApp components are imported from the installed package, so nothing
    else of the project has to travel. ``flwr run`` walks its app directory before it bundles it
    (the project root with a virtualenv inside is ~50,000 files, 2-3 s of CPU per run); this one
    is a single file, :func:`flower_manifest` of the project's ``pyproject.toml``.
    """
    app = home / "app"
    app.mkdir(parents=True, exist_ok=True)
    manifest = flower_manifest((app_dir() / "pyproject.toml").read_text())
    (app / "pyproject.toml").write_text(manifest)
    return app


#: the [project] fields Flower reads (name and version required, the others recommended)
MANIFEST_PROJECT_KEYS = ("name", "version", "description", "license")


def flower_manifest(pyproject: str) -> str:
    """The part of ``pyproject`` Flower reads: the [project] identity and the [tool.flwr.*]
    tables (verbatim), without the build, lint and test settings.

    Flower's simulation parses its app's ``pyproject.toml`` once per virtual node (every node's
    run config is fused from it): the full 6 KB file took 0.8 ms a node (measured under load),
    ~80 s of CPU in ``flwr-simulation`` before the first round at 100,000 clients; this one
    0.2 ms (the bare Flower app's own pyproject.toml 0.35 ms).
    """
    import tomllib

    project = tomllib.loads(pyproject)["project"]
    lines = ["[project]"]
    lines += [f"{k} = {json.dumps(project[k])}" for k in MANIFEST_PROJECT_KEYS if k in project]
    keep = False
    for line in pyproject.splitlines():
        header = re.match(r"\[\[?([\w.\-\"]+)\]\]?\s*(#.*)?$", line)
        if header:
            keep = header[1] == "tool.flwr" or header[1].startswith("tool.flwr.")
            if keep:
                lines.append("")
        if keep and (line.strip() and not line.lstrip().startswith("#")):
            lines.append(line)
    return "\n".join(lines) + "\n"


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


# ---- certificates and keys ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flower_env(home: Path) -> dict[str, str]:
    """Environment for Flower processes: private home, Ray temp dir, no telemetry or installs.

    ``FLOWERBED_OWNER`` tags every process started with it (and their descendants), so the
    :class:`Reaper` can find them even after they left their process group.
    """
    env = dict(os.environ)
    env[OWNER_ENV] = str(home)
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


def wait_for_port(port: int, pid: int, timeout: float = 60.0, what: str = "SuperLink") -> None:
    """Until ``port`` accepts connections; fails fast if process ``pid`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            raise RuntimeError(f"the {what} (pid {pid}) exited during start-up")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the {what} did not open port {port} within {timeout:.0f} s")


def stop_process_tree(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM a process and its descendants, then SIGKILL what is left."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    end_processes([root, *root.children(recursive=True)], timeout)


def end_processes(procs: list[psutil.Process], timeout: float = 10.0) -> None:
    """SIGTERM each of ``procs``, wait up to ``timeout``, SIGKILL those still alive."""
    _each(procs, "terminate")
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    _each(alive, "kill")


def _each(procs: list[psutil.Process], action: str) -> None:
    for proc in procs:
        try:
            getattr(proc, action)()
        except psutil.Error:
            pass


# ---- owning what we start: temp folders, process groups, a reaper ------------------------------

#: environment tag of every process an engine starts (the value is the engine's private home)
OWNER_ENV = "FLOWERBED_OWNER"
OWNER_FILE = "owner.json"
HOME_PREFIX = "fb-"


def _identity(pid: int) -> dict:
    proc = psutil.Process(pid)
    return {"pid": pid, "started": proc.create_time()}


def _alive(identity: dict) -> bool:
    try:
        proc = psutil.Process(int(identity["pid"]))
        return (
            abs(proc.create_time() - float(identity["started"])) < 0.01
            and proc.status() != psutil.STATUS_ZOMBIE
        )
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def private_home(prefix: str = HOME_PREFIX) -> Path:
    """A fresh temp folder owned by this process (short: Ray's socket paths are length-limited).

    Folders left by owners that died (SIGKILL) are removed first, so a killed run's folder
    lasts until the next start at the latest.
    """
    remove_stale_homes(prefix)
    home = Path(tempfile.mkdtemp(prefix=prefix))
    (home / OWNER_FILE).write_text(json.dumps(_identity(os.getpid())))
    return home


def remove_stale_homes(prefix: str = HOME_PREFIX) -> list[Path]:
    """Remove temp folders whose recorded owner process is gone; returns what was removed."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        owner = path / OWNER_FILE
        try:
            identity = json.loads(owner.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # not ours, or still being created
        if not _alive(identity):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def stop_group(pid: int, timeout: float = 10.0) -> None:
    """Stop a process started with ``start_new_session=True``: its group, then its descendants."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    _signal_group(pid, signal.SIGTERM)
    _each(procs, "terminate")
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    _signal_group(pid, signal.SIGKILL)
    _each(alive, "kill")


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Processes whose environment carries ``FLOWERBED_OWNER=tag``."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(OWNER_ENV) == tag:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


class Reaper:
    """A watchdog process that cleans up after this one, however this one ends.

    It reads commands on a pipe from this process: the process groups and temp folder to clean.
    When the pipe closes without ``done`` (this process died, even by SIGKILL), it ends those
    groups and every process tagged with the folder (:data:`OWNER_ENV`), then removes the
    folder. It runs in its own session, so a terminal's Ctrl-C does not reach it.
    """

    def __init__(self, home: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flowerbed.server.reaper", str(home)],
            stdin=subprocess.PIPE, text=True, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def watch(self, pid: int) -> None:
        """Also end the process group led by ``pid`` (started with ``start_new_session``)."""
        self._send(f"group {pid}")

    def done(self) -> None:
        """Everything was stopped here: the reaper exits without acting."""
        self._send("done")
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def _send(self, line: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass


class ProcessIdentity(TypedDict):
    """What tells a process apart from a later one reusing its PID (:func:`process_identity`)."""

    pid: int
    started: float
    cmdline: list[str]


def process_identity(pid: int, timeout: float = 10.0) -> ProcessIdentity:
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


def is_same_process(identity: ProcessIdentity) -> bool:
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


def reap(home: Path, groups: list[int]) -> None:
    """End ``groups`` and every process tagged with ``home`` together (one SIGTERM to all, one
    wait, then SIGKILL: a group that ignores SIGTERM costs its 3 s once, not once per group, so
    a SuperLink, its simulation and the Ray head are gone within seconds); remove ``home``."""
    procs: dict[int, psutil.Process] = {}
    for pgid in groups:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pgid)
            procs.update((p.pid, p) for p in [root, *root.children(recursive=True)])
    procs.update((p.pid, p) for p in tagged_processes(str(home)))
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    _each(list(procs.values()), "terminate")
    _, alive = psutil.wait_procs(list(procs.values()), timeout=3.0)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)
    _each(alive, "kill")
    end_processes(tagged_processes(str(home)), timeout=1.0)  # any started during the wait
    shutil.rmtree(home, ignore_errors=True)


# ---- user-caused failures in Flower's output ----------------------------------------------------

#: Flower's words for "the SuperLink could not be reached" (refused, wrong port, failed TLS)
UNREACHABLE = re.compile(
    r"Connection to the SuperLink is unavailable|failed to connect to all addresses|"
    r"StatusCode\.UNAVAILABLE|CERTIFICATE_VERIFY_FAILED|certificate verify failed",
    re.I,
)


def user_problem(
    log_path: Path, exc: BaseException | None = None, deployment: DeploymentConfig | None = None
) -> str | None:
    """A connection or TLS failure recognised in Flower's log (or the error), as one line.

    With the SuperLink's address (and CA) known, the SuperLink is probed to tell a refused
    connection from a certificate that the given CA did not sign.
    """
    text = str(exc or "")
    if Path(log_path).is_file():
        text += "\n" + Path(log_path).read_text(errors="replace")[-20000:]
    if not UNREACHABLE.search(text):
        return None
    address = deployment.superlink if deployment is not None else None
    if address:
        found = probe_superlink(address, deployment.root_certificates if deployment else None)
        if found:
            return found
    return (
        f"could not reach the SuperLink{f' at {address}' if address else ''} (is it running, "
        "is HOST:PORT right, and does its TLS match --root-certificates / deployment.insecure?)"
    )


def probe_superlink(address: str, ca_file: str | None, timeout: float = 5.0) -> str | None:
    """Why ``address`` cannot be used with ``ca_file``, in one line; None if nothing is found."""
    import ssl

    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError) as exc:
        return (
            f"could not connect to the SuperLink at {address} "
            f"({(exc.strerror if isinstance(exc, OSError) else None) or exc}): is it "
            "running and is HOST:PORT right? (`flowerbed deploy up` starts one)"
        )
    if not ca_file:
        sock.close()
        return None
    context = ssl.create_default_context(cafile=ca_file)
    try:
        with context.wrap_socket(sock, server_hostname=host):
            return None
    except ssl.SSLCertVerificationError as exc:
        return (
            f"TLS: the SuperLink at {address} presented a certificate that {ca_file} does not "
            f"verify ({exc.verify_message}); pass the CA that signed it with --root-certificates"
        )
    except (ssl.SSLError, OSError) as exc:
        return (
            f"TLS handshake with the SuperLink at {address} failed ({exc}); is it started with "
            "TLS, and is --root-certificates its CA?"
        )
    finally:
        sock.close()
