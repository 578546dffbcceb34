"""The attack-evaluation harness: overrides anywhere on the line, a user's CSV table named by its
file, attack names checked per workload, classifier workloads, trained-model cases; and a user's
own table attacked in a federated run with config only."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from flowerbed.apps.attack_eval import run, split_overrides


@pytest.fixture
def table_csv(tmp_path):
    """A table the project has never seen: 2 numeric, 2 categorical columns and a label."""
    rng = np.random.default_rng(0)
    n = 400
    frame = pd.DataFrame({
        "dose": rng.normal(50, 10, n).round(1), "weight": rng.gamma(5, 12, n).round(2),
        "site": rng.choice(["north", "south", "east"], n), "arm": rng.choice(["a", "b"], n),
        "outcome": rng.choice(["good", "bad"], n),
    })  # fmt: skip
    path = tmp_path / "clinic_visits.csv"
    frame.to_csv(path, index=False)
    return path


def _csv_overrides(path) -> list[str]:
    return [f"dataset.path={path}", "dataset.label=outcome", "dataset.numeric=[dose,weight]",
            "dataset.categorical=[site,arm]"]  # fmt: skip


def test_overrides_are_not_swallowed_by_the_attack_list() -> None:
    options, overrides = split_overrides(
        ["--attacks", "goliath", "random", "workload.params.hidden=64", "--batches", "2"]
    )
    assert options == ["--attacks", "goliath", "random", "--batches", "2"]
    assert overrides == ["workload.params.hidden=64"]


def test_csv_table_goliath_and_baseline_rows_named_by_file(table_csv, tmp_path, capsys) -> None:
    out = tmp_path / "rows.csv"
    code = run(["--datasets", "csv", "--regimes", "mixed", "--batch-sizes", "4", "--batches", "2",
                "--attacks", "goliath", "random", *_csv_overrides(table_csv),
                "--iterations", "20", "--restarts", "1", "--csv", str(out),
                "workload.params.hidden=32", "workload.params.layers=2"])  # fmt: skip
    assert code == 0
    df = pd.read_csv(out)
    assert set(df["dataset"]) == {"clinic_visits"}
    printed = capsys.readouterr().out
    assert "| clinic_visits | mixed | goliath |" in printed and "| csv |" not in printed
    goliath = df[df["attack"] == "goliath"]["accuracy"].mean()
    assert goliath > df[df["attack"] == "random"]["accuracy"].mean() + 0.2


def test_unknown_attack_for_the_workload_is_a_clear_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        run(["--workload", "digits-classifier", "--attacks", "goliath"])
    assert exc.value.code == 2
    assert "unknown attack 'goliath' for --workload digits-classifier" in capsys.readouterr().err


def test_csv_without_path_names_the_missing_key(capsys) -> None:
    assert run(["--datasets", "csv", "--batches", "1", "--batch-sizes", "1"]) == 2
    assert "dataset 'csv' needs dataset.path" in capsys.readouterr().err


def test_classifier_harness_on_the_csv_table_and_trained_rounds(table_csv, tmp_path) -> None:
    """tabular-mlp on the user's table: analytic-fc recovers one row exactly, at initialisation
    and after two rounds of the preset's own training (model cached and reused)."""
    out = tmp_path / "rows.csv"
    code = run(["--workload", "tabular-mlp", "--datasets", "csv", "--batch-sizes", "1",
                "--batches", "2", "--attacks", "analytic-fc", "random", "--trained-rounds", "0",
                "2", "--model-cache", str(tmp_path / "models"), "--csv", str(out),
                "workload.params.protocol=fedsgd", "clients.num=2", *_csv_overrides(table_csv)])  # fmt: skip
    assert code == 0
    df = pd.read_csv(out)
    assert sorted(set(df["rounds"])) == [0, 2] and set(df["dataset"]) == {"clinic_visits"}
    assert (df[df["attack"] == "analytic-fc"]["success"] == 1.0).all()
    assert len(list((tmp_path / "models").glob("*.r2.pt"))) == 1


def test_users_table_in_a_federated_run_config_only(table_csv, tmp_path) -> None:
    """Goliath on the user's CSV through the platform (config only); the scorer's per-cell
    tolerance is 0.319 x each numeric column's std in the table's train split."""
    from flowerbed.apps.inline import run_inline
    from flowerbed.attacks.goliath import TruthScorer
    from flowerbed.attacks.metrics import TOLERANCE
    from flowerbed.clients.datasets import load_table
    from flowerbed.clients.workloads import build_workload
    from flowerbed.server.experiment import load_experiment
    from flowerbed.server.wrappers import truth_source

    cfg = load_experiment("goliath-adult-mixed", [
        "engine=inline", "rounds=1", "clients.num=2", f"output.dir={tmp_path}", "output.plots=false",
        "dataset.name=csv", *_csv_overrides(table_csv), "workload.params.batch_size=4",
        "workload.params.hidden=32", "workload.params.layers=2", "attack.params.target_clients=[0]"])  # fmt: skip
    summary = run_inline(cfg)
    assert summary["metrics"]["attack.success"] > 0.9
    train = load_table(cfg.dataset).train
    stds = TruthScorer(truth_source(cfg, build_workload(cfg))).stds
    assert stds == pytest.approx({c: float(train[c].std()) for c in ("dose", "weight")})
    assert TOLERANCE == 0.319
