"""A loopback federation: SuperLink + N SuperNodes as processes, with the flags of docker-compose.yml.

``up`` generates a CA, a server certificate (SAN 127.0.0.1, ::1, localhost) and one ECDSA P-384
key per SuperNode, starts the SuperLink with TLS and SuperNode authentication, registers the node
keys through the Control API and starts the SuperNodes. ``down`` stops everything by PID. State
(PIDs, ports, paths) lives in ``<dir>/state.json``; Flower's connection entry in
``<dir>/flwr/config.toml`` is named ``flowerbed``.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import psutil
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from flowerbed.clients.core.errors import ConfigError
from flowerbed.server.processes import (
    bin_path,
    flower_env,
    free_port,
    stop_process_tree,
    wait_for_port,
)

CONNECTION = "flowerbed"


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def make_certificates(
    cert_dir: Path, hosts: tuple[str, ...] = ("127.0.0.1", "::1", "localhost")
) -> None:
    """Self-signed CA and a CA-signed server certificate for the SuperLink."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flowerbed-ca")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name).public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    (cert_dir / "ca.crt").write_bytes(ca_cert.public_bytes(pem))
    (cert_dir / "flowerbed.server.pem").write_bytes(server_cert.public_bytes(pem))
    _write_private(
        cert_dir / "flowerbed.server.key",
        server_key.private_bytes(pem, serialization.PrivateFormat.TraditionalOpenSSL,
                                 serialization.NoEncryption()),
    )  # fmt: skip


def make_node_key(path: Path) -> None:
    """ECDSA P-384 key pair in OpenSSH format (what ``flwr supernode register`` accepts)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    _write_private(
        path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                          serialization.NoEncryption()),
    )  # fmt: skip
    path.with_suffix(".pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )


# ---- Flower connection -------------------------------------------------------------------------
def write_connection(flwr_home: Path, address: str, ca: Path | None) -> None:
    flwr_home.mkdir(parents=True, exist_ok=True)
    tls = f'root-certificates = "{ca}"' if ca else "insecure = true"
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "{address}"\n{tls}\n'
    )


def _state_path(directory: Path) -> Path:
    return directory / "state.json"


def load_state(directory: Path) -> dict[str, Any]:
    path = _state_path(directory)
    if not path.is_file():
        raise ConfigError(f"no loopback federation in {directory} (start one: flowerbed deploy up)")
    return json.loads(path.read_text())


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> int:
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc.pid


def supernode_command(
    state: dict[str, Any], index: int, key: Path | None, insecure: bool
) -> list[str]:
    """The SuperNode flags (the same as docker-compose.yml's supernode services)."""
    cmd = [bin_path("flower-supernode"), "--superlink", state["address"],
           "--port", str(state["node_ports"][index]), "--max-retries", "3", "--max-wait-time", "20",
           "--node-config", f"partition-id={index} num-partitions={state['nodes']}"]  # fmt: skip
    if insecure:
        return [*cmd, "--insecure"]
    cmd += ["--root-certificates", str(Path(state["dir"]) / "certs" / "ca.crt")]
    if key is not None:
        cmd += ["--auth-supernode-private-key", str(key)]
    return cmd


def flwr(
    args: list[str], state: dict[str, Any], timeout: float = 120
) -> subprocess.CompletedProcess:
    env = flower_env(Path(state["dir"]))
    env["FLWR_HOME"] = str(Path(state["dir"]) / "flwr")
    return subprocess.run(
        [bin_path("flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def up(
    nodes: int, directory: Path, insecure: bool = False, port: int | None = None
) -> dict[str, Any]:
    """Start SuperLink + ``nodes`` SuperNodes on loopback; returns the saved state."""
    directory = directory.resolve()
    if _state_path(directory).is_file() and any(
        psutil.pid_exists(p) for p in load_state(directory)["pids"].values()
    ):
        raise ConfigError(
            f"a federation is already running from {directory} (flowerbed deploy down)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    state: dict[str, Any] = {
        "dir": str(directory), "nodes": nodes, "insecure": insecure, "port": port,
        "address": f"127.0.0.1:{port}", "node_ports": [free_port() for _ in range(nodes)], "pids": {},
    }  # fmt: skip
    env = flower_env(directory)
    env["FLWR_HOME"] = str(directory / "flwr")
    certs = directory / "certs"
    link = [bin_path("flower-superlink"), "--host", "127.0.0.1", "--port", str(port),
            "--database", str(directory / "state.db"), "--disable-runtime-dependency-installation"]  # fmt: skip
    if insecure:
        link.append("--insecure")
        write_connection(directory / "flwr", state["address"], None)
    else:
        make_certificates(certs)
        link += ["--ssl-ca-certfile", str(certs / "ca.crt"), "--ssl-certfile", str(certs / "flowerbed.server.pem"),
                 "--ssl-keyfile", str(certs / "flowerbed.server.key"), "--enable-supernode-auth"]  # fmt: skip
        write_connection(directory / "flwr", state["address"], certs / "ca.crt")
    try:
        state["pids"]["superlink"] = _spawn(link, env, directory / "superlink.log")
        _save(state)
        wait_for_port(port, state["pids"]["superlink"])
        for i in range(nodes):
            key = None
            if not insecure:
                key = directory / "keys" / f"supernode{i}"
                make_node_key(key)
                done = flwr(
                    ["supernode", "register", str(key.with_suffix(".pub")), CONNECTION], state
                )
                if done.returncode != 0:
                    raise RuntimeError(
                        f"registering supernode{i} failed: {done.stdout}{done.stderr}"
                    )
            cmd = supernode_command(state, i, key, insecure)
            state["pids"][f"supernode{i}"] = _spawn(cmd, env, directory / f"supernode{i}.log")
            _save(state)
    except BaseException:
        down(directory)
        raise
    return state


def _save(state: dict[str, Any]) -> None:
    path = _state_path(Path(state["dir"]))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)


def status(directory: Path) -> dict[str, Any]:
    state = load_state(directory.resolve())
    alive = {name: psutil.pid_exists(pid) for name, pid in state["pids"].items()}
    listing = (
        flwr(["supernode", "list", CONNECTION], state, timeout=60)
        if alive.get("superlink")
        else None
    )
    return {"state": state, "alive": alive, "supernodes": listing.stdout if listing else ""}


def down(directory: Path) -> list[str]:
    """Stop SuperNodes, then the SuperLink (and their SuperExecs), by PID."""
    directory = directory.resolve()
    if not _state_path(directory).is_file():
        return []
    state = load_state(directory)
    names = sorted(state["pids"], key=lambda n: n == "superlink")
    for name in names:
        stop_process_tree(state["pids"][name])
    _state_path(directory).unlink()
    return names
