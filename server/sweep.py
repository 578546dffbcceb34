"""Sweeps: a base experiment times a grid, every cell run inside one engine start, resumable.

A sweep YAML::

    name: attack-vs-defense
    base: quickstart                 # preset name or YAML path
    overrides: [rounds=1]            # dotlist applied to every cell
    engine: inline                   # inline | simulation (one Ray cluster for all cells)
    grid:                            # dotted key -> values (any YAML: scalars, lists, mappings)
      workload.params.lr: [0.01, 0.1]
      defenses: [[], [{name: topk, params: {fraction: 0.1}}]]
      seed: [0, 1]
    report:                          # how results.md and the plots are laid out (all optional;
      rows: defenses                 #   server/sweep_report.py: also the privacy-utility study)
      columns: attack.name
      value: attack.cell_accuracy
      utility: central.accuracy
      x: workload.params.batch_size

Each finished cell is one JSON line appended (and fsynced) to ``cells.jsonl``; ``--resume`` skips
the cells already there, so a sweep killed with SIGKILL loses at most the cell it was running. A
cell that raises is recorded with its error and the sweep goes on.

With ``ray`` (``flowerbed sweep NAME --ray [ADDRESS]``) every cell is a Ray task instead, on a
local Ray instance or a cluster (``flowerbed.server.ray_sweep``); rows land in the same
``cells.jsonl``, so ``--resume`` works across executors.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowerbed.clients.core.config import (
    configs_dir,
    load_base,
    load_config_file,
    merge_into,
    parse_overrides,
    validate_structured,
)
from flowerbed.clients.core.errors import ConfigError
from flowerbed.server.cells import finished_ids, run_cells
from flowerbed.server.experiment import resolve
from flowerbed.server.sweep_report import ReportConfig, write_outputs

if TYPE_CHECKING:
    from flowerbed.server.ray_sweep import RayOptions


@dataclass
class SweepConfig:
    name: str = "sweep"
    base: str = "quickstart"
    overrides: list[str] = field(default_factory=list)
    engine: str = "inline"
    grid: dict[str, Any] = field(default_factory=dict)
    report: ReportConfig = field(default_factory=ReportConfig)


def load_sweep(path: str | Path) -> SweepConfig:
    path = Path(path)
    if not path.is_file():
        presets = configs_dir() / "sweeps" / f"{path}.yaml"
        if not presets.is_file():
            raise ConfigError(f"sweep file not found: {path}")
        path = presets
    sweep = validate_structured(SweepConfig, load_config_file(path), "sweep")
    if sweep.engine not in ("inline", "simulation"):
        raise ConfigError(
            f"sweep engine '{sweep.engine}' not supported (allowed: inline, simulation)"
        )
    for key, values in sweep.grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep grid '{key}' must be a non-empty list of values")
    return sweep


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    node: Any = value
    for part in reversed(dotted.split(".")):
        node = {part: node}
    return node


def cells_of(sweep: SweepConfig) -> list[dict[str, Any]]:
    keys = list(sweep.grid)
    cells = []
    for values in itertools.product(*(sweep.grid[k] for k in keys)):
        params = dict(zip(keys, values, strict=True))
        cell_id = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
        cells.append({"id": cell_id, "params": params})
    return cells


def cell_config(
    sweep: SweepConfig, cell: dict[str, Any], engine: str | None = None
) -> dict[str, Any]:
    """The resolved config of one cell: base + sweep overrides + the cell's grid values.

    ``engine`` overrides the sweep's engine (Ray cells run inline inside their task).
    """
    extra = parse_overrides(sweep.overrides)
    for key, value in cell["params"].items():
        merge_into(extra, _nested(key, value))
    extra["engine"] = engine or sweep.engine
    extra.setdefault("output", {})["plots"] = False
    try:
        return resolve(load_base(sweep.base), extra)
    except ConfigError as exc:  # every cell is checked before the first one runs
        values = ", ".join(f"{k}={v}" for k, v in cell["params"].items())
        raise ConfigError(f"sweep cell {values}: {exc}") from None


def run_sweep(
    sweep: SweepConfig, out: Path, make_grid: Callable[[int], Any], resume: bool = False,
    on_cell: Callable[[dict[str, Any]], None] | None = None, ray: RayOptions | None = None,
) -> Path:  # fmt: skip
    """Run every unfinished cell of ``sweep`` into ``out``; then write the table and plots.

    ``make_grid(num_nodes)`` gives the in-process Grid of the inline engine (the apps layer binds
    the ClientApp to it). With ``ray``, each cell is a Ray task running that Grid (the factory
    travels to the workers by reference), whatever the sweep's engine.
    """
    out = out.resolve()
    if out.exists() and (out / "cells.jsonl").is_file() and not resume:
        raise ConfigError(f"{out} already holds a sweep (use --resume, or another --out)")
    cells = cells_of(sweep)
    done = finished_ids(out) if resume else set()
    engine = "inline" if ray is not None else None
    todo = [(cell, cell_config(sweep, cell, engine)) for cell in cells if cell["id"] not in done]
    nums = {cfg["clients"]["num"] for _, cfg in todo}
    if len(nums) > 1 and ray is None:
        raise ConfigError(
            "all cells of a sweep share one federation: clients.num cannot vary (with --ray "
            "each cell has its own)"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(
        json.dumps({"name": sweep.name, "cells": cells}, default=str, indent=1)
    )
    if todo:
        if ray is not None:
            from flowerbed.server.ray_sweep import run_cells_on_ray

            run_cells_on_ray(make_grid, todo, out, ray, on_cell)
        elif sweep.engine == "inline":
            run_cells(make_grid(nums.pop()), todo, out, on_cell)
        else:
            from flowerbed.server.engines.simulation import run_simulation_sweep

            run_simulation_sweep([cfg for _, cfg in todo], [c for c, _ in todo], out, on_cell)
    write_outputs(sweep, out, [cell["id"] for cell in cells_of(sweep)])
    return out


__all__ = ["SweepConfig", "load_sweep", "run_sweep", "cells_of"]
