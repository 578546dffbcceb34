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
        # an attack on a workload that cannot serve it: names the attack, the workload, the gap
        (
            ["quickstart", "attack.name=goliath"],
            "attack 'goliath' needs tabular-diffusion, which workload 'tabular-mlp' does not offer",
        ),
        (
            ["digits-classifier", "attack.name=analytic-fc", "workload.params.model=cnn"],
            "attack 'analytic-fc' needs linear-first-layer, which workload 'digits-classifier' does "
            "not offer here (model=cnn starts with a convolution)",
        ),
        (
            ["tabdiff-adult-mixed", "attack.name=analytic-fc"],
            "attack 'analytic-fc' needs linear-first-layer + model-loss, which workload 'tabdiff'",
        ),
        (
            ["fits", "attack.name=dlg"],
            "attack 'dlg' needs tabular-diffusion or model-loss, which workload 'fits' does not",
        ),
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


def test_list_attacks_shows_the_workloads_each_runs_on():
    result = runner.invoke(app, ["list", "attacks"])
    assert result.exit_code == 0
    rows: dict[str, str] = {}
    name = ""
    for line in result.output.splitlines():  # a row may wrap over several lines
        cells = [c.strip() for c in line.strip("│").split("│")]
        if len(cells) == 3:
            name = cells[0] or name
            rows[name] = " ".join([rows.get(name, ""), cells[2]])
    assert "on: tabdiff" in rows["goliath"] and "tabular-mlp" not in rows["goliath"]
    for name in ("dlg", "idlg", "inverting-gradients", "random-baseline"):
        assert all(w in rows[name] for w in ("tabdiff", "tabular-mlp", "digits-classifier")), name
    assert "digits-classifier, tabular-mlp" in rows["analytic-fc"]


def test_list_kinds():
    result = runner.invoke(app, ["list", "workloads"])
    assert result.exit_code == 0 and "tabular-mlp" in result.output
    bad = runner.invoke(app, ["list", "gizmos"])
    assert bad.exit_code == 2 and "allowed:" in bad.output
