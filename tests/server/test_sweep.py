"""Sweeps: one engine start, SIGKILL + --resume runs every cell exactly once, crashes recorded."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from flowerbed.apps.inline import inline_grid
from flowerbed.clients.core.diskcache import CACHE_ENV
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
    results = (out / "results.md").read_text()
    assert "central.accuracy" in results
    # a utility grid: one row per run, no word of attacks, the plot fits the grid (lr along x)
    assert "one per run)" in results and "attack" not in results
    assert "Plot: `central_accuracy_vs_lr.png`" in results
    assert (out / "central_accuracy_vs_lr.png").stat().st_size > 5000


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


# -- seeds and repeats ------------------------------------------------------------------------------
SEEDED = {
    "name": "seeded",
    "base": "quickstart",
    "overrides": [
        "rounds=2",
        "clients.num=4",
        "dataset.max_rows=400",
        "attack.name=random-baseline",
        "attack.params.target_clients=[0,1,2,3]",
        "attack.params.rounds=[1,2]",
    ],  # fmt: skip
    "engine": "inline",
    "grid": {"defenses": [[], [{"name": "topk", "params": {"fraction": 0.1}}]]},
    "seeds": [0, 1, 2],
    "report": {"rows": "defenses", "value": "attack.success", "utility": "central.accuracy"},
}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeded")
    (root / "seeded.yaml").write_text(yaml.safe_dump(SEEDED))
    out = run_sweep(load_sweep(root / "seeded.yaml"), root / "out", inline_grid)
    return root, out


def test_cells_csv_keeps_every_seed_client_and_round_paired_across_defenses(seeded):
    import pandas as pd

    _, out = seeded
    cells = pd.read_csv(out / "cells.csv")
    # 2 settings x 3 seeds x 4 attacked clients x 2 attacked rounds: nothing averaged away
    assert len(cells) == 2 * 3 * 4 * 2 and (cells["status"] == "ok").all()
    assert sorted(cells["seed"].unique()) == [0, 1, 2]
    keys = ["seed", "attack.round", "attack.partition"]
    per_key = cells.groupby(keys)["defenses"].nunique()
    assert len(per_key) == 3 * 4 * 2 and (per_key == 2).all()  # every repeat has its pair
    runs = cells.drop_duplicates("cell")
    assert len(runs) == 6
    # each seed is its own run: its own split and model (the seed reached the config)
    none = runs[runs["defenses"] == "none"]
    assert none["central.accuracy"].nunique() == 3
    assert cells.groupby("seed")["attack.success"].mean().nunique() == 3
    md = (out / "results.md").read_text()
    assert "## Pareto table" in md and "95 % bootstrap" in md
    row = next(line for line in md.splitlines() if line.startswith("| none |"))
    assert row.count("[") >= 2  # utility and leakage with intervals


def test_resume_with_more_seeds_runs_only_the_new_cell_seed_pairs(seeded, monkeypatch):
    root, out = seeded
    spec = dict(SEEDED, seeds=[0, 1, 2, 3])
    (root / "more.yaml").write_text(yaml.safe_dump(spec))
    ran, caches = [], []
    monkeypatch.delenv(CACHE_ENV, raising=False)

    def record(cell: dict) -> None:
        ran.append(cell)
        caches.append(os.environ.get(CACHE_ENV))

    run_sweep(load_sweep(root / "more.yaml"), out, inline_grid, resume=True, on_cell=record)
    assert sorted(r["params"]["seed"] for r in ran) == ["3", "3"]  # one per setting
    # the cells share one disk cache (a tabdiff warm start is built once per seed), the
    # sweep's own, and the caller's environment is left as it was
    assert caches == [str(out.resolve() / ".cache")] * 2 and CACHE_ENV not in os.environ
    ids = _valid_ids(out)
    assert len(ids) == len(set(ids)) == 8


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"sedes": [0, 1]}, "sedes"),
        ({"seeds": []}, "sweep seeds must be a non-empty list of distinct integers >= 0"),
        ({"seeds": [1, 1]}, "sweep seeds must be a non-empty list of distinct integers >= 0"),
        ({"seeds": [-1]}, "sweep seeds must be a non-empty list of distinct integers >= 0"),
        ({"seeds": ["a"]}, "seeds"),
        ({"grid": {"seed": [0, 1]}}, "sweep seeds and a grid key 'seed' both set the seed"),
        ({"arms": [{"name": "a"}, {"name": "a"}]}, "sweep arms need distinct names"),
        ({"arms": [{"name": "a", "bse": "x"}]}, "bse"),
    ],
)  # fmt: skip
def test_bad_sweep_spec_is_one_line_exit_2(tmp_path, change, needle):
    from typer.testing import CliRunner

    from flowerbed.apps.cli import app

    spec = dict(SEEDED, **change)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["sweep", str(tmp_path / "bad.yaml"), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert needle in result.output
    assert not out.exists()


def test_each_arm_gets_its_own_base_and_overrides():
    from flowerbed.server.sweep import cell_config, cells_of

    sweep = load_sweep("privacy-benchmark")
    seen = {}
    for cell in cells_of(sweep):
        arm = cell["params"]["arm"]
        if arm not in seen:
            seen[arm] = cell_config(sweep, cell)
    assert list(seen) == [a.name for a in sweep.arms]
    for name, experiment in seen.items():
        workload = {"tabdiff": "tabdiff", "mlp": "tabular-mlp", "digits": "digits-classifier"}
        params = experiment.workload.params
        assert experiment.workload.name == workload[name.split("-")[0]], name
        assert params.protocol == name.split("-")[-1], name
        assert experiment.attack.params.rounds == [1, experiment.rounds], name
        # the tabdiff arms (width 256, warm-started) attack fewer clients: the grid's time budget
        fewer = {"tabdiff-fedsgd": [0], "tabdiff-fedavg": [0, 1]}
        clients = fewer.get(name, [0, 1, 2, 3])
        assert experiment.attack.params.target_clients == clients, name
        if name.startswith("tabdiff"):
            assert params.hidden == 256 and params.layers == 3 and params.pretrain_rows > 0
        if name.endswith("fedavg"):
            assert params.batch_size >= 32
            assert params.local_epochs >= 2
    # tabdiff-fedavg runs undefended only (its ``without:``)
    assert len(cells_of(sweep)) == 5 * 13 * 3 + 3


def test_an_arm_without_secagg_is_not_crossed_with_it_and_the_full_grid_resolves():
    """privacy-benchmark-full: the six arms whose attack reads single updates leave out the
    three secagg settings (6 x 3 x 5 runs fewer); every other arm keeps them, and its secagg
    cells resolve (their attacks read aggregates: none would run without scoring)."""
    from flowerbed.server.sweep import cell_config, cells_of

    sweep = load_sweep("privacy-benchmark-full")
    cells = cells_of(sweep)
    assert len(cells) == 14 * 19 * 5 - 6 * 3 * 5
    without = {a.name for a in sweep.arms if a.without == ["secagg"]}
    assert len(without) == 6
    for cell in cells:
        names = [d["name"] for d in cell["params"]["defenses"]]
        assert not (cell["params"]["arm"] in without and "secagg" in names)
    secagg = [c for c in cells if c["params"]["seed"] == 0
              and "secagg" in [d["name"] for d in c["params"]["defenses"]]]  # fmt: skip
    assert len(secagg) == (14 - 6) * 3
    for cell in secagg:
        cell_config(sweep, cell)


# -- grids (a union of product grids) and the pairs a sweep does not run ---------------------------
CROSSED = {
    "name": "crossed",
    "base": "quickstart",
    "overrides": ["rounds=1", "clients.num=10", "malicious.name=sign-flip"],
    "seeds": [0, 1],
    "arms": [
        {"name": "adult.fedavg", "overrides": ["strategy.name=fedavg"]},
        {"name": "adult.krum", "without": ["secagg"],
         "overrides": ["strategy.name=krum", "strategy.params.num_malicious=3"]},
        {"name": "adult.median", "without": ["topk"], "overrides": ["strategy.name=fedmedian"]},
    ],
    "grid": {"malicious.fraction": [0.0, 0.1, 0.3], "defenses": [[]]},
    "grids": [{"malicious.fraction": [0.3], "defenses": [
        [], [{"name": "topk", "params": {"fraction": 0.1}}], [{"name": "secagg"}]]}],
}  # fmt: skip


def test_grids_join_the_grid_each_cell_once_and_refused_pairs_are_listed_with_why(tmp_path):
    """A second grid adds its cells (the one it shares with the first, fraction 0.3 undefended,
    runs once, with the same id); an arm's ``without`` pairs are listed: refused ones with the
    one-line refusal their config gets, the others as left out by choice."""
    from flowerbed.server.sweep import cannot_combine, cells_of
    from flowerbed.server.sweep_report import cannot_combine_md

    path = tmp_path / "crossed.yaml"
    path.write_text(yaml.safe_dump(CROSSED))
    sweep = load_sweep(path)
    cells = cells_of(sweep)
    first = [c for c in cells if c["params"]["defenses"] == []]
    assert len(first) == 3 * 3 * 2  # the grid's, not repeated by the second grid
    crossed = {(c["params"]["arm"], json.dumps(c["params"]["defenses"])) for c in cells} - {
        (a, "[]") for a in ("adult.fedavg", "adult.krum", "adult.median")}  # fmt: skip
    assert {a for a, _ in crossed} == {"adult.fedavg", "adult.krum", "adult.median"}
    assert len(cells) == 18 + 2 * (2 + 1 + 1) and len({c["id"] for c in cells}) == len(cells)
    pairs = {(r["arm"], r["defenses"]): r for r in cannot_combine(sweep)}
    assert set(pairs) == {("adult.krum", "secagg"), ("adult.median", "topk(fraction=0.1)")}
    refused = pairs[("adult.krum", "secagg")]
    assert refused["kind"] == "refused" and refused["reason"] == (
        "strategy 'krum' needs individual-updates, which defense 'secagg' withholds from the "
        "server; use one or the other")  # fmt: skip
    assert pairs[("adult.median", "topk(fraction=0.1)")]["kind"] == "left out"
    text = "\n".join(cannot_combine_md(list(pairs.values())))
    assert f"- `adult.krum` x `secagg`: {refused['reason']}" in text
    assert "## Left out by the sweep" in text and "- `adult.median` x `topk(fraction=0.1)`" in text
    bad = dict(CROSSED, grids=[{"defenses": [[]]}])
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=r"sweep grids.0 has keys \['defenses'\]; every grid"):
        load_sweep(path)
