"""Sweeps: a base experiment times a grid, every cell run inside one engine start, resumable.

A sweep YAML::

    name: attack-vs-defense
    base: quickstart                 # preset name or YAML path
    overrides: [rounds=1]            # dotlist applied to every cell
    engine: inline                   # inline | simulation (one Ray cluster for all cells)
    grid:                            # dotted key -> values (any YAML: scalars, lists, mappings)
      workload.params.lr: [0.01, 0.1]
      defenses: [[], [{name: topk, params: {fraction: 0.1}}]]
      workload.params.batch_size: [8, 32]
    grids:                           # optional: more product grids over the same keys; their
      - workload.params.lr: [1.0]    #   cells join the grid's (a cell in two grids runs once)
        defenses: [[]]
        workload.params.batch_size: [8]
    seeds: [0, 1, 2]                 # repeats of every cell, paired by seed across settings
    arms:                            # optional: sub-studies with their own base and overrides,
      - {name: fedsgd, overrides: [workload.params.protocol=fedsgd]}   # crossed with the grid
      - {name: fedavg, base: digits-classifier, overrides: [workload.params.local_epochs=2]}
    report:                          # how results.md and the plots are laid out (all optional;
      rows: defenses                 #   server/sweep_report.py: also the privacy-utility study)
      columns: attack.name
      value: attack.cell_accuracy
      utility: central.accuracy
      x: workload.params.batch_size

A run is one (arm, grid cell, seed); its id hashes those values (with neither ``seeds`` nor
``arms`` the ids are the grid cell's alone, as before). ``seeds`` sets the config's ``seed``, so it
cannot also be a grid key.

Each finished run is one JSON line appended (and fsynced) to ``cells.jsonl``; ``--resume`` skips
the cells already there, so a sweep killed with SIGKILL loses at most the cell it was running. A
cell that raises is recorded with its error and the sweep goes on.

With ``ray`` (``flowerbed sweep NAME --ray [ADDRESS]``) every cell is a Ray task instead, on a
local Ray instance or a cluster (``flowerbed.server.ray_sweep``); rows land in the same
``cells.jsonl``, so ``--resume`` works across executors.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowerbed.clients.core.config import (
    Experiment,
    configs_dir,
    load_base,
    load_config_file,
    merge_into,
    parse_overrides,
    validate_structured,
)
from flowerbed.clients.core.diskcache import CACHE_ENV
from flowerbed.clients.core.errors import ConfigError
from flowerbed.server.cells import Cell, Row, finished_ids, label, run_cells
from flowerbed.server.experiment import resolve
from flowerbed.server.sweep_layout import ReportConfig
from flowerbed.server.sweep_report import write_outputs
from flowerbed.server.sweep_stats import ARM_KEY, SEED_KEY

if TYPE_CHECKING:
    from flwr.serverapp import Grid

    from flowerbed.server.ray_sweep import RayOptions


@dataclass
class Arm:
    """A sub-study: its own base experiment and overrides, crossed with the sweep's grid."""

    name: str = ""
    base: str | None = None  # default: the sweep's base
    overrides: list[str] = field(default_factory=list)
    value: str | None = None  # its unaware attack metric, if not the report's ("" = none)
    adaptive: str | None = None  # its defense-aware attack metric, if not the report's
    utility: str | None = None  # its utility metric, if not the report's
    #: defenses this arm is not crossed with (an attack on single clients' updates has nothing
    #: to invert under secure aggregation: ``without: [secagg]``)
    without: list[str] = field(default_factory=list)


@dataclass
class SweepConfig:
    name: str = "sweep"
    base: str = "quickstart"
    overrides: list[str] = field(default_factory=list)
    engine: str = "inline"
    grid: dict[str, Any] = field(default_factory=dict)
    #: more product grids over the grid's keys, their cells joined to the grid's (a smaller
    #: crossing beside the full one: client-side defenses at the largest malicious fraction)
    grids: list[dict[str, Any]] = field(default_factory=list)
    seeds: list[int] | None = None  # repeats of every cell (the config's seed)
    arms: list[Arm] = field(default_factory=list)
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
    for i, grid in enumerate([sweep.grid, *sweep.grids]):
        where = "grid" if i == 0 else f"grids.{i - 1}"
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"sweep {where} '{key}' must be a non-empty list of values")
        if i and set(grid) != set(sweep.grid):
            raise ConfigError(
                f"sweep {where} has keys {sorted(grid)}; every grid needs the grid's keys "
                f"{sorted(sweep.grid)} (one value each for a key it does not vary)"
            )
    check_seeds(sweep)
    names = [arm.name for arm in sweep.arms]
    if any(not re.fullmatch(r"[\w.\-]+", n) for n in names) or len(set(names)) < len(names):
        raise ConfigError(
            f"sweep arms need distinct names of letters, digits, '.', '-', '_' (got {names})"
        )
    if ARM_KEY in sweep.grid and sweep.arms:
        raise ConfigError(f"sweep grid key '{ARM_KEY}' is reserved for arms")
    return sweep


def check_seeds(sweep: SweepConfig) -> None:
    """ConfigError unless ``seeds`` is absent or a non-empty list of distinct integers >= 0."""
    seeds = sweep.seeds
    if seeds is None:
        return
    if not seeds or len(set(seeds)) < len(seeds) or min(seeds) < 0:
        raise ConfigError(
            f"sweep seeds must be a non-empty list of distinct integers >= 0 (got {seeds})"
        )
    if SEED_KEY in sweep.grid:
        raise ConfigError("sweep seeds and a grid key 'seed' both set the seed: keep one")


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    node: Any = value
    for part in reversed(dotted.split(".")):
        node = {part: node}
    return node


def cells_of(sweep: SweepConfig) -> list[Cell]:
    """Every run of the sweep: arms x grid x seeds, arm outermost, seed innermost; then the
    cells of each of ``grids`` not already listed, in the same order."""
    cells: list[Cell] = []
    seen: set[str] = set()
    for grid in (sweep.grid, *sweep.grids):
        axes: dict[str, list[object]] = {ARM_KEY: [a.name for a in sweep.arms]} if sweep.arms else {}  # fmt: skip
        axes.update({k: grid[k] for k in sweep.grid})  # the grid's key order: the same ids
        if sweep.seeds is not None:
            axes[SEED_KEY] = list(sweep.seeds)
        keys = list(axes)
        for values in itertools.product(*(axes[k] for k in keys)):
            params = dict(zip(keys, values, strict=True))
            if _left_out(sweep, params):
                continue
            cell_id = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
            if cell_id not in seen:
                seen.add(cell_id)
                cells.append({"id": cell_id, "params": params})
    return cells


def _grid_defenses(values: Mapping[str, object]) -> object:
    """A grid's (or a cell's) raw ``defenses`` value: the one read of a sweep file's grid by key."""
    return values.get("defenses")


def _left_out(sweep: SweepConfig, params: dict[str, object]) -> bool:
    """The cell's arm is not crossed with one of the cell's defenses (``Arm.without``)."""
    arm = next((a for a in sweep.arms if a.name == params.get(ARM_KEY)), None)
    defenses = _grid_defenses(params) or []
    if arm is None or not arm.without or not isinstance(defenses, list):
        return False
    return any(isinstance(d, dict) and d.get("name") in arm.without for d in defenses)


def cannot_combine(sweep: SweepConfig) -> list[dict[str, str]]:
    """Each (arm, defenses setting) pair the sweep leaves out (``Arm.without``), with why:
    ``refused`` with the one-line refusal its config gets when resolved (a robust aggregator
    behind secure aggregation), or ``left out`` where it would run but the sweep chose not to.
    Reports list these instead of dropping them silently; ``sweep.json`` keeps them."""
    out: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for grid in (sweep.grid, *sweep.grids):
        settings = _grid_defenses(grid)
        if not isinstance(settings, list):
            continue
        first = {k: v[0] for k, v in grid.items() if k != "defenses"}
        if sweep.seeds is not None:
            first[SEED_KEY] = sweep.seeds[0]
        for arm, setting in itertools.product([a for a in sweep.arms if a.without], settings):
            params = {ARM_KEY: arm.name, **first, "defenses": setting}
            if (arm.name, label(setting)) in seen or not _left_out(sweep, params):
                continue
            seen.add((arm.name, label(setting)))
            try:
                _resolve_cell(sweep, params, None)
                kind, reason = "left out", f"arm '{arm.name}' has without: {arm.without}"
            except ConfigError as exc:
                kind, reason = "refused", str(exc)
            out.append(
                {"arm": arm.name, "defenses": label(setting), "kind": kind, "reason": reason}
            )
    return out


def cell_config(sweep: SweepConfig, cell: Cell, engine: str | None = None) -> Experiment:
    """The resolved experiment of one cell: base + sweep overrides + the cell's grid values.

    ``engine`` overrides the sweep's engine (Ray cells run inline inside their task).
    """
    try:
        return _resolve_cell(sweep, cell["params"], engine)
    except ConfigError as exc:  # every cell is checked before the first one runs
        values = ", ".join(f"{k}={v}" for k, v in cell["params"].items())
        raise ConfigError(f"sweep cell {values}: {exc}") from None


def _resolve_cell(sweep: SweepConfig, cell_params: dict[str, Any], engine: str | None) -> Experiment:  # fmt: skip
    params = dict(cell_params)
    name = params.pop(ARM_KEY, None)
    arm = next((a for a in sweep.arms if a.name == name), Arm())
    extra = parse_overrides(sweep.overrides)
    merge_into(extra, parse_overrides(arm.overrides))
    for key, value in params.items():
        merge_into(extra, _nested(key, value))
    merge_into(extra, {"engine": engine or sweep.engine, "output": {"plots": False}})
    return resolve(load_base(arm.base or sweep.base), extra)


def spec_hash(sweep: SweepConfig) -> str:
    """A hash of what every run of the sweep shares: base, overrides, engine, arms and the grid's
    keys. More seeds or more grid values keep it (``--resume`` adds their cells); the report's
    layout is not part of it."""
    spec = {k: v for k, v in dataclasses.asdict(sweep).items() if k not in ("report", "seeds")}
    spec["grid"] = sorted(spec["grid"])
    if not spec["grids"]:
        del spec["grids"]  # a sweep without them keeps the hash it had before they existed
    else:
        spec["grids"] = len(spec["grids"])
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]


def check_same_sweep(sweep: SweepConfig, out: Path) -> None:
    """A sweep directory holds one sweep: another's ``--resume`` there would merge its cells
    into this one's table (``sweep.json`` names the sweep and the hash of its spec)."""
    path = out / "sweep.json"
    if not path.is_file():
        return
    try:
        held = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        raise ConfigError(
            f"{path} is unreadable: not a sweep directory (use another --out)"
        ) from None
    name, spec = held.get("name"), held.get("spec")
    if name != sweep.name or (spec is not None and spec != spec_hash(sweep)):
        raise ConfigError(
            f"{out} holds sweep '{name}' (spec {spec or 'unknown'}), not '{sweep.name}' (spec "
            f"{spec_hash(sweep)}): --resume continues the same sweep only (use another --out)"
        )


def run_sweep(
    sweep: SweepConfig, out: Path, make_grid: Callable[[int], Grid], resume: bool = False,
    on_cell: Callable[[Row], None] | None = None, ray: RayOptions | None = None,
) -> Path:  # fmt: skip
    """Run every unfinished cell of ``sweep`` into ``out``; then write the table and plots.

    ``make_grid(num_nodes)`` gives the in-process Grid of the inline engine (the apps layer binds
    the ClientApp to it). With ``ray``, each cell is a Ray task running that Grid (the factory
    travels to the workers by reference), whatever the sweep's engine.
    """
    out = out.resolve()
    if out.exists() and (out / "cells.jsonl").is_file() and not resume:
        raise ConfigError(f"{out} already holds a sweep (use --resume, or another --out)")
    check_same_sweep(sweep, out)
    cells = cells_of(sweep)
    done = finished_ids(out) if resume else set()
    engine = "inline" if ray is not None else None
    todo = [(cell, cell_config(sweep, cell, engine)) for cell in cells if cell["id"] not in done]
    nums = {experiment.clients.num for _, experiment in todo}
    if len(nums) > 1 and ray is None:
        raise ConfigError(
            "all cells of a sweep share one federation: clients.num cannot vary (with --ray "
            "each cell has its own)"
        )
    out.mkdir(parents=True, exist_ok=True)
    # what cells share is built once per machine (e.g. a tabdiff warm start, once per seed)
    owned = CACHE_ENV not in os.environ
    if owned:
        os.environ[CACHE_ENV] = str(out / ".cache")
    try:
        _run_todo(sweep, out, cells, todo, nums, make_grid, ray, on_cell)
    finally:
        if owned:
            os.environ.pop(CACHE_ENV, None)
    return out


def _run_todo(
    sweep: SweepConfig, out: Path, cells: list[Cell], todo: list[tuple[Cell, Experiment]],
    nums: set[int], make_grid: Callable[[int], Grid], ray: RayOptions | None,
    on_cell: Callable[[Row], None] | None,
) -> None:  # fmt: skip
    held = {"name": sweep.name, "spec": spec_hash(sweep), "cells": cells,
            "cannot_combine": cannot_combine(sweep)}  # fmt: skip
    (out / "sweep.json").write_text(json.dumps(held, default=str, indent=1))
    if todo:
        if ray is not None:
            from flowerbed.server.ray_sweep import run_cells_on_ray

            run_cells_on_ray(make_grid, todo, out, ray, on_cell)
        elif sweep.engine == "inline":
            run_cells(make_grid(nums.pop()), todo, out, on_cell)
        else:
            from flowerbed.server.engines.simulation import run_simulation_sweep

            run_simulation_sweep([e for _, e in todo], [c for c, _ in todo], out, on_cell)
    write_outputs(sweep, out, [cell["id"] for cell in cells_of(sweep)])


__all__ = ["Arm", "SweepConfig", "cannot_combine", "cells_of", "load_sweep", "run_sweep"]
