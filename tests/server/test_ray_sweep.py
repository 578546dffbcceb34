"""Sweep cells as Ray tasks: same cells.csv as sequential, shipped files, failures and timeouts,
interrupts, SIGKILL of the driver then --resume (a sweep on the two-node loopback cluster is in
tests/server/test_ray_run.py, with that cluster).

One local Ray instance (2 CPUs, one pretend GPU) serves the module; tests that need their own
(a killed driver) start it in processes they stop by PID.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import ray
import yaml

from flowerbed.apps.inline import inline_grid
from flowerbed.clients.core.config import decode
from flowerbed.clients.core.errors import ConfigError
from flowerbed.server.ray_reaper import Reaper
from flowerbed.server.ray_sweep import RayOptions, localise, run_remote_cell
from flowerbed.server.sweep import cell_config, cells_of, finished_ids, load_sweep, run_sweep
from tests.plugin_fixture import on_path
from tests.server.conftest import ray_root as _ray_root

SWEEP = {
    "name": "tiny",
    "base": "quickstart",
    "overrides": ["rounds=1", "clients.num=3", "dataset.max_rows=3000", "output.plots=false"],
    "engine": "inline",
    "grid": {"workload.params.lr": [0.01, 0.05, 0.1], "seed": [0, 1]},
    "report": {"rows": "seed", "columns": "workload.params.lr", "value": "central.accuracy"},
}
TIMING = ("wall_s", "time.round_s")


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A private local Ray instance for the module (2 CPUs, 1 pretend GPU); its two workers are
    warmed up by a two-cell sweep (a cold worker imports every plug-in on its first cell)."""
    temp = Path(tempfile.mkdtemp(prefix="fb-test-", dir=_ray_root()))
    reaper = Reaper.start([temp])
    try:
        ray.init(
            address="local", num_cpus=2, num_gpus=1, include_dashboard=False,
            _temp_dir=str(temp), log_to_driver=False,
        )  # fmt: skip
        tmp = tmp_path_factory.mktemp("warm")
        spec = dict(SWEEP, overrides=[*_csv_overrides(_csv_dataset(tmp)), "rounds=1"],
                    grid={"seed": [0, 1]})  # fmt: skip
        run_sweep(load_sweep(_write(tmp, spec)), tmp / "out", inline_grid, ray=RayOptions())
        yield
    finally:
        ray.shutdown()
        reaper.finish()


def _write(tmp_path: Path, spec: dict, name: str = "tiny.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def _rows(out: Path) -> list[dict]:
    rows = []
    for raw in (out / "cells.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(raw))
        except json.JSONDecodeError:
            pass
    return rows


def _csv_overrides(csv: Path) -> list[str]:
    """A small CSV table as the dataset (loads in milliseconds), 2 clients, no plots."""
    return [
        "dataset.name=csv", f"dataset.path={csv}", "dataset.label=y", "dataset.numeric=[a]",
        "dataset.categorical=[b]", "clients.num=2", "output.plots=false",
    ]  # fmt: skip


def _csv_dataset(tmp_path: Path) -> Path:
    csv = tmp_path / "data" / "table.csv"
    csv.parent.mkdir()
    lines = ["a,b,y"] + [
        f"{i % 7},{'xyz'[i % 3]},{'yes' if i % 7 > 3 else 'no'}" for i in range(240)
    ]
    csv.write_text("\n".join(lines) + "\n")
    return csv


def test_ray_gives_the_same_cells_csv_as_sequential(tmp_path, local_ray):
    csv = _csv_dataset(tmp_path)
    spec = dict(
        SWEEP,
        overrides=[*_csv_overrides(csv), "rounds=2", "clients.num=3"],
        grid={
            "seed": [0, 1],
            "defenses": [[], [{"name": "dp-sgd", "params": {"noise_multiplier": 0.5}}]],
        },
    )  # fmt: skip
    sweep = load_sweep(_write(tmp_path, spec))
    seq = run_sweep(sweep, tmp_path / "seq", inline_grid)
    par = run_sweep(sweep, tmp_path / "ray", inline_grid, ray=RayOptions())
    frames = [pd.read_csv(out / "cells.csv").drop(columns=list(TIMING)) for out in (seq, par)]
    assert len(frames[0]) == 4 and (frames[0]["status"] == "ok").all()
    pd.testing.assert_frame_equal(frames[0], frames[1], check_exact=True)
    assert all(row["node"] for row in _rows(par))
    for cell in cells_of(sweep):  # each run directory came back whole
        for name in ("config.yaml", "metrics.jsonl", "summary.json", "report.md"):
            assert (par / "cells" / cell["id"] / name).is_file()
        config = (par / "cells" / cell["id"] / "config.yaml").read_text()
        assert config == (seq / "cells" / cell["id"] / "config.yaml").read_text()
        summary = json.loads((par / "cells" / cell["id"] / "summary.json").read_text())
        assert summary["run_dir"] == str(par / "cells" / cell["id"])


def test_a_cell_needs_only_the_shipped_bytes(tmp_path, local_ray):
    csv = _csv_dataset(tmp_path)
    spec = dict(SWEEP, overrides=[*_csv_overrides(csv), "rounds=1"])
    sweep = load_sweep(_write(tmp_path, spec))
    cell = cells_of(sweep)[0]
    cfg = cell_config(sweep, cell, "inline").to_dict()  # what travels to a Ray task
    ref = ray.put(csv.read_bytes())
    csv.unlink()  # what a worker without the driver's filesystem sees
    result = run_remote_cell(inline_grid, cell, cfg, {str(csv): ref})
    assert result["row"]["status"] == "ok", result["row"]
    assert str(csv) in result["files"]["config.yaml"].decode()  # the config as the driver knows it

    local = decode(localise(cfg, {str(csv): b"a,b,y\n"}, tmp_path / "worker"))
    assert local.dataset.path != str(csv)
    assert Path(str(local.dataset.path)).name == "table.csv"
    assert Path(str(local.dataset.path)).read_bytes() == b"a,b,y\n"


def test_plugin_packages_run_as_ray_cells_like_sequential(tmp_path, local_ray, plugin_site):
    """Packages made by ``flowerbed new`` (tests/plugin_fixture.py), importable in the driver only:
    Ray ships them to the workers (``py_modules``), cells.csv equals the sequential one."""
    spec = dict(
        SWEEP, overrides=[*SWEEP["overrides"][:1], "clients.num=2", "dataset.max_rows=600",
                          "attack.name=label-prior", "output.plots=false"],
        grid={"defenses": [[], [{"name": "clip-noise", "params": {"clip": 0.5, "noise": 0.01}}]]},
    )  # fmt: skip
    with on_path(plugin_site):
        sweep = load_sweep(_write(tmp_path, spec))
        seq = run_sweep(sweep, tmp_path / "seq", inline_grid)
        par = run_sweep(sweep, tmp_path / "ray", inline_grid, ray=RayOptions())
    rows = _rows(par)
    assert [r["status"] for r in rows] == ["ok", "ok"], [r.get("error") for r in rows]
    frames = [pd.read_csv(out / "cells.csv").drop(columns=list(TIMING)) for out in (seq, par)]
    pd.testing.assert_frame_equal(frames[0], frames[1], check_exact=True)
    assert all(r["metrics"]["attack.error"] == r["metrics"]["attack.prior_error"] for r in rows)
    assert rows[0]["metrics"]["central.loss"] != rows[1]["metrics"]["central.loss"]


def test_a_plugin_file_travels_with_the_cell(tmp_path, local_ray, plugin_site):
    plugin = tmp_path / "halve.py"
    plugin.write_text(
        "from flowerbed.clients.defenses import DEFENSES, Defense, update_mod\n"
        "from flwr.app import Array, ArrayRecord\n\n\n"
        "@DEFENSES.register('halve', 'the update halved')\nclass Halve(Defense):\n"
        "    def mods(self):\n        return [update_mod(lambda s, t, c: ArrayRecord({k: Array("
        "s[k].numpy() + 0.5 * (t[k].numpy() - s[k].numpy())) for k in t}))]\n"
    )
    spec = dict(SWEEP, overrides=[*SWEEP["overrides"], f"plugins=[{plugin}]",
                                  "defenses=[{name: halve}]"], grid={"seed": [0]})  # fmt: skip
    with on_path(plugin_site):
        sweep = load_sweep(_write(tmp_path, spec))
        cell = cells_of(sweep)[0]
        experiment = cell_config(sweep, cell, "inline")
        assert experiment.plugins == (str(plugin),)
        ref = ray.put(plugin.read_bytes())
        plugin.unlink()  # what a worker without the driver's filesystem sees
        result = run_remote_cell(inline_grid, cell, experiment.to_dict(), {str(plugin): ref})
    assert result["row"]["status"] == "ok", result["row"]


def test_failed_and_hanging_cells_are_recorded(tmp_path, local_ray):
    overrides = [*_csv_overrides(_csv_dataset(tmp_path)), "rounds=100000"]
    # 4 rows cannot feed 2 clients and a test split: fails at run time; the other cell hangs
    spec = dict(SWEEP, overrides=overrides, grid={"dataset.max_rows": [4, None]})
    out = run_sweep(
        load_sweep(_write(tmp_path, spec)), tmp_path / "out", inline_grid,
        ray=RayOptions(cell_timeout=4),
    )  # fmt: skip
    rows = {str(row["params"]["dataset.max_rows"]): row for row in _rows(out)}
    assert rows["4"]["status"] == "error" and "timed out" not in rows["4"]["error"]
    assert rows["None"]["status"] == "error"
    assert "timed out after 4 s" in rows["None"]["error"]
    assert "failed cells" in (out / "results.md").read_text()
    deadline = time.monotonic() + 30  # the hung cell's worker was killed: its CPU is free again
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2


def test_assigned_gpu_reaches_the_workload(tmp_path, local_ray):
    overrides = [*_csv_overrides(_csv_dataset(tmp_path)), "rounds=1"]
    spec = dict(SWEEP, overrides=overrides, grid={"seed": [0]})
    out = run_sweep(
        load_sweep(_write(tmp_path, spec)), tmp_path / "out", inline_grid,
        ray=RayOptions(gpus_per_cell=1),
    )  # fmt: skip
    (row,) = _rows(out)
    # this machine has no CUDA: the pretend GPU Ray assigned (device 0) reaches the workload,
    # which asks torch for it and fails with a one-line error naming the assignment
    assert row["status"] == "error"
    assert "clients.resources.gpus=1 assigns a GPU" in row["error"]
    assert "CUDA_VISIBLE_DEVICES=0" in row["error"]


def test_a_cell_no_node_fits_is_a_config_error(tmp_path, local_ray):
    overrides = [*_csv_overrides(_csv_dataset(tmp_path)), "rounds=1"]
    spec = dict(SWEEP, overrides=overrides, grid={"seed": [0]})
    with pytest.raises(ConfigError, match="no Ray node fits a cell of --cpus-per-cell 4"):
        run_sweep(
            load_sweep(_write(tmp_path, spec)), tmp_path / "out", inline_grid,
            ray=RayOptions(cpus_per_cell=4),
        )  # fmt: skip


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_cancels_cells_and_writes_no_row_for_them(tmp_path, local_ray, signum):
    overrides = _csv_overrides(_csv_dataset(tmp_path))
    # one cell per CPU, so the quick cell cannot wait behind the long one (Ray's order is not FIFO)
    spec = dict(SWEEP, overrides=overrides, grid={"rounds": [1, 100000]})

    def on_cell(row: dict) -> None:  # the quick cell is in; the long one is running
        os.kill(os.getpid(), signum)

    # Ctrl-C as in a terminal: a shell starting the suite in the background (no job control)
    # hands it SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_sweep(
                load_sweep(_write(tmp_path, spec)), tmp_path / "out", inline_grid,
                on_cell=on_cell, ray=RayOptions(),
            )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signal.getsignal(signal.SIGTERM) is not None
    rows = _rows(tmp_path / "out")
    assert [row["params"]["rounds"] for row in rows] == ["1"]
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_sigkill_of_the_driver_leaves_nothing_and_resume_runs_each_cell_once(tmp_path, local_ray):
    # cells of a few rounds, so a quiet machine cannot finish all six before the kill lands
    overrides = [*_csv_overrides(_csv_dataset(tmp_path)), "rounds=30"]
    spec_path = _write(tmp_path, dict(SWEEP, overrides=overrides))
    out = tmp_path / "out"
    ray_tmp = Path(tempfile.mkdtemp(prefix="fbk-", dir=_ray_root()))
    env = dict(os.environ, RAY_TMPDIR=str(ray_tmp))
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowerbed.apps.cli", "sweep", str(spec_path), "--out", str(out),
         "--ray"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        seen: dict[int, psutil.Process] = {}  # every descendant seen while the driver ran
        while time.monotonic() < deadline and not finished_ids(out) and proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                seen.update((p.pid, p) for p in psutil.Process(proc.pid).children(recursive=True))
            time.sleep(0.1)
        started = list(seen.values())
        names = {p.name() for p in _alive(started)}
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert {"raylet", "gcs_server"} <= names, names
    deadline = time.monotonic() + 60
    while _alive(started) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _alive(started)
    for p in left:  # never leave them behind, even when the assertion below fails
        p.kill()
    assert not left, [p.name() for p in left]
    assert not any(ray_tmp.iterdir()), "the reaper removes the instance's directory"
    ray_tmp.rmdir()

    before = _rows(out)
    assert 1 <= len(before) < 6, "the sweep should have been killed mid-way"
    run_sweep(load_sweep(spec_path), out, inline_grid, resume=True, ray=RayOptions())
    after = _rows(out)
    assert after[: len(before)] == before  # no finished cell lost or run again
    ids = [row["id"] for row in after]
    assert len(ids) == len(set(ids)) == 6
    assert len(pd.read_csv(out / "cells.csv")) == 6


def test_resume_works_across_executors(tmp_path, local_ray):
    overrides = [*_csv_overrides(_csv_dataset(tmp_path)), "rounds=1"]
    sweep = load_sweep(_write(tmp_path, dict(SWEEP, overrides=overrides)))
    out = tmp_path / "out"

    def stop_after_two(row: dict) -> None:
        if len(finished_ids(out)) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # sequential, stopped after two cells
        run_sweep(sweep, out, inline_grid, on_cell=stop_after_two)
    run_sweep(sweep, out, inline_grid, resume=True, ray=RayOptions())
    ids = [row["id"] for row in _rows(out)]
    assert len(ids) == len(set(ids)) == 6
    assert sorted(ids) == sorted(cell["id"] for cell in cells_of(sweep))


def test_a_sweep_runs_off_the_main_thread(tmp_path, local_ray):
    overrides = [*_csv_overrides(_csv_dataset(tmp_path)), "rounds=1"]
    spec = dict(SWEEP, overrides=overrides, grid={"seed": [0]})
    errors = []

    def work() -> None:
        try:
            run_sweep(load_sweep(_write(tmp_path, spec)), tmp_path / "out", inline_grid,
                      ray=RayOptions())  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(120)
    assert not errors and len(_rows(tmp_path / "out")) == 1


def test_a_robustness_cell_runs_as_a_ray_task_like_sequential(tmp_path, local_ray):
    """Malicious clients in a Ray cell (issue 53): two ALIE colluders (each recomputes the other's
    benign update inside the worker) against Krum (it publishes its rule; the detection tap counts
    whom it dropped) give the row the sequential sweep gives."""
    csv = _csv_dataset(tmp_path)
    spec = dict(
        SWEEP,
        overrides=[*_csv_overrides(csv), "rounds=1", "clients.num=5", "clients.min_clients=5",
                   "strategy.name=krum", "strategy.params.num_malicious=1",
                   "malicious.name=alie", "malicious.clients=[0, 2]"],
        grid={"seed": [0]},
    )  # fmt: skip
    sweep = load_sweep(_write(tmp_path, spec))
    seq = run_sweep(sweep, tmp_path / "seq", inline_grid)
    par = run_sweep(sweep, tmp_path / "ray", inline_grid, ray=RayOptions())
    frames = [pd.read_csv(out / "cells.csv").drop(columns=list(TIMING)) for out in (seq, par)]
    assert (frames[1]["status"] == "ok").all() and "detection.tpr" in frames[1], frames[1].T
    pd.testing.assert_frame_equal(frames[0], frames[1], check_exact=True)
    (cell,) = cells_of(sweep)
    summary = json.loads((par / "cells" / cell["id"] / "summary.json").read_text())
    assert summary["malicious_partitions"] == [0, 2]
