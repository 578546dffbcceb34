"""The ``flowerbed`` commands: run, eval, list, show, new, sweep, superexec, supernode (``deploy``:
apps/cli/deploy.py). Module-level imports stay light (typer, rich): heavy libraries load when a
command needs them, after the progress display is up."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import typer
from rich.console import Console
from rich.table import Table as RichTable
from typer.core import TyperCommand

from flowerbed.apps.cli.errors import ErrorBoundary, console, fail, out
from flowerbed.apps.cli.flower_log import _quiet_flower
from flowerbed.apps.cli.orchestration import execute, prepare, raw_engine, raw_setting
from flowerbed.apps.cli.render import summary_view
from flowerbed.clients.core.errors import ConfigError

if TYPE_CHECKING:
    from flowerbed.clients.core.values import JsonValue
    from flowerbed.server.cells import Row

KINDS = (
    "experiments",
    "sweeps",
    "workloads",
    "strategies",
    "attacks",
    "malicious",
    "defenses",
    "datasets",
    "engines",
)  # fmt: skip  (apps/listing.py lists them; the tuple is here so `--help` imports nothing)


app = typer.Typer(
    cls=ErrorBoundary,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="flowerbed: federated-learning simulations for privacy and security research.",
)


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
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="show Flower's log (also in RUN_DIR/flower.log)")
    ] = False,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="simulation engine: run the ClientApp actors on this Ray cluster (auto | HOST:PORT)",
        ),
    ] = None,
) -> None:
    """Run one experiment and print its summary table."""
    from flowerbed.apps.progress import RunProgress

    forced: dict[str, JsonValue] = {"engine": engine, "seed": seed}
    if superlink is not None:
        deployment: dict[str, JsonValue] = {"superlink": superlink}
        if root_certificates is not None:
            deployment["root_certificates"] = str(root_certificates.resolve())
        forced["deployment"] = deployment
    if ray is not None:
        forced["simulation"] = {"ray_address": ray}
    overrides = overrides or []
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file (give a directory: new or empty)")
    with RunProgress(console) as progress, contextlib.ExitStack() as stack:
        progress.add_task(Path(experiment).stem, total=None)
        progress.status("checking the config and the data…")
        wanted = raw_engine(experiment, overrides, engine)
        address = ray or raw_setting(experiment, overrides, "simulation.ray_address")
        from flowerbed.apps.engines import ENGINES, booted

        # what the engine starts ahead boots while the config is checked: the simulation's
        # SuperLink, or its connection to a Ray cluster (simulation.ray_address)
        options = {"ray_address": str(address)} if wanted == "simulation" and address else {}
        started = stack.enter_context(booted(wanted, **options)) if wanted in ENGINES else None
        zygote = getattr(started, "preflight_zygote", None)  # forks it from warm imports
        resolved = prepare(experiment, overrides, wanted != "inline", zygote, **forced)
        from flowerbed.apps.preflight import load_warning

        warning = load_warning(resolved)
        if warning is not None:
            console.print(f"[bold yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
        progress.update(
            progress.task_ids[0], total=resolved.rounds,
            description=f"{resolved.experiment} [{resolved.engine}]",
        )  # fmt: skip
        from flowerbed.server.results import default_run_dir

        run_dir = out_dir.resolve() if out_dir is not None else default_run_dir(resolved)
        engine_fn = started if resolved.engine == wanted else None
        summary = execute(resolved, run_dir, progress, verbose, engine_fn)
    out.print(summary_view(summary))
    out.print(f"run directory: {run_dir}", soft_wrap=True)


@app.command("eval")
def eval_(
    run_dir: Annotated[Path, typer.Argument(help="a finished run directory (holds model.npz)")],
) -> None:
    """Evaluate a run's saved final model again (the workload's server-side evaluation)."""
    from flowerbed.server.runner import evaluate_saved

    metrics = evaluate_saved(run_dir)
    table = RichTable(title=f"{run_dir.name}: saved model")
    table.add_column("metric", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for key, value in sorted(metrics.items()):
        table.add_row(f"central.{key}", f"{value:.4g}")
    out.print(table)


@app.command("list")
def list_(
    kind: Annotated[str | None, typer.Argument(help=f"one of: {', '.join(KINDS)}")] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="experiments as the README's Markdown table")
    ] = False,
    long: Annotated[
        bool, typer.Option("--long", "-l", help="every kind as a table (descriptions, origins)")
    ] = False,
    plugin: Annotated[
        list[str] | None,
        typer.Option(help="import this plug-in first (a .py file or a module; repeat)"),
    ] = None,
) -> None:
    """List what can be run and what is registered (compact; a KIND or --long for descriptions)."""
    if markdown:
        from flowerbed.apps.listing import preset_table

        out.print(preset_table(), end="", highlight=False, markup=False, soft_wrap=True)
        return
    if kind is not None and kind not in KINDS:
        fail(f"unknown kind '{kind}' (allowed: {', '.join(KINDS)})")
    from flowerbed.apps.listing import compact, load_listed_plugins, tables

    load_listed_plugins(plugin or [])
    kinds = (kind,) if kind else KINDS
    # a console made now: its width follows the terminal (COLUMNS) of this call
    Console().print(
        tables(kinds) if kind or long else compact(kinds), soft_wrap=kind is None and not long
    )


@app.command()
def show(run_dir: Annotated[Path, typer.Argument(help="a run directory")]) -> None:
    """Re-print the summary table of a finished run."""
    path = run_dir / "summary.json"
    if not path.is_file():
        fail(f"no summary.json in {run_dir} (not a finished run directory)")
    Console().print(summary_view(json.loads(path.read_text())))  # this terminal's width


@app.command()
def new(
    kind: Annotated[
        str, typer.Argument(help="workload | attack | defense | strategy | experiment")
    ],
    name: Annotated[str, typer.Argument(help="its registration name, e.g. clip-noise")],
    directory: Annotated[
        Path | None, typer.Option("--dir", help="where to write it (default ./flowerbed-NAME)")
    ] = None,
    preset: Annotated[
        str | None, typer.Option("--from", help="new experiment: the preset to copy")
    ] = None,
) -> None:
    """Write an installable plug-in package (module, entry point, claim test, README), or an
    experiment YAML to edit (``new experiment NAME``: a copy of --from, default quickstart)."""
    from flowerbed.apps.scaffold import new_experiment, new_package

    if kind == "experiment":
        path = new_experiment(name, preset or "quickstart", directory)
        out.print(f"wrote {path}: flowerbed run {path}", soft_wrap=True)
        return
    if preset is not None:
        fail("--from goes with `new experiment` (a preset to copy)")
    root = new_package(kind, name, directory)
    out.print(f"wrote {root}: pip install -e {root} && flowerbed list", soft_wrap=True)


class _SweepCommand(TyperCommand):
    """``--ray`` takes an optional value: ``--ray`` alone means a local Ray instance.

    Typer cannot declare an option with an optional value; click can (``flag_value``).
    """

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, click.Option) and param.name == "ray":
                param.flag_value = "local"
                param._flag_needs_value = True  # click's marker for "the value may be omitted"


@app.command(cls=_SweepCommand)
def sweep(
    sweep_file: Annotated[
        str, typer.Argument(help="sweep YAML (or a preset name from configs/sweeps)")
    ],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="sweep directory (default sweeps-out/<name>)")
    ] = None,
    resume: Annotated[bool, typer.Option(help="skip the cells already finished in --out")] = False,
    ray: Annotated[
        str | None,
        typer.Option(
            metavar="[ADDRESS]",
            help="each cell a Ray task: alone, a local Ray instance on all cores; or auto, "
            "ray://HOST:PORT, HOST:PORT (an existing cluster)",
        ),
    ] = None,
    cpus_per_cell: Annotated[
        float | None, typer.Option(help="--ray: CPUs each cell reserves (default 1)")
    ] = None,
    gpus_per_cell: Annotated[
        float | None,
        typer.Option(help="--ray: GPUs each cell reserves, its tensors on CUDA (default 0)"),
    ] = None,
    cell_timeout: Annotated[
        float | None, typer.Option(help="--ray: seconds after which a running cell is failed")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="show Flower's logs")] = False,
) -> None:
    """Run a grid of cells in one engine start, or as Ray tasks; resumable; writes cells.csv,
    results.md, plots."""
    from flowerbed.apps.progress import RunProgress

    ray_options = None
    if ray is not None:
        from flowerbed.server.ray_sweep import RayOptions

        ray_options = RayOptions(
            ray, cpus_per_cell=1.0 if cpus_per_cell is None else cpus_per_cell,
            gpus_per_cell=gpus_per_cell or 0.0, cell_timeout=cell_timeout, verbose=verbose,
        )  # fmt: skip
    else:
        given = [
            name for name, value in (("--cpus-per-cell", cpus_per_cell),
            ("--gpus-per-cell", gpus_per_cell), ("--cell-timeout", cell_timeout))
            if value is not None
        ]  # fmt: skip
        if given:
            raise ConfigError(f"{given[0]} needs --ray (cells run as Ray tasks)")
    with RunProgress(console, unit="cells") as progress:
        task = progress.add_task(Path(sweep_file).stem, total=None)
        progress.status("checking the sweep and its cells…")
        from flowerbed.apps.inline import inline_grid
        from flowerbed.server.sweep import cells_of, finished_ids, load_sweep, run_sweep

        spec = load_sweep(sweep_file)
        out_path = (out_dir or Path("sweeps-out") / spec.name).resolve()
        total = len(cells_of(spec))
        done = len(finished_ids(out_path)) if resume else 0
        if spec.engine == "inline" or ray_options is not None:
            _quiet_flower(verbose)
        progress.update(task, total=total, completed=done, description=spec.name)
        where = "Ray tasks" if ray_options is not None else f"{spec.engine} engine"
        progress.status(f"{where}: running {total - done} cells…")

        def on_cell(row: Row) -> None:
            progress.update(task, advance=1)
            progress.status(f"last cell {row['id']}: {row['status']}")
            progress.metrics(row.get("metrics", {}))

        run_sweep(spec, out_path, inline_grid, resume=resume, on_cell=on_cell, ray=ray_options)
    out.print((out_path / "results.md").read_text())
    out.print(f"sweep directory: {out_path}", soft_wrap=True)


@app.command(
    "superexec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def superexec(
    ctx: typer.Context,
    warm_module: Annotated[
        list[str] | None, typer.Option(help="also import this module before forking (repeat)")
    ] = None,
) -> None:
    """Flower's SuperExec (any flower-superexec flag) with warm, forked ClientApp processes."""
    from flowerbed.apps.superexec import WARM_MODULES, run

    run(ctx.args, (*WARM_MODULES, *(warm_module or [])))


@app.command(
    "supernode", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def supernode(
    ctx: typer.Context,
    idle_poll: Annotated[
        float, typer.Option(help="seconds before the first pull after a message (Flower: 3)")
    ] = 0.1,
    idle_max: Annotated[
        float, typer.Option(help="each further empty pull waits twice as long, up to this")
    ] = 1.0,
    reply_poll: Annotated[
        float, typer.Option(help="seconds between looks for the ClientApp's reply (Flower: 0.5)")
    ] = 0.05,
    idle_backoff: Annotated[
        float, typer.Option(help="after this many idle seconds poll every 3 s, as Flower does")
    ] = 60.0,
) -> None:
    """Flower's SuperNode (any flower-supernode flag) asking for its next message after 0.1 s,
    0.2 s, 0.4 s, ... (up to --idle-max) instead of every 3 s."""
    from flowerbed.apps.supernode import PollClock, run
    from flowerbed.server.deploy import poll_problem

    for name, value in (("idle-poll", idle_poll), ("idle-max", idle_max), ("reply-poll", reply_poll)):  # fmt: skip
        if (problem := poll_problem(name, value)) is not None:
            fail(problem)
    if idle_max < idle_poll:
        fail(f"--idle-max ({idle_max}) must be >= --idle-poll ({idle_poll})")
    if idle_backoff < 0:
        fail(f"--idle-backoff must be >= 0 seconds, got {idle_backoff}")
    run(ctx.args, PollClock(idle_poll, reply_poll, idle_backoff, idle_max))
