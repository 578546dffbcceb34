"""The ``flowerbed`` command line: run, eval, list, show, sweep (and the subcommands other areas add).

One error boundary (:class:`ErrorBoundary`) covers every command: a user-caused error
(``ConfigError``: config, YAML, data, connection, TLS) is one line and exit status 2, a run that
could not go on (``RunFailed``) one line and exit 1, anything else a short traceback and exit 1.
Module-level imports stay light (typer, rich): heavy libraries load when a command needs them,
after the progress display is up.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table as RichTable
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from flowerbed.clients.core.errors import ConfigError, RunFailed

console = Console(stderr=True)
out = Console()

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
#: frames of an internal error's traceback that are printed (the innermost ones)
TRACEBACK_FRAMES = 8


def error_line(message: str) -> None:
    """Print ``error: message`` on stderr, on one line."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def fail(message: str) -> None:
    """One-line error, exit status 2."""
    error_line(message)
    raise typer.Exit(2)


class ErrorBoundary(TyperGroup):
    """Every command runs inside this: user errors are one line, internal errors a short traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            error_line(str(exc))
            raise typer.Exit(2) from None
        except RunFailed as exc:
            error_line(str(exc))
            raise typer.Exit(1) from None
        except (click.exceptions.Exit, click.ClickException, click.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError:  # `flowerbed list | head`: the reader left, nothing is wrong
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(141) from None
        except Exception as exc:  # noqa: BLE001 - a bug: show where, without locals, exit 1
            traceback.print_exception(exc, limit=-TRACEBACK_FRAMES, file=sys.stderr)
            error_line(f"internal error ({type(exc).__name__}); the traceback above shows where")
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=ErrorBoundary,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="flowerbed: federated-learning simulations for privacy and security research.",
)


class _RunLog(logging.FileHandler):
    """Flower's log of an in-process run, appended to ``RUN_DIR/flower.log`` (where the other
    engines write theirs); the file is opened when the first line comes, once the run directory
    exists (a line before that is dropped, never printed)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, delay=True)
        self.setLevel(logging.INFO)
        self.setFormatter(logging.Formatter("%(levelname)s %(asctime)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None and not Path(self.baseFilename).parent.is_dir():
            return
        super().emit(record)


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` that hands the warning to the ``py.warnings`` logger."""
    text = warnings.formatwarning(message, category, filename, lineno, line)
    logging.getLogger("py.warnings").warning("%s", text.rstrip())


#: Python's own warning printer (``-v`` keeps it)
_PRINT_WARNING = warnings.showwarning


def _quiet_flower(verbose: bool, log_path: Path | None = None) -> logging.Handler | None:
    """Flower's log at INFO: on the console only with ``-v`` (its own handler, no propagation),
    always in ``log_path`` when given, so its warnings (``fraction_evaluate is set to 0.0``)
    never land in the middle of the progress display; Python warnings of third-party code
    (Opacus' secure RNG, torch's backward hooks) go the same way unless ``-v``. Returns the file
    handler to remove."""
    import flwr.clientapp  # noqa: F401 - configure Flower's logger before adjusting it
    import flwr.serverapp  # noqa: F401

    logger = logging.getLogger("flwr")
    logger.setLevel(logging.INFO if verbose or log_path is not None else logging.WARNING)
    logger.propagate = False
    for handler in logger.handlers:
        if not isinstance(handler, _RunLog):
            handler.setLevel(logging.INFO if verbose else logging.CRITICAL + 1)
    warned = logging.getLogger("py.warnings")  # third-party warnings (Opacus, torch): the log
    # set on every call, not through logging.captureWarnings: that one does nothing once it has
    # run in this process, so a warnings.catch_warnings() around an earlier call (which restores
    # the printer on exit) would leave later runs printing warnings to the terminal
    warnings.showwarning = _PRINT_WARNING if verbose else _log_warning
    warned.propagate = False
    if not any(isinstance(h, logging.NullHandler) for h in warned.handlers):
        warned.addHandler(logging.NullHandler())  # never logging's last-resort stderr printer
    if log_path is None:
        return None
    handler = _RunLog(log_path)
    logger.addHandler(handler)
    warned.addHandler(handler)
    return handler


def summary_view(summary: dict) -> Group:
    """The summary table, then one line of counts and timings (never a wrapped caption)."""
    table = RichTable(
        title=f"{summary['experiment']} ({summary['engine']}, seed {summary['seed']})"
    )
    table.add_column("metric", no_wrap=True, overflow="fold")
    table.add_column("final", justify="right", no_wrap=True)
    for key, value in summary["metrics"].items():
        table.add_row(key, f"{value:.4g}")
    overrides = " ".join(summary.get("overrides", []))
    shown = [Text(f"overrides: {overrides}")] if overrides else []
    return Group(table, *shown, Text(summary_caption(summary)))


def summary_caption(summary: dict) -> str:
    """``3 rounds, 10 clients; 24.1 s (start-up 9.2 s); failed replies: none``."""
    per_round = summary.get("failures_per_round", [])
    failed = [f"round {i}: {n}" for i, n in enumerate(per_round, start=1) if n]
    failures = f"{sum(per_round)} ({', '.join(failed)})" if failed else "none"
    timing = f"{summary['wall_s']} s"
    if "startup_s" in summary:
        timing += f" (start-up {summary['startup_s']} s)"
    from flowerbed.server.results import dropped_note

    return (
        f"{summary['rounds']} rounds, {summary['clients']} clients; {timing}; "
        f"failed replies: {failures}{dropped_note(summary)}"
    )


def prepare(experiment: str, overrides: list[str], isolated: bool = False, **forced: Any) -> dict:
    """Resolve and pre-flight a config (dataset readable, workload constructible).

    ``isolated``: in a child process, so the heavy imports and the dataset do not stay resident
    in this process while another process runs the experiment.
    """
    from flowerbed.apps.preflight import preflight, preflight_in_child

    forced = {k: v for k, v in forced.items() if v is not None}
    if isolated:
        return preflight_in_child(experiment, overrides, forced)
    return preflight(experiment, overrides, forced)


def raw_engine(experiment: str, overrides: list[str], engine: str | None) -> str:
    """The engine a config asks for, read without resolving it (which imports the registries)."""
    if engine is not None:
        return engine
    return str(raw_setting(experiment, overrides, "engine") or "simulation")


def raw_setting(experiment: str, overrides: list[str], dotted: str) -> Any:
    """A key of a config (overrides first, then the preset or file), read without resolving it."""
    from flowerbed.clients.core.config import load_base, parse_overrides
    from flowerbed.clients.core.files import dotted_get

    missing = object()
    for layer in (parse_overrides(overrides), load_base(experiment)):
        value = dotted_get(layer, dotted, missing)
        if value is not missing:
            return value
    return None


def execute(
    cfg: dict, run_dir: Path, progress: Any = None, verbose: bool = False, engine: Any = None
) -> dict:
    """Run a resolved config on its engine; remove the run directory if the input was at fault.

    ``engine``: the engine booted before the config was checked (``apps.engines.booted``); by
    default the config's engine.
    """
    from flowerbed.apps.engines import get_engine

    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(
            f"run directory {run_dir} is a file (--out takes a directory: new or empty)"
        )
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"run directory {run_dir} already exists and is not empty")
    engine = engine or get_engine(cfg["engine"])
    created = not run_dir.exists()
    log_handler = None
    if cfg["engine"] == "inline":  # Flower logs in this process (elsewhere: RUN_DIR/flower.log)
        log_handler = _quiet_flower(verbose, run_dir / "flower.log")
    rounds = cfg["rounds"]
    tail = LogTail(run_dir / "flower.log") if verbose and cfg["engine"] != "inline" else None

    def on_round(server_round: int, final: dict) -> None:
        if progress is not None:
            progress.update(progress.task_ids[0], completed=server_round)
            progress.metrics(final)
            if server_round < rounds:
                progress.status(f"round {server_round + 1}/{rounds}…")
        if tail is not None:
            tail.flush()

    def on_status(text: str) -> None:
        if progress is not None:
            progress.status(text)
        if tail is not None:
            tail.flush()

    try:
        summary = engine(cfg, run_dir, on_round=on_round, on_status=on_status)
    except ConfigError:
        _remove(run_dir, created)
        raise
    except RunFailed:
        raise
    except Exception as exc:
        cause = _recorded_cause(run_dir)
        if cause is not None:
            kind, message = cause
            if kind == "config":
                _remove(run_dir, created)
                raise ConfigError(message) from None
            raise RunFailed(f"{message} (log: {run_dir / 'flower.log'})") from None
        from flowerbed.server.processes import user_problem

        problem = None
        if cfg["engine"] == "deployment":  # a SuperLink the user pointed us at
            problem = user_problem(run_dir / "flower.log", exc, cfg["deployment"])
        if problem is not None:
            _remove(run_dir, created)
            raise ConfigError(problem) from None
        raise
    except BaseException:  # Ctrl-C, SIGTERM: an unfinished run leaves nothing behind
        _remove(run_dir, created)
        raise
    finally:
        if tail is not None:
            tail.flush()
        if log_handler is not None:
            logging.getLogger("flwr").removeHandler(log_handler)
            logging.getLogger("py.warnings").removeHandler(log_handler)
            log_handler.close()
    return summary


def _recorded_cause(run_dir: Path) -> tuple[str, str] | None:
    from flowerbed.server.results import ERROR_FILE

    path = run_dir / ERROR_FILE
    if not path.is_file():
        return None
    kind, _, message = path.read_text().strip().partition(": ")
    return kind, message


def _remove(run_dir: Path, created: bool) -> None:
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)


class LogTail:
    """Prints the lines appended to Flower's log (``-v``), each once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def flush(self) -> None:
        if not self.path.is_file():
            return
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def _record_start() -> None:
    """Let the run's processes measure ``wall_s`` and ``startup_s`` from this command's start."""
    from flowerbed.server.results import STARTED_AT_ENV

    os.environ.setdefault(STARTED_AT_ENV, repr(process_start()))


def process_start() -> float:
    """When this process started (epoch seconds, to the clock tick on Linux).

    ``psutil``'s ``create_time`` adds the start tick to the boot time, which Linux gives in whole
    seconds; the process's age from ``/proc`` (uptime minus start tick) has no such error.
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        import psutil

        return psutil.Process().create_time()


def _terminate_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so engines stop the processes they started."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


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

    forced: dict[str, Any] = {"engine": engine, "seed": seed}
    if superlink is not None:
        forced["deployment"] = {"superlink": superlink}
        if root_certificates is not None:
            forced["deployment"]["root_certificates"] = str(root_certificates.resolve())
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
        cfg = prepare(experiment, overrides, isolated=wanted != "inline", **forced)
        from flowerbed.apps.preflight import load_warning

        warning = load_warning(cfg)
        if warning is not None:
            console.print(f"[bold yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
        progress.update(
            progress.task_ids[0], total=cfg["rounds"],
            description=f"{cfg['experiment']} [{cfg['engine']}]",
        )  # fmt: skip
        from flowerbed.server.results import default_run_dir

        run_dir = out_dir.resolve() if out_dir is not None else default_run_dir(cfg)
        engine_fn = started if cfg["engine"] == wanted else None
        summary = execute(cfg, run_dir, progress, verbose, engine_fn)
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
            if param.name == "ray":
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

        def on_cell(row: dict) -> None:
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

    from flowerbed.server.deploy import ensure_credentials, parse_owner

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


def main() -> None:
    """The ``flowerbed`` console script.

    It ends with ``os._exit``: by then every file is closed and every process it started is
    stopped, and skipping the interpreter's teardown of torch and thousands of modules saves
    about 1.5 s of CPU per command.
    """
    _record_start()
    _terminate_on_sigterm()
    try:
        app()
        code: int | str | None = 0
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):
        error_line(code)
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    main()
