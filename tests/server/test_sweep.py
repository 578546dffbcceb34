"""Sweeps: one engine start, SIGKILL + --resume runs every cell exactly once, crashes recorded."""

import json
import signal
import subprocess
import sys
import time

import pytest
import yaml

from flowerbed.apps.inline import inline_grid
from flowerbed.clients.core.errors import ConfigError
from flowerbed.server.sweep import finished_ids, load_sweep, run_sweep

SWEEP = {
    "name": "tiny",
    "base": "quickstart",
    "overrides": ["rounds=1", "clients.num=3", "dataset.max_rows=3000", "output.plots=false"],
    "engine": "inline",
    "grid": {"workload.params.lr": [0.01, 0.05, 0.1], "seed": [0, 1]},
    "report": {"rows": "seed", "columns": "workload.params.lr", "value": "central.accuracy"},
}


def _valid_ids(out) -> list[str]:
    ids = []
    for raw in (out / "cells.jsonl").read_text().splitlines():
        try:
            ids.append(json.loads(raw)["id"])
        except json.JSONDecodeError:
            pass
    return ids


def test_kill_9_then_resume_runs_every_cell_once(tmp_path):
    spec_path = tmp_path / "tiny.yaml"
    spec_path.write_text(yaml.safe_dump(SWEEP))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowerbed.apps.cli", "sweep", str(spec_path), "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(finished_ids(out)) < 2 and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = finished_ids(out)
    assert 2 <= len(before) < 6, "the sweep should have been killed mid-way"
    run_sweep(load_sweep(spec_path), out, inline_grid, resume=True)
    ids = _valid_ids(out)
    assert len(ids) == len(set(ids)) == 6
    csv = (out / "cells.csv").read_text().splitlines()
    assert len(csv) == 7
    assert "central.accuracy" in (out / "results.md").read_text()


def test_a_bad_cell_is_refused_before_any_cell_runs(tmp_path):
    spec = dict(SWEEP, grid={"workload.params.hidden": [[8], [-3]]})
    spec_path = tmp_path / "bad.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match=r"sweep cell workload.params.hidden=\[-3\]: .*>= 1"):
        run_sweep(load_sweep(spec_path), tmp_path / "out", inline_grid)
    assert not (tmp_path / "out").exists()


def test_crashing_cell_is_recorded_and_sweep_goes_on(tmp_path):
    # valid config, fails at run time: 4 rows cannot feed 2 clients and a test split
    spec = dict(SWEEP, grid={"dataset.max_rows": [None, 4]})
    spec_path = tmp_path / "crash.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out = run_sweep(load_sweep(spec_path), tmp_path / "out", inline_grid)
    rows = [json.loads(r) for r in (out / "cells.jsonl").read_text().splitlines()]
    assert sorted(r["status"] for r in rows) == ["error", "ok"]
    assert "failed cells" in (out / "results.md").read_text()
