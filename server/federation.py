"""What the ServerApp learns from the federation it was given: engine, node count, workspace.

``flwr run`` may hand flowerbed's ServerApp any federation: Flower's simulation, a loopback or
docker deployment, someone else's SuperLink. The ServerApp therefore records the engine the Grid
actually is, takes the number of clients from the SuperNodes actually connected (unless the
experiment names it, then it waits for that many and fails with one line after a timeout), and on
a deployment writes its run directory in its own workspace, never at a path from the submitter.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from flwr.serverapp import Grid

from flowerbed.clients.core.config import Engine, Experiment
from flowerbed.clients.core.errors import ConfigError

#: printed (one line) by a ServerApp that fails, so the submitter can show the cause
ERROR_MARKER = "FLOWERBED-ERROR "
#: the node count must hold this long before an unpinned run adopts it
SETTLE_S = 3.0
POLL_S = 0.5

_GRID_ENGINES = {"InMemoryGrid": "simulation", "HttpGrid": "deployment", "GrpcGrid": "deployment"}


def grid_engine(grid: Grid) -> str | None:
    """``simulation`` / ``deployment`` for Flower's Grids; None for an engine's own (inline)."""
    inner = getattr(grid, "inner", grid)
    return _GRID_ENGINES.get(type(inner).__name__)


def wait_for_nodes(
    grid: Grid,
    wanted: int | None,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Number of connected SuperNodes to run with.

    ``wanted`` given: wait until that many are connected (more are fine), else one-line error
    after ``timeout_s``. ``wanted`` None: wait for at least one, then until the count has held
    for :data:`SETTLE_S`, and return it.
    """
    deadline = clock() + timeout_s
    count, stable_since = -1, clock()
    while True:
        now_count = len(list(grid.get_node_ids()))
        if now_count != count:
            count, stable_since = now_count, clock()
        if wanted is not None and count >= wanted:
            return wanted
        if wanted is None and count >= 1 and clock() - stable_since >= SETTLE_S:
            return count
        if clock() >= deadline:
            waited = f"{wanted} SuperNodes" if wanted is not None else "a SuperNode"
            hint = (
                f"set clients.num={count}, or connect {wanted - count} more"
                if wanted is not None and count > 0
                else "start SuperNodes and check they reach this SuperLink"
            )
            raise ConfigError(
                f"waited {timeout_s:.0f} s for {waited}; {count} connected ({hint}; "
                f"deployment.node_timeout_s sets the wait)"
            )
        sleep(POLL_S)


def fit_to_federation(grid: Grid, experiment: Experiment, pinned: bool) -> Experiment:
    """``experiment`` with the real engine and, unless ``pinned``, ``clients.num`` = connected
    nodes."""
    engine = grid_engine(grid)
    if engine is None:  # an engine's own Grid (inline): the experiment is already right
        return experiment
    timeout = float(experiment.deployment.node_timeout_s)
    clients = experiment.clients
    num = wait_for_nodes(grid, clients.num if pinned else None, timeout)
    return replace(experiment, engine=Engine(engine), clients=replace(clients, num=num))


def workspace() -> Path:
    """Where a deployed ServerApp keeps run directories: ``$FLOWERBED_WORKSPACE``, else ``./runs``."""
    return Path(os.environ.get("FLOWERBED_WORKSPACE") or "runs").resolve()


def serverapp_run_dir(experiment: Experiment, requested: str, default: Path) -> Path:
    """The run directory this ServerApp writes.

    Local engines write where they were asked. A deployed ServerApp may run on another machine,
    so it keeps only the requested directory's name and writes it under :func:`workspace` (the
    submitter rebuilds its own copy from the streamed results); a workspace it cannot create
    falls back to the temp dir.
    """
    if experiment.engine != "deployment":
        return Path(requested) if requested else default
    name = Path(requested).name if requested else default.name
    base = workspace()
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:
        base = Path(tempfile.gettempdir()) / "flowerbed-runs"
    return base / name


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
