"""The ``flowerbed`` command line: run, list, show (and the subcommands other areas add)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable

from flowerbed.clients.core.errors import ConfigError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="flowerbed: federated-learning simulations for privacy and security research.",
)
console = Console(stderr=True)
out = Console()

KINDS = ("experiments", "workloads", "strategies", "attacks", "defenses", "datasets", "engines")


def fail(message: str) -> None:
    """One-line error, exit status 2."""
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _quiet_flower(verbose: bool) -> None:
    import flwr.clientapp  # noqa: F401 - configure Flower's logger before adjusting it
    import flwr.serverapp  # noqa: F401

    level = logging.INFO if verbose else logging.WARNING
    logging.getLogger("flwr").setLevel(level)
    for handler in logging.getLogger("flwr").handlers:
        handler.setLevel(level)


def summary_table(summary: dict) -> RichTable:
    table = RichTable(
        title=f"{summary['experiment']} ({summary['engine']}, seed {summary['seed']})"
    )
    table.add_column("metric")
    table.add_column("final", justify="right")
    for key, value in summary["metrics"].items():
        table.add_row(key, f"{value:.4g}")
    table.caption = (
        f"{summary['rounds']} rounds, {summary['clients']} clients, {summary['wall_s']} s, "
        f"failed replies per round: {summary.get('failures_per_round', [])}"
    )
    return table


def prepare(experiment: str, overrides: list[str], **forced) -> dict:
    """Resolve and pre-flight a config (dataset readable, workload constructible)."""
    from flowerbed.clients.datasets import load_table
    from flowerbed.clients.workloads import WORKLOADS
    from flowerbed.server.experiment import load_experiment

    cfg = load_experiment(experiment, overrides, **forced)
    try:
        load_table(cfg["dataset"])
    except (FileNotFoundError, OSError) as exc:
        raise ConfigError(f"dataset '{cfg['dataset']['name']}' could not be read: {exc}") from None
    WORKLOADS.get(cfg["workload"]["name"])(cfg)
    return cfg


def execute(cfg: dict, run_dir: Path, verbose: bool = False) -> dict:
    """Run a resolved config on its engine with a progress bar; remove the run dir on failure."""
    from flowerbed.apps.engines import get_engine

    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"run directory {run_dir} already exists and is not empty")
    engine = get_engine(cfg["engine"])
    _quiet_flower(verbose)
    created = not run_dir.exists()
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console, transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task(
            f"{cfg['experiment']} [{cfg['engine']}]", total=cfg["rounds"], info=""
        )

        def on_round(server_round: int, final: dict) -> None:
            shown = [
                f"{k}={v:.3g}"
                for k, v in final.items()
                if k.split(".")[0] in ("eval", "central", "attack")
            ]
            progress.update(task, completed=server_round, info=" ".join(shown[:3]))

        try:
            return engine(cfg, run_dir, on_round=on_round)
        except BaseException:
            if created:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise


@app.command()
def run(
    experiment: Annotated[
        str, typer.Argument(help="preset name (flowerbed list experiments) or a YAML path")
    ],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotlist overrides, e.g. rounds=5 clients.num=100")
    ] = None,
    engine: Annotated[
        str | None, typer.Option(help="simulation (Ray, default) | inline | deployment")
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="run directory (default runs/<time>-<experiment>)")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="experiment seed")] = None,
    superlink: Annotated[
        str | None, typer.Option(help="deployment engine: HOST:PORT of a SuperLink")
    ] = None,
    root_certificates: Annotated[
        Path | None, typer.Option(help="deployment engine: CA certificate")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="show Flower's logs")] = False,
) -> None:
    """Run one experiment and print its summary table."""
    from flowerbed.server.results import default_run_dir

    try:
        forced = {"engine": engine, "seed": seed}
        if superlink is not None:
            forced["deployment"] = {"superlink": superlink}
            if root_certificates is not None:
                forced["deployment"]["root_certificates"] = str(root_certificates.resolve())
        cfg = prepare(experiment, overrides or [], **forced)
        run_dir = out_dir.resolve() if out_dir is not None else default_run_dir(cfg)
        summary = execute(cfg, run_dir, verbose)
    except ConfigError as exc:
        fail(str(exc))
        return
    out.print(summary_table(summary))
    out.print(f"run directory: {run_dir}")


def preset_table() -> str:
    """The experiment presets as a Markdown table (the README's table is this, checked by a test)."""
    from flowerbed.clients.core.config import load_preset, preset_names

    rows = [f"| `{name}` | {load_preset(name).get('description', '')} |" for name in preset_names()]
    return "\n".join(["| preset | what it runs |", "|---|---|", *rows]) + "\n"


@app.command("list")
def list_(
    kind: Annotated[str | None, typer.Argument(help=f"one of: {', '.join(KINDS)}")] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="experiments as the README's Markdown table")
    ] = False,
) -> None:
    """List what is registered, each with a one-line description."""
    if markdown:
        out.print(preset_table(), end="", highlight=False, markup=False, soft_wrap=True)
        return
    from flowerbed.apps.engines import ENGINES
    from flowerbed.clients.core.config import load_preset, preset_names
    from flowerbed.server.experiment import COMPONENTS

    if kind is not None and kind not in KINDS:
        fail(f"unknown kind '{kind}' (allowed: {', '.join(KINDS)})")
    registries = {
        "workloads": COMPONENTS.workloads, "strategies": COMPONENTS.strategies,
        "attacks": COMPONENTS.attacks, "defenses": COMPONENTS.defenses,
        "datasets": COMPONENTS.datasets,
    }  # fmt: skip
    for name in [kind] if kind else KINDS:
        table = RichTable(title=name, show_header=False, title_justify="left")
        if name == "experiments":
            for preset in preset_names():
                table.add_row(preset, str(load_preset(preset).get("description", "")))
        elif name == "engines":
            for engine_name, (_, _, help_text) in ENGINES.items():
                table.add_row(engine_name, help_text)
        elif name in ("attacks", "defenses"):  # with the workloads each one runs on
            for entry, cls in registries[name].items():
                table.add_row(entry, cls.description, _runs_on(cls, COMPONENTS.workloads))
        else:
            for entry, cls in registries[name].items():
                table.add_row(entry, cls.description)
        out.print(table)


def _runs_on(cls: type, workloads: Any) -> str:
    """``on: tabdiff, tabular-mlp`` (the workloads whose offers fit ``cls.needs``)."""
    from flowerbed.clients.core.capabilities import alternatives, supported_workloads

    needs = getattr(cls, "needs", ())
    if not any(alternatives(needs)):
        return "on: any workload"
    return "on: " + (", ".join(supported_workloads(needs, workloads.items())) or "none")


@app.command()
def show(run_dir: Annotated[Path, typer.Argument(help="a run directory")]) -> None:
    """Re-print the summary table of a finished run."""
    path = run_dir / "summary.json"
    if not path.is_file():
        fail(f"no summary.json in {run_dir} (not a finished run directory)")
    out.print(summary_table(json.loads(path.read_text())))


@app.command()
def sweep(
    sweep_file: Annotated[
        str, typer.Argument(help="sweep YAML (or a preset name from configs/sweeps)")
    ],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="sweep directory (default sweeps-out/<name>)")
    ] = None,
    resume: Annotated[bool, typer.Option(help="skip the cells already finished in --out")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="show Flower's logs")] = False,
) -> None:
    """Run a grid of cells in one engine start; resumable; writes cells.csv, results.md, plots."""
    from flowerbed.apps.inline import inline_grid
    from flowerbed.server.sweep import cells_of, finished_ids, load_sweep, run_sweep

    try:
        spec = load_sweep(sweep_file)
        out_path = (out_dir or Path("sweeps-out") / spec.name).resolve()
        total = len(cells_of(spec))
        done = len(finished_ids(out_path)) if resume else 0
        _quiet_flower(verbose)
        with Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} cells"),
            TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console, transient=True,
        ) as progress:  # fmt: skip
            task = progress.add_task(spec.name, total=total, completed=done, info="")

            def on_cell(row: dict) -> None:
                progress.update(task, advance=1, info=f"{row['id']} {row['status']}")

            run_sweep(spec, out_path, inline_grid, resume=resume, on_cell=on_cell)
    except ConfigError as exc:
        fail(str(exc))
        return
    out.print((out_path / "results.md").read_text())
    out.print(f"sweep directory: {out_path}")


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
) -> None:
    """Start SuperLink + N SuperNodes on loopback (TLS and SuperNode auth unless --insecure)."""
    from flowerbed.server.deploy import up

    if nodes < 1:
        fail("--nodes must be >= 1")
    try:
        state = up(nodes, directory, insecure=insecure)
    except ConfigError as exc:
        fail(str(exc))
        return
    mode = "insecure" if insecure else "TLS + SuperNode auth"
    out.print(f"SuperLink {state['address']} ({mode}), {nodes} SuperNodes; state in {state['dir']}")
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
        out.print(
            f"{name:12s} pid {info['state']['pids'][name]:>7}  {'alive' if alive else 'stopped'}"
        )
    out.print(info["supernodes"])


@deploy_app.command("down")
def deploy_down(directory: Annotated[Path, DEPLOY_DIR] = Path(".flowerbed/deploy")) -> None:
    """Stop everything `deploy up` started, by PID."""
    from flowerbed.server.deploy import down

    stopped = down(directory)
    out.print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


@deploy_app.command("certs")
def deploy_certs(
    nodes: Annotated[int, typer.Option(help="node keys to generate")] = 2,
    certs: Annotated[Path, typer.Option(help="folder for ca.crt, server.pem, server.key")] = Path(
        "certs"
    ),
    keys: Annotated[Path, typer.Option(help="folder for supernodeN / supernodeN.pub")] = Path(
        "keys"
    ),
    host: Annotated[
        list[str] | None, typer.Option(help="SuperLink names/IPs for the certificate")
    ] = None,
) -> None:
    """Write a CA, a SuperLink certificate and SuperNode keys (used by docker-compose.yml)."""
    from flowerbed.server.deploy import make_certificates, make_node_key

    if (certs / "ca.crt").is_file():
        out.print(f"{certs}/ca.crt exists; keeping the existing certificates and keys")
        return
    make_certificates(certs, tuple(host or ["127.0.0.1", "::1", "localhost"]))
    for i in range(nodes):
        make_node_key(keys / f"supernode{i}")
    out.print(f"wrote {certs}/ca.crt, server.pem, server.key and {nodes} node keys in {keys}")


@deploy_app.command("register")
def deploy_register(
    public_keys: Annotated[
        list[Path], typer.Argument(help="SuperNode public keys (OpenSSH, ECDSA P-384)")
    ],
    superlink: Annotated[str, typer.Option(help="HOST:PORT of the SuperLink")] = "127.0.0.1:8000",
    root_certificates: Annotated[
        Path | None, typer.Option(help="CA certificate (omit for --insecure)")
    ] = None,
    retries: Annotated[int, typer.Option(help="attempts while the SuperLink starts")] = 30,
) -> None:
    """Register SuperNode public keys with a SuperLink's Control API."""
    import tempfile
    import time

    from flowerbed.server.deploy import register_keys

    with tempfile.TemporaryDirectory() as home:
        for attempt in range(retries):
            try:
                register_keys(Path(home), superlink, root_certificates, public_keys)
                out.print(f"registered {len(public_keys)} SuperNode keys with {superlink}")
                return
            except RuntimeError as exc:
                if attempt == retries - 1:
                    fail(str(exc).splitlines()[0])
                time.sleep(2)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
