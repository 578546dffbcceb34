"""CLI behaviour: bad input is one line, exit 2, and no run directory; show/list work."""

import json

import pytest
from typer.testing import CliRunner

from flowerbed.apps.cli import app

runner = CliRunner()


def _run(tmp_path, *args):
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", *args, "--engine", "inline", "--out", str(out)])
    return result, out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["quickstart", "clients.nmu=3"], "unknown key 'clients.nmu'"),
        (["quickstart", "rounds=three"], "wrong type for 'rounds'"),
        (["quickstart", "workload.params.lr=fast"], "wrong type for 'workload.params.lr'"),
        (["quickstart", "workload.params.bogus=1"], "unknown key 'workload.params.bogus'"),
        (["no-such-experiment"], "unknown experiment 'no-such-experiment'"),
        (["quickstart", "strategy.name=fedsgdx"], "unknown strategy 'fedsgdx'"),
        (["quickstart", "clients.partitioner=zipf"], "allowed: iid, dirichlet"),
    ],
)
def test_bad_config_is_one_line_exit_2_no_run_dir(tmp_path, args, needle):
    result, out = _run(tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists()


def test_missing_dataset_file(tmp_path):
    result, out = _run(
        tmp_path, "quickstart", "dataset.name=csv", f"dataset.path={tmp_path}/nope.csv",
        "dataset.label=y",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "dataset file not found" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_nan_csv(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("a,b,y\n1.0,x,yes\nnan,y,no\n2.0,x,no\n")
    result, out = _run(
        tmp_path, "quickstart", "dataset.name=csv", f"dataset.path={csv}", "dataset.label=y",
        "dataset.numeric=[a]", "dataset.categorical=[b]",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "NaN or non-numeric value in 'a' (line 3)" in result.output
    assert not out.exists()


def test_csv_dataset_runs_and_show_reprints(tmp_path):
    csv = tmp_path / "t.csv"
    rows = ["a,b,y"] + [f"{i % 7},{'xy'[i % 2]},{'yes' if i % 7 > 3 else 'no'}" for i in range(200)]
    csv.write_text("\n".join(rows) + "\n")
    result, out = _run(
        tmp_path, "quickstart", "dataset.name=csv", f"dataset.path={csv}", "dataset.label=y",
        "dataset.numeric=[a]", "dataset.categorical=[b]", "clients.num=3", "rounds=2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "report.md", "curves.png"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and "central.accuracy" in summary["metrics"]
    shown = runner.invoke(app, ["show", str(out)])
    assert shown.exit_code == 0 and "central.accuracy" in shown.output


def test_list_kinds():
    result = runner.invoke(app, ["list", "workloads"])
    assert result.exit_code == 0 and "tabular-mlp" in result.output
    bad = runner.invoke(app, ["list", "gizmos"])
    assert bad.exit_code == 2 and "allowed:" in bad.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--ray", "not an address"], "--ray address 'not an address' not understood (allowed: local, auto"),
        (["--cpus-per-cell", "2"], "--cpus-per-cell needs --ray"),
        (["--cell-timeout", "60"], "--cell-timeout needs --ray"),
        (["--ray", "--cpus-per-cell", "0"], "--cpus-per-cell must be > 0"),  # --ray alone: local
        (["--ray", "auto", "--gpus-per-cell", "-1"], "--gpus-per-cell must be >= 0"),
        (["--ray", "--cell-timeout", "0"], "--cell-timeout must be > 0 seconds"),
    ],
)  # fmt: skip
def test_bad_sweep_options_are_one_line_exit_2(tmp_path, args, needle):
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", "quickstart-lr", "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists()
