"""The ``simulation`` engine: Flower's Simulation Engine on Ray, driven exactly as ``flwr run .`` does.

Each run starts its own SuperLink (``--simulation``) on a free port with a private FLWR_HOME and
RAY_TMPDIR, submits with ``flwr run``, and stops that SuperLink (and everything below it) by PID. Progress is read from the run's ``metrics.jsonl`` while ``flwr run --stream`` is going.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowerbed.clients.core.config import encode_config, to_yaml
from flowerbed.server.processes import (
    app_dir,
    flower_env,
    free_port,
    stop_process_tree,
    wait_for_port,
)
from flowerbed.server.results import atomic_write, read_history


def run_simulation(
    cfg: dict[str, Any],
    run_dir: Path,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
    verbose: bool = False,
) -> dict[str, Any]:
    """Run a resolved config on Ray through ``flwr run``; returns the summary."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / "config.yaml", to_yaml(cfg))
    watch = (lambda seen: _report_progress(run_dir, seen, on_round)) if on_round else None
    run_config = f"config='{encode_config(cfg)}' run-dir='{run_dir.resolve()}'"
    code = flwr_run_local(cfg["clients"], run_config, run_dir / "flower.log", watch)
    summary_path = run_dir / "summary.json"
    if code != 0 or not summary_path.is_file():
        tail = "".join((run_dir / "flower.log").read_text().splitlines(keepends=True)[-15:])
        raise RuntimeError(f"simulation failed (flwr run exit {code}):\n{tail}")
    if verbose:
        print((run_dir / "flower.log").read_text())
    return json.loads(summary_path.read_text())


def run_simulation_sweep(cfgs: list[dict], cells: list[dict], out: Path, on_cell=None) -> None:  # noqa: ANN001
    """All cells in one ``flwr run``: the ServerApp loops over them on one Ray cluster."""
    atomic_write(out / "todo.json", json.dumps([[c, f] for c, f in zip(cells, cfgs, strict=True)]))
    seen_rows = [0]

    def watch(seen: int) -> int:
        path = out / "cells.jsonl"
        rows = path.read_text().splitlines() if path.is_file() else []
        for raw in rows[seen_rows[0] :]:
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                break
            seen_rows[0] += 1
            if on_cell is not None:
                on_cell(row)
        return seen

    code = flwr_run_local(cfgs[0]["clients"], f"sweep-dir='{out}'", out / "flower.log", watch)
    if code != 0:
        raise RuntimeError(
            f"sweep simulation failed (flwr run exit {code}); see {out / 'flower.log'}"
        )


def federation_config(clients: dict[str, Any]) -> str:
    """``--federation-config`` for ``clients``: N SuperNodes, ``clients.resources`` per ClientApp."""
    resources = clients["resources"]
    return (
        f"num-supernodes={clients['num']} client-resources-num-cpus={resources['cpus']} "
        f"client-resources-num-gpus={float(resources['gpus'])}"
    )


def flwr_run_local(clients: dict, run_config: str, log_path: Path, watch=None) -> int:  # noqa: ANN001
    """``flwr run`` on a SuperLink this function starts and stops by PID; returns the exit code.

    Starting the SuperLink ourselves (rather than letting ``flwr run`` start its detached local
    one) gives a start-up wait we control and a PID we own.
    """
    home = Path(tempfile.mkdtemp(prefix="fb-"))  # short: Ray's socket paths are length-limited
    env = flower_env(home)
    port = free_port()
    flwr_home = home / "flwr"
    flwr_home.mkdir(parents=True)
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    bin_dir = Path(sys.executable).parent
    link_cmd = [
        str(bin_dir / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
        "--host", "127.0.0.1", "--port", str(port), "--database", str(home / "state.db"),
    ]  # fmt: skip
    federation = federation_config(clients)
    command = [
        str(bin_dir / "flwr"), "run", str(app_dir()), "sim", "--stream",
        "--run-config", run_config, "--federation-config", federation,
    ]  # fmt: skip
    seen = -1
    link = None
    try:
        with (home / "superlink.log").open("w") as link_log:
            link = subprocess.Popen(link_cmd, env=env, stdout=link_log, stderr=subprocess.STDOUT)
        wait_for_port(port, link.pid, timeout=180)
        with log_path.open("w") as log:
            proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                time.sleep(0.5)
                if watch is not None:
                    seen = watch(seen)
            if watch is not None:
                watch(seen)
    finally:
        if link is not None:
            stop_process_tree(link.pid)
            link.wait()
        shutil.rmtree(home, ignore_errors=True)
    return proc.returncode


def _report_progress(run_dir: Path, seen: int, on_round) -> int:  # noqa: ANN001
    final: dict[str, float] = {}
    latest = seen
    for line in read_history(run_dir):
        for key, value in line.items():
            if key not in ("round", "scope"):
                final[f"{line['scope']}.{key}"] = value
        latest = max(latest, line["round"])
    if latest > seen:
        on_round(latest, final)
    return latest
