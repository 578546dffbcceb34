"""A loopback federation: SuperLink + N SuperNodes as processes, with the flags of docker-compose.yml.

``up`` generates (or reuses) a CA, a server certificate (SAN 127.0.0.1, ::1, localhost) and one
ECDSA P-384 key per SuperNode, starts the SuperLink with TLS and SuperNode authentication,
registers the node keys through the Control API (keys it already knows are fine) and starts the
SuperNodes. ``down`` stops only processes it can prove it started: each is recorded with its PID,
start time and command line, and all three must still match. State lives in ``<dir>/state.json``;
Flower's connection entry in ``<dir>/flwr/config.toml`` is named ``flowerbed``.

The same functions serve docker-compose.yml's one-shot services (``flowerbed deploy certs`` and
``flowerbed deploy register``).
The certificates and keys are written by ``server/credentials.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from flowerbed.clients.core.diskcache import CACHE_ENV
from flowerbed.clients.core.errors import ConfigError
from flowerbed.server.credentials import ensure_credentials
from flowerbed.server.processes import (
    ProcessIdentity,
    bin_path,
    flower_env,
    free_port,
    is_same_process,
    process_identity,
    stop_process_tree,
    wait_for_port,
)

CONNECTION = "flowerbed"
#: how long a SuperNode keeps retrying a call while the SuperLink is unreachable (Flower's
#: ``--max-wait-time``, per call); long enough to ride out a SuperLink restart
SUPERNODE_MAX_WAIT_S = 600
#: what ``flwr supernode register`` says for a key the SuperLink already holds
ALREADY_REGISTERED = "already in use"
#: who executes a SuperNode's ClientApps: flowerbed's warm SuperExec, or Flower's own
SUPEREXECS = ("warm", "flower")
#: which SuperNode runs: ``flowerbed supernode`` (Flower's, its fixed 3 s / 0.5 s polls
#: shortened: apps/supernode.py) or Flower's own ``flower-supernode``
SUPERNODES = ("flowerbed", "flower")
#: the seconds ``flowerbed supernode`` may poll at (Flower's own idle sleep is 3 s)
POLL_RANGE = (0.01, 3.0)


def poll_problem(name: str, seconds: float) -> str | None:
    """One line naming what is wrong with a polling interval, or None."""
    low, high = POLL_RANGE
    if not low <= seconds <= high:
        return f"--{name} must be between {low} and {high} seconds, got {seconds}"
    return None


# ---- Flower connection and Control API -----------------------------------------------------------
def write_connection(flwr_home: Path, address: str, ca: Path | None) -> None:
    flwr_home.mkdir(parents=True, exist_ok=True)
    tls = f'root-certificates = "{ca}"' if ca else "insecure = true"
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "{address}"\n{tls}\n'
    )


def flwr_cli(args: list[str], home: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the ``flwr`` CLI with ``home/flwr`` as FLWR_HOME (its connection ``flowerbed``)."""
    env = flower_env(home)
    env["FLWR_HOME"] = str(home / "flwr")
    return subprocess.run(
        [bin_path("flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def cli_error(text: str) -> str:
    """The message of the last error box the ``flwr`` CLI printed, on one line (else "")."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("╭")]
    if not starts:
        return ""
    body = []
    for line in lines[starts[-1] + 1 :]:
        if line.lstrip().startswith("╰"):
            break
        body.append(line.strip().strip("│").strip())
    return " ".join(part for part in body if part)


class RegistrationError(RuntimeError):
    """The SuperLink refused or could not be reached; the message is Flower's, on one line."""


def register_keys(
    home: Path, superlink: str, root_certificates: Path | None, public_keys: Sequence[Path]
) -> dict[str, str]:
    """Register SuperNode public keys with a SuperLink's Control API.

    Keys the SuperLink already holds count as registered (a persisted state after a restart).
    Returns ``{key file: "registered" | "already registered"}``; raises
    :class:`RegistrationError` on the first key that fails.
    """
    for key in public_keys:
        if not Path(key).is_file():
            raise ConfigError(f"public key not found: {key}")
    if root_certificates is not None and not Path(root_certificates).is_file():
        raise ConfigError(f"root certificate not found: {root_certificates}")
    write_connection(home / "flwr", superlink, root_certificates)
    outcome = {}
    for key in public_keys:
        done = flwr_cli(["supernode", "register", str(key), CONNECTION], home)
        text = done.stdout + done.stderr
        if done.returncode == 0 and "registered successfully" in text:
            outcome[str(key)] = "registered"
        elif ALREADY_REGISTERED in text:
            outcome[str(key)] = "already registered"
        else:
            detail = cli_error(text) or text.strip().replace("\n", " ") or f"exit {done.returncode}"
            raise RegistrationError(f"registering {key} with {superlink} failed: {detail}")
    return outcome


# ---- the loopback federation -----------------------------------------------------------------------
class FederationState(TypedDict):
    """A loopback federation's ``state.json`` (what ``up`` started, where, and how)."""

    dir: str
    nodes: int
    insecure: bool
    port: int
    address: str
    node_ports: list[int]
    #: ``superlink``, ``supernode<i>``, ``superexec<i>`` -> who it is (``down`` checks it)
    processes: dict[str, ProcessIdentity]
    superexec: str
    supernode: str
    idle_poll: float


class FederationStatus(TypedDict):
    """``status``: the saved state, which of its processes live, ``flwr supernode list``."""

    state: FederationState
    alive: dict[str, bool]
    supernodes: str


def _state_path(directory: Path) -> Path:
    return directory / "state.json"


def load_state(directory: Path) -> FederationState:
    path = _state_path(directory)
    if not path.is_file():
        raise ConfigError(f"no loopback federation in {directory} (start one: flowerbed deploy up)")
    return json.loads(path.read_text())


def _save(state: FederationState) -> None:
    path = _state_path(Path(state["dir"]))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> ProcessIdentity:
    """Start a process in its own session; returns its identity (pid, start time, command)."""
    with log.open("a") as fh:
        proc = subprocess.Popen(
            cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    return process_identity(proc.pid)


def superlink_command(state: FederationState) -> list[str]:
    """The SuperLink flags (the same as docker-compose.yml's superlink service)."""
    directory = Path(state["dir"])
    cmd = [bin_path("flower-superlink"), "--host", "127.0.0.1", "--port", str(state["port"]),
           "--database", str(directory / "state.db"), "--disable-runtime-dependency-installation"]  # fmt: skip
    if state["insecure"]:
        return [*cmd, "--insecure"]
    certs = directory / "certs"
    return [*cmd, "--ssl-ca-certfile", str(certs / "ca.crt"),
            "--ssl-certfile", str(certs / "server.pem"), "--ssl-keyfile", str(certs / "server.key"),
            "--enable-supernode-auth"]  # fmt: skip


def supernode_command(
    state: FederationState,
    index: int,
    key: Path | None,
    insecure: bool,
    max_wait_s: float = SUPERNODE_MAX_WAIT_S,
    root_certificates: Path | None = None,
) -> list[str]:
    """The SuperNode flags (the same as docker-compose.yml's supernode services).

    Retries are unlimited in number and bounded in time per call (``max_wait_s``), so a node
    rides out a SuperLink restart; refusals (unknown key, TLS failure) end it at once.
    """
    if state.get("supernode", "flower") == "flowerbed":
        cmd = [bin_path("flowerbed"), "supernode", "--idle-poll", str(state["idle_poll"])]
    else:
        cmd = [bin_path("flower-supernode")]
    cmd += ["--superlink", state["address"],
           "--port", str(state["node_ports"][index]), "--max-wait-time", str(max_wait_s),
           "--node-config", f"partition-id={index} num-partitions={state['nodes']}"]  # fmt: skip
    if state.get("superexec", "flower") == "warm":  # its SuperExec is ours, a separate process
        cmd += ["--isolation", "process"]
    if insecure:
        return [*cmd, "--insecure"]
    ca = root_certificates or Path(state["dir"]) / "certs" / "ca.crt"
    cmd += ["--root-certificates", str(ca)]
    if key is not None:
        cmd += ["--auth-supernode-private-key", str(key)]
    return cmd


def superexec_command(state: FederationState, index: int) -> list[str]:
    """``flowerbed superexec`` for SuperNode ``index``'s runtime API (loopback, plain HTTP).

    The flags are Flower's ``flower-superexec`` flags; ``--parent-pid`` ties it to its SuperNode,
    as the SuperExec a SuperNode starts itself is tied (it exits when the node is gone).
    """
    node = state["processes"][f"supernode{index}"]["pid"]
    return [bin_path("flowerbed"), "superexec", "--insecure",
            "--runtime-api-address", f"127.0.0.1:{state['node_ports'][index]}",
            "--parent-pid", str(node)]  # fmt: skip


def flwr(
    args: list[str], state: FederationState, timeout: float = 120
) -> subprocess.CompletedProcess:
    """The ``flwr`` CLI against this federation (connection ``flowerbed``)."""
    return flwr_cli(args, Path(state["dir"]), timeout)


def _alive(state: FederationState) -> dict[str, bool]:
    return {name: is_same_process(ident) for name, ident in state["processes"].items()}


def flwr_home(directory: Path) -> Path:
    """The ``$FLWR_HOME`` every process of the federation in ``directory`` shares."""
    return Path(directory).resolve() / "flwr"


def _federation_env(directory: Path) -> dict[str, str]:
    """The environment of the federation's processes: one ``$FLWR_HOME`` (installed FABs), one
    machine cache for what every node derives alike (``clients/core/diskcache.py``)."""
    env = flower_env(directory)
    env["FLWR_HOME"] = str(flwr_home(directory))
    env["FLOWERBED_WORKSPACE"] = str(directory / "serverapp")
    env[CACHE_ENV] = str(flwr_home(directory) / "flowerbed-cache")
    return env


def up(
    nodes: int,
    directory: Path,
    insecure: bool = False,
    port: int | None = None,
    superexec: str = "warm",
    supernode: str = "flowerbed",
    idle_poll: float = 0.1,
) -> FederationState:
    """Start SuperLink + ``nodes`` SuperNodes on loopback; returns the saved state.

    ``supernode="flowerbed"``: each node is ``flowerbed supernode`` (Flower's SuperNode asking
    again after ``idle_poll`` s, then twice as long each time, instead of every 3 s when it finds
    no message); ``"flower"``: Flower's own.

    ``superexec="warm"``: each SuperNode runs with ``--isolation process`` beside its own
    ``flowerbed superexec`` (warm, forked ClientApp processes); ``"flower"``: each SuperNode
    starts Flower's ``flower-superexec`` itself (one ``flwr-clientapp`` process per message).
    A directory that held a federation before keeps its certificates, keys and SuperLink state
    (``state.db``): keys already registered stay registered.
    """
    if superexec not in SUPEREXECS:
        raise ConfigError(f"superexec must be one of {', '.join(SUPEREXECS)}, got '{superexec}'")
    if supernode not in SUPERNODES:
        raise ConfigError(f"supernode must be one of {', '.join(SUPERNODES)}, got '{supernode}'")
    if (problem := poll_problem("idle-poll", idle_poll)) is not None:
        raise ConfigError(problem)
    directory = directory.resolve()
    if _state_path(directory).is_file():
        old = load_state(directory)
        if any(_alive(old).values()):
            raise ConfigError(
                f"a federation is already running from {directory} (flowerbed deploy down)"
            )
        if old["insecure"] != insecure:
            raise ConfigError(
                f"{directory} holds a {'plaintext' if old['insecure'] else 'TLS'} federation; "
                f"use {'--insecure' if old['insecure'] else 'no --insecure'} or another --dir"
            )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".writable"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"--dir {directory} cannot be written ({exc.strerror or exc}); give a writable "
            "directory (allowed: a new or a flowerbed deploy directory you own)"
        ) from None
    port = port or free_port()
    state: FederationState = {
        "dir": str(directory), "nodes": nodes, "insecure": insecure, "port": port,
        "address": f"127.0.0.1:{port}", "node_ports": [free_port() for _ in range(nodes)],
        "processes": {}, "superexec": superexec, "supernode": supernode, "idle_poll": idle_poll,
    }  # fmt: skip
    env = _federation_env(directory)
    certs, keys = directory / "certs", directory / "keys"
    if not insecure:
        ensure_credentials(certs, keys, nodes)
    write_connection(directory / "flwr", state["address"], None if insecure else certs / "ca.crt")
    try:
        state["processes"]["superlink"] = _spawn(
            superlink_command(state), env, directory / "superlink.log"
        )
        _save(state)
        wait_for_port(port, state["processes"]["superlink"]["pid"])
        node_keys = [keys / f"supernode{i}" for i in range(nodes)]
        if not insecure:
            register_keys(
                directory, state["address"], certs / "ca.crt",
                [k.with_suffix(".pub") for k in node_keys],
            )  # fmt: skip
        for i in range(nodes):
            cmd = supernode_command(state, i, None if insecure else node_keys[i], insecure)
            state["processes"][f"supernode{i}"] = _spawn(cmd, env, directory / f"supernode{i}.log")
            _save(state)
            if superexec == "warm":
                state["processes"][f"superexec{i}"] = _spawn(
                    superexec_command(state, i), env, directory / f"superexec{i}.log"
                )
                _save(state)
    except BaseException:
        down(directory)
        raise
    return state


def restart_superlink(directory: Path) -> FederationState:
    """Start the SuperLink again on the same port and database (after a crash or a kill)."""
    directory = directory.resolve()
    state = load_state(directory)
    if is_same_process(state["processes"]["superlink"]):
        raise ConfigError(f"the SuperLink of {directory} is still running")
    env = _federation_env(directory)
    state["processes"]["superlink"] = _spawn(
        superlink_command(state), env, directory / "superlink.log"
    )
    _save(state)
    wait_for_port(state["port"], state["processes"]["superlink"]["pid"])
    return state


def status(directory: Path) -> FederationStatus:
    state = load_state(directory.resolve())
    alive = _alive(state)
    listing = (
        flwr(["supernode", "list", CONNECTION], state, timeout=60)
        if alive.get("superlink")
        else None
    )
    return {"state": state, "alive": alive, "supernodes": listing.stdout if listing else ""}


def down(directory: Path) -> dict[str, str]:
    """Stop the SuperNodes, then the SuperLink (and their SuperExecs).

    Only processes whose PID, start time and command line all match what ``up`` recorded are
    stopped; a PID now used by something else is left alone. Returns ``{name: outcome}``.
    """
    directory = directory.resolve()
    if not _state_path(directory).is_file():
        return {}
    state = load_state(directory)
    outcome = {}
    for name in sorted(state["processes"], key=lambda n: n == "superlink"):
        identity = state["processes"][name]
        if is_same_process(identity):
            stop_process_tree(identity["pid"])
            outcome[name] = "stopped"
        else:
            outcome[name] = "not running"
    _state_path(directory).unlink(missing_ok=True)
    return outcome
