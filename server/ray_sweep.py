"""Sweep cells as Ray tasks, on a local Ray instance (all cores) or an existing cluster.

Each cell is one task (``--cpus-per-cell``, ``--gpus-per-cell``; never retried) that runs the cell
on the inline engine in a private temporary directory and returns its ``cells.jsonl`` row and the
files of its run directory. The driver keeps as many cells in flight as the cluster holds, installs
each result under ``out/cells/<id>`` and appends its row (fsynced) as it arrives, so ``--resume``
works across executors and a killed driver loses no finished cell.

Workers need nothing but the installed package: the resolved config travels with the task, a file
the config names (``dataset.path``, ``workload.params.table_path``, a plugin file) travels as bytes
through the object store to a private copy with the same name, the folder of each plug-in
package the config names (entry-point packages included) travels zipped and is unpacked on the
task's ``sys.path``, and the Grid factory (``flowerbed.apps.inline.inline_grid``) is pickled by
reference.

A cell's metrics do not depend on where or when it ran: the inline engine is a function of the
config, and the driver's ``ATEN_CPU_CAPABILITY`` (if set) is passed to the workers so that
machines with different instruction sets pick the same kernels.

Stopping: SIGINT and SIGTERM cancel the cells in flight (their rows are not written, so ``--resume``
runs them again) and stop a local instance; a reaper process (``flowerbed.server.ray_reaper``) kills
what is left of a local instance if the driver dies, SIGKILL included. On a cluster, Ray kills the
tasks of a driver that went away (a ``ray://`` driver's after Ray Client's reconnect grace period). A cell running past ``cell_timeout`` seconds (counted from its
dispatch) is cancelled (its worker killed) and recorded as failed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypedDict

from flowerbed.clients.core.config import Experiment, replace_at, to_yaml
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.files import localise, shipped_files
from flowerbed.clients.core.plugins import is_path
from flowerbed.server.cells import Cell, Row, append_row, cell_dir, error_row, run_cell
from flowerbed.server.experiment import resolve
from flowerbed.server.ray_reaper import Reaper

if TYPE_CHECKING:
    from flwr.serverapp import Grid
    from ray import ObjectRef

LOCAL = "local"
ADDRESS_FORMS = "local, auto, ray://HOST:PORT, HOST:PORT"
#: environment passed from the driver to every worker (same kernels on every machine; the
#: disk cache of what cells share, ``clients.core.diskcache``)
PASSED_ENV = ("ATEN_CPU_CAPABILITY", "FLOWERBED_CACHE_DIR")
POLL_S = 0.5


class CellResult(TypedDict):
    """What a cell's Ray task returns: its row and its run directory's files by relative path."""

    row: Row
    files: dict[str, bytes]


@dataclass(frozen=True)
class RayOptions:
    """Where and how sweep cells run as Ray tasks."""

    address: str = LOCAL  # local (a private instance on all cores) | auto | ray://H:P | H:P
    cpus_per_cell: float = 1.0
    gpus_per_cell: float = 0.0
    cell_timeout: float | None = None  # seconds from dispatch; None = no limit
    verbose: bool = False

    def __post_init__(self) -> None:
        if not re.fullmatch(r"local|auto|(ray://)?[\w.\-\[\]:]+:\d+", self.address):
            raise ConfigError(f"--ray address '{self.address}' not understood (allowed: {ADDRESS_FORMS})")  # fmt: skip
        if not self.cpus_per_cell > 0:
            raise ConfigError(f"--cpus-per-cell must be > 0 (got {self.cpus_per_cell:g})")
        if not self.gpus_per_cell >= 0:
            raise ConfigError(f"--gpus-per-cell must be >= 0 (got {self.gpus_per_cell:g})")
        if self.cell_timeout is not None and not self.cell_timeout > 0:
            raise ConfigError(f"--cell-timeout must be > 0 seconds (got {self.cell_timeout:g})")


# ---- worker side -------------------------------------------------------------------------------


def plugin_packages(todo: list[tuple[Cell, Experiment]]) -> dict[str, Path]:
    """``{name: folder}`` of the top-level packages of the cells' module plugins (entry-point
    packages included: the resolved config names their modules). They travel to the workers with
    the cells, so a cluster needs only flowerbed installed."""
    packages: dict[str, Path] = {}
    for _, experiment in todo:
        for spec in experiment.plugins:
            top = spec.split(".")[0]
            if is_path(spec) or top == "flowerbed" or top in packages:
                continue
            module = importlib.import_module(top)
            file = getattr(module, "__file__", None)
            if getattr(module, "__path__", None) is not None and file:
                packages[top] = Path(file).parent  # a single-file module stays put
    return packages


def zipped(folder: Path) -> bytes:
    """A package folder as zip bytes (caches left out)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, Path(folder.name) / path.relative_to(folder))
    return buffer.getvalue()


@contextlib.contextmanager
def importable(packages: dict[str, bytes], into: Path) -> Iterator[None]:
    """The shipped plug-in packages unpacked under ``into``, first on ``sys.path`` for the block."""
    if not packages:
        yield
        return
    root = into / "packages"
    for data in packages.values():
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            archive.extractall(root)
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path.remove(str(root))


def run_remote_cell(
    make_grid: Callable[[int], Grid],
    cell: Cell,
    data: dict[str, Any],
    files: dict[str, ObjectRef[bytes]],
    packages: dict[str, ObjectRef[bytes]] | None = None,
) -> CellResult:
    """The body of a cell's Ray task: ``{"row": ..., "files": {relative path: bytes}}``.

    ``data`` is the cell's experiment as a dict (:meth:`Experiment.to_dict`: a plug-in's params
    class cannot be unpickled before its plug-in is imported), resolved again here after its
    files are local. ``files`` maps a path named in ``data`` to the object ref of its bytes,
    ``packages`` a plug-in package's name to the ref of its zipped folder.
    """
    import ray

    shipped = dict(zip(files, ray.get(list(files.values())), strict=True))
    packages = packages or {}
    zips = dict(zip(packages, ray.get(list(packages.values())), strict=True))
    with tempfile.TemporaryDirectory(prefix="fb-cell-") as tmp, importable(zips, Path(tmp)):
        run_dir = Path(tmp) / "run"
        local = resolve(localise(data, shipped, Path(tmp)))
        row = run_cell(make_grid(local.clients.num), cell, local, run_dir)
        if (run_dir / "config.yaml").is_file():  # the config as the driver knows it
            (run_dir / "config.yaml").write_text(to_yaml(data))
        out = {
            p.relative_to(run_dir).as_posix(): p.read_bytes()
            for p in sorted(run_dir.rglob("*"))
            if p.is_file()
        }
    row["node"] = ray.get_runtime_context().get_node_id()
    return {"row": row, "files": out}


# ---- driver side -------------------------------------------------------------------------------


def install_cell(out: Path, cell: Cell, files: dict[str, bytes]) -> None:
    """Write a finished cell's run directory under ``out/cells/<id>`` (replacing a partial one)."""
    if not files:  # the cell failed before it wrote anything
        return
    target = cell_dir(out, cell)
    staging = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    for name, data in files.items():
        path = staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    summary = staging / "summary.json"
    if summary.is_file():  # it names the worker's temporary directory
        content = json.loads(summary.read_text())
        content["run_dir"] = str(target)
        summary.write_text(json.dumps(content, indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.mkdir(parents=True, exist_ok=True)
    os.replace(staging, target)


def _runtime_env() -> dict[str, dict[str, str]]:
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    return {"env_vars": env} if env else {}


@contextlib.contextmanager
def ray_session(options: RayOptions) -> Iterator[None]:
    """Ray for a sweep: the caller's connection if there is one, else a private local instance
    (watched by a reaper) or a connection to ``options.address``; stopped or closed on exit."""
    import ray

    if ray.is_initialized():
        yield
        return
    # GPUs stay hidden from cells that asked for none (Ray's future default; silences its warning)
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    init = functools.partial(
        ray.init,
        log_to_driver=options.verbose,
        logging_level=logging.INFO if options.verbose else logging.WARNING,
        runtime_env=_runtime_env(),
    )
    reaper = None
    temp = None
    try:
        if options.address == LOCAL:
            root = os.environ.get("RAY_TMPDIR") or None  # Ray's socket paths are length-limited
            temp = Path(tempfile.mkdtemp(prefix="fr", dir=root))  # short: see above
            reaper = Reaper.start([temp])
            # workers at the driver's priority (Ray's default adds 15: on a busy machine a cell
            # would get a third of the CPU share a sequential sweep gets)
            init(
                address="local", num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False,
                _temp_dir=str(temp), _system_config={"worker_niceness": 0},
            )  # fmt: skip
        else:
            try:
                init(address=options.address)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ConfigError(f"could not connect to Ray at '{options.address}': {first}") from None  # fmt: skip
        yield
    finally:
        ray.shutdown()
        if reaper is not None:
            reaper.finish()
        elif temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt here, so a terminated driver cancels its cells too."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach only the main thread
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _needs(options: RayOptions) -> dict[str, float]:
    return {k: v for k, v in (("CPU", options.cpus_per_cell), ("GPU", options.gpus_per_cell)) if v}


def check_fits(options: RayOptions) -> None:
    """ConfigError unless some node of the cluster can run a cell."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if not any(all(r.get(k, 0.0) >= v for k, v in _needs(options).items()) for r in nodes):
        have = ", ".join(f"{r.get('CPU', 0):g} CPU + {r.get('GPU', 0):g} GPU" for r in nodes)
        raise ConfigError(
            f"no Ray node fits a cell of --cpus-per-cell {options.cpus_per_cell:g} "
            f"--gpus-per-cell {options.gpus_per_cell:g} (nodes: {have or 'none'})"
        )


def capacity(options: RayOptions) -> int:
    """How many cells the cluster's resources hold at once (at least one)."""
    import ray

    total = ray.cluster_resources()
    return max(1, int(min(total.get(k, 0.0) / v for k, v in _needs(options).items()) + 1e-9))


def _failure(exc: BaseException) -> str | None:
    """One line for a task that failed outside its cell, or None if it was interrupted."""
    from ray.exceptions import RayTaskError, TaskCancelledError

    if isinstance(exc, TaskCancelledError):
        return None
    if isinstance(exc, RayTaskError) and isinstance(exc.cause, KeyboardInterrupt):
        return None
    text = str(exc).strip()
    last = text.splitlines()[-1] if text else ""
    return f"{type(exc).__name__}: {last}" if last else type(exc).__name__


def run_cells_on_ray(
    make_grid: Callable[[int], Grid], todo: list[tuple[Cell, Experiment]], out: Path,
    options: RayOptions, on_cell: Callable[[Row], None] | None = None,
) -> None:  # fmt: skip
    """Run each (cell, config) as a Ray task; rows are appended as cells finish."""
    import ray

    with ray_session(options), _sigterm_interrupts():
        check_fits(options)
        slots = capacity(options)
        task = ray.remote(
            num_cpus=options.cpus_per_cell, num_gpus=options.gpus_per_cell, max_retries=0
        )(run_remote_cell)
        refs = {
            p: ray.put(Path(p).read_bytes()) for _, e in todo for p in shipped_files(e.to_dict())
        }
        packages = {name: ray.put(zipped(folder)) for name, folder in plugin_packages(todo).items()}
        queue = list(reversed(todo))
        running: dict[ObjectRef[CellResult], tuple[Cell, float]] = {}

        def finish(row: Row) -> None:
            append_row(out, row)
            if on_cell is not None:
                on_cell(row)

        try:
            while queue or running:
                while queue and len(running) < slots:
                    cell, experiment = queue.pop()
                    if options.gpus_per_cell > 0:  # the workload sees its GPU (Workload.device)
                        gpus = options.gpus_per_cell
                        experiment = replace_at(experiment, "clients.resources", gpus=gpus)
                    data = experiment.to_dict()
                    files = {p: refs[p] for p in shipped_files(data)}
                    ref = task.options(name=f"cell-{cell['id']}").remote(
                        make_grid, cell, data, files, packages
                    )
                    running[ref] = (cell, time.monotonic())
                ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
                for ref in ready:
                    cell, started = running.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        error = _failure(exc)
                        if error is not None:
                            finish(error_row(cell, error, time.monotonic() - started))
                        continue
                    install_cell(out, cell, result["files"])
                    finish(result["row"])
                if options.cell_timeout is not None:
                    now = time.monotonic()
                    for ref, (cell, started) in list(running.items()):
                        if now - started > options.cell_timeout:
                            ray.cancel(ref, force=True)
                            del running[ref]
                            message = f"timed out after {options.cell_timeout:g} s (--cell-timeout)"
                            finish(error_row(cell, message, now - started))
                slots = capacity(options)
        finally:
            for ref in running:
                ray.cancel(ref, force=True)
