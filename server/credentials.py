"""What a TLS federation with SuperNode authentication needs: a CA, the SuperLink's certificate
and one ECDSA P-384 key per SuperNode, written with the modes (and owner) Flower's images
expect; what exists is kept (``flowerbed deploy certs``, ``deploy up``)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from flowerbed.clients.core.errors import ConfigError


def _write_file(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    if owner is not None:
        os.chown(tmp, *owner)
    os.replace(tmp, path)


def make_certificates(
    cert_dir: Path,
    hosts: Sequence[str] = ("127.0.0.1", "::1", "localhost"),
    owner: tuple[int, int] | None = None,
) -> None:
    """Self-signed CA and a CA-signed server certificate: ``ca.crt``, ``server.pem``, ``server.key``.

    ``owner`` (uid, gid) hands the files to the account that reads them (uid 49999, ``app``, in
    Flower's images); the private key is mode 600, the certificates 644.
    """
    cert_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flowerbed-ca")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
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
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    key_bytes = server_key.private_bytes(
        pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    _write_file(cert_dir / "server.key", key_bytes, 0o600, owner)
    _write_file(cert_dir / "server.pem", server_cert.public_bytes(pem), 0o644, owner)
    _write_file(cert_dir / "ca.crt", ca_cert.public_bytes(pem), 0o644, owner)  # last: "done"


def make_node_key(path: Path, owner: tuple[int, int] | None = None) -> None:
    """ECDSA P-384 key pair in OpenSSH format (what ``flwr supernode register`` accepts)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )  # fmt: skip
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    _write_file(path, private, 0o600, owner)
    _write_file(path.with_suffix(".pub"), public, 0o644, owner)


def ensure_credentials(
    certs: Path,
    keys: Path,
    nodes: int,
    hosts: Sequence[str] = ("127.0.0.1", "::1", "localhost"),
    owner: tuple[int, int] | None = None,
) -> list[str]:
    """Create what is missing (CA + server certificate, ``supernode<i>`` keys); keep the rest.

    Keeping existing files is what lets a persisted SuperLink state (registered keys) survive a
    restart. Returns the names of the files written.
    """
    written = []
    if not (certs / "ca.crt").is_file():
        make_certificates(certs, hosts, owner)
        written.append("ca.crt")
    for i in range(nodes):
        key = keys / f"supernode{i}"
        if not (key.is_file() and key.with_suffix(".pub").is_file()):
            make_node_key(key, owner)
            written.append(key.name)
    for folder in (certs, keys):
        if owner is not None and folder.is_dir():
            os.chown(folder, *owner)
    return written


def parse_owner(text: str) -> tuple[int, int]:
    """``UID[:GID]`` -> (uid, gid); a one-line error otherwise."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or min(parts) < 0:
        raise ConfigError(f"--owner must be UID or UID:GID (numbers), got '{text}'")
    return parts[0], parts[-1]
