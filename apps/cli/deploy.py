"""``flowerbed deploy``: a loopback federation (SuperLink + SuperNodes), its certificates and keys."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flowerbed.apps.cli.commands import app
from flowerbed.apps.cli.errors import fail, out
from flowerbed.clients.core.errors import ConfigError

deploy_app = typer.Typer(
    no_args_is_help=True, help="A loopback federation (SuperLink + SuperNodes)."
)
app.add_typer(deploy_app, name="deploy")
DEPLOY_DIR = typer.Option("--dir", help="where certificates, keys, logs and PIDs are kept")


@deploy_app.command("up")
def deploy_up(
    nodes: Annotated[int, typer.Option(help="number of SuperNodes (partition ids 0..N-1)")] = 2,
    insecure: Annotated[bool, typer.Option(help="no TLS and no SuperNode authentication")] = False,
    directory: Annotated[Path, DEPLOY_DIR] = Path(".flowerbed/deploy"),
    superexec: Annotated[
        str, typer.Option(help="warm (flowerbed superexec, forked ClientApps) | flower")
    ] = "warm",
    supernode: Annotated[
        str, typer.Option(help="flowerbed (Flower's SuperNode, short polls) | flower")
    ] = "flowerbed",
    idle_poll: Annotated[
        float, typer.Option(help="flowerbed supernode: first wait after a message (Flower: 3 s)")
    ] = 0.1,
) -> None:
    """Start SuperLink + N SuperNodes on loopback (TLS and SuperNode auth unless --insecure)."""
    from flowerbed.server.deploy import RegistrationError, up

    if nodes < 1:
        fail("--nodes must be >= 1")
    try:
        state = up(nodes, directory, insecure=insecure, superexec=superexec,
                   supernode=supernode, idle_poll=idle_poll)  # fmt: skip
    except (ConfigError, RegistrationError) as exc:
        fail(str(exc))
        return
    mode = "insecure" if insecure else "TLS + SuperNode auth"
    out.print(
        f"SuperLink {state['address']} ({mode}), {nodes} SuperNodes; state in {state['dir']}",
        soft_wrap=True,
    )
    out.print(f"run on it: flowerbed run quickstart clients.num={nodes} --engine deployment")


@deploy_app.command("status")
def deploy_status(directory: Annotated[Path, DEPLOY_DIR] = Path(".flowerbed/deploy")) -> None:
    """Show which processes are alive and the SuperNodes the SuperLink knows."""
    from flowerbed.server.deploy import status

    try:
        info = status(directory)
    except ConfigError as exc:
        fail(str(exc))
        return
    for name, alive in info["alive"].items():
        pid = info["state"]["processes"][name]["pid"]
        out.print(f"{name:12s} pid {pid:>7}  {'alive' if alive else 'stopped'}")
    out.print(info["supernodes"])


@deploy_app.command("down")
def deploy_down(directory: Annotated[Path, DEPLOY_DIR] = Path(".flowerbed/deploy")) -> None:
    """Stop what `deploy up` started (only processes whose PID, start time and command match)."""
    from flowerbed.server.deploy import down

    outcome = down(directory)
    if not outcome:
        out.print("nothing was running")
    for name, what in outcome.items():
        out.print(f"{name:12s} {what}")


@deploy_app.command("certs")
def deploy_certs(
    nodes: Annotated[int, typer.Option(help="node keys to have (supernode0..N-1)")] = 2,
    certs: Annotated[Path, typer.Option(help="folder for ca.crt, server.pem, server.key")] = Path(
        "certs"
    ),
    keys: Annotated[Path, typer.Option(help="folder for supernodeN / supernodeN.pub")] = Path(
        "keys"
    ),
    host: Annotated[
        list[str] | None, typer.Option(help="SuperLink names/IPs for the certificate")
    ] = None,
    owner: Annotated[
        str | None, typer.Option(help="UID[:GID] to own the files (49999 in Flower's images)")
    ] = None,
    export: Annotated[
        Path | None, typer.Option(help="also copy ca.crt (public) into this folder")
    ] = None,
) -> None:
    """Write what is missing of a CA, a SuperLink certificate and SuperNode keys; keep the rest."""
    import shutil

    from flowerbed.server.credentials import ensure_credentials, parse_owner

    try:
        uid_gid = parse_owner(owner) if owner else None
        written = ensure_credentials(
            certs, keys, nodes, tuple(host or ["127.0.0.1", "::1", "localhost"]), uid_gid
        )
        if export is not None:
            export.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(certs / "ca.crt", export / "ca.crt")
            (export / "ca.crt").chmod(0o644)
    except (ConfigError, OSError) as exc:
        fail(f"writing certificates failed: {exc}")
        return
    kept = "nothing new" if not written else ", ".join(written)
    out.print(f"certificates in {certs}, {nodes} node keys in {keys} (written: {kept})")


@deploy_app.command("register")
def deploy_register(
    public_keys: Annotated[
        list[Path], typer.Argument(help="SuperNode public keys (OpenSSH, ECDSA P-384)")
    ],
    superlink: Annotated[str, typer.Option(help="HOST:PORT of the SuperLink")] = "127.0.0.1:8000",
    root_certificates: Annotated[
        Path | None, typer.Option(help="CA certificate (omit for an insecure SuperLink)")
    ] = None,
    retries: Annotated[int, typer.Option(help="attempts while the SuperLink starts")] = 30,
) -> None:
    """Register SuperNode public keys with a SuperLink's Control API (known keys are fine)."""
    import tempfile
    import time

    from flowerbed.server.deploy import RegistrationError, register_keys

    with tempfile.TemporaryDirectory() as home:
        for attempt in range(max(retries, 1)):
            try:
                outcome = register_keys(Path(home), superlink, root_certificates, public_keys)
            except ConfigError as exc:
                fail(str(exc))
                return
            except RegistrationError as exc:
                if attempt == max(retries, 1) - 1:
                    fail(f"{exc} (is the SuperLink up, and is this its CA?)")
                time.sleep(2)
                continue
            for key, what in outcome.items():
                out.print(f"{key}: {what}", soft_wrap=True)
            return
