"""One sweep cell: its run directory, its ``cells.jsonl`` row, and running cells on one Grid.

Shared by every sweep executor (``flowerbed.server.sweep`` runs cells on one Grid,
``flowerbed.server.ray_sweep`` as Ray tasks), so neither imports the other's internals.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from flowerbed.clients.core.config import Experiment
from flowerbed.server.runner import run_experiment

if TYPE_CHECKING:
    from flwr.serverapp import Grid


class Cell(TypedDict):
    """One run of a sweep: its id (a hash of its params) and its grid values by dotted key."""

    id: str
    params: dict[str, object]


class Row(TypedDict, total=False):
    """A cell's line in ``cells.jsonl``: its labelled params, status, final metrics, cost."""

    id: str
    params: dict[str, str]
    status: str
    error: str
    metrics: dict[str, float]
    failures: int
    wall_s: float
    #: the Ray node that ran it (``--ray``)
    node: str


def label(value: object) -> str:
    """Short human label of a grid value (defense lists become ``dp-sgd(noise_multiplier=1)``)."""
    if isinstance(value, list):
        return "+".join(label(v) for v in value) or "none"
    if isinstance(value, dict) and "name" in value:
        params = ",".join(f"{k}={v}" for k, v in sorted((value.get("params") or {}).items()))
        return f"{value['name']}({params})" if params else str(value["name"])
    return str(value)


def cell_dir(out: Path, cell: Cell) -> Path:
    return out / "cells" / cell["id"]


def finished_ids(out: Path) -> set[str]:
    path = out / "cells.jsonl"
    done = set()
    if path.is_file():
        for raw in path.read_text().splitlines():
            try:
                done.add(json.loads(raw)["id"])
            except (json.JSONDecodeError, KeyError):
                continue  # a line cut by a crash: that cell runs again
    return done


def append_row(out: Path, row: Row) -> None:
    path = out / "cells.jsonl"
    torn = path.is_file() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with path.open("a") as fh:
        fh.write(("\n" if torn else "") + json.dumps(row, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def error_row(cell: Cell, error: str, wall_s: float) -> Row:
    """The row of a cell that failed (its error on one line)."""
    return {
        "id": cell["id"],
        "params": {k: label(v) for k, v in cell["params"].items()},
        "status": "error",
        "error": error,
        "metrics": {},
        "wall_s": round(wall_s, 3),
    }


def run_cell(grid: Grid, cell: Cell, experiment: Experiment, run_dir: Path) -> Row:
    """Run one cell on ``grid`` into ``run_dir``; its ``cells.jsonl`` row (errors included).

    Torch runs single-threaded, as the ClientApp runtime pins it: a cell's numbers do not depend
    on the process it runs in or on what ran there before (sequential and Ray cells agree).
    """
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        summary = run_experiment(grid, experiment, run_dir)
    except Exception as exc:  # noqa: BLE001 - a crashed cell is a result, the sweep goes on
        last = traceback.format_exception_only(exc)[-1].strip()
        return error_row(cell, last, time.perf_counter() - start)
    return {
        "id": cell["id"],
        "params": {k: label(v) for k, v in cell["params"].items()},
        "status": "ok",
        "metrics": summary["metrics"],
        "failures": summary["failures"],
        "wall_s": round(time.perf_counter() - start, 3),
    }


def run_cells(
    grid: Grid, todo: list[tuple[Cell, Experiment]], out: Path,
    on_cell: Callable[[Row], None] | None = None,
) -> None:  # fmt: skip
    """Run each (cell, config) on one Grid, appending a row per finished cell."""
    for cell, experiment in todo:
        row = run_cell(grid, cell, experiment, cell_dir(out, cell))
        append_row(out, row)
        if on_cell is not None:
            on_cell(row)
