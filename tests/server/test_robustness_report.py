"""The robustness benchmark's report on hand-made cells: worst case over fractions and splits
with its seed interval, the clean table, backdoor ASR, detection rates and the heatmap; and the
shipped preset's grid (its cell count, every cell resolving)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pandas as pd

from flowerbed.server.robustness_report import heatmap, is_robustness, robustness_md, worst_case
from flowerbed.server.sweep_layout import markdown_table


def _cells() -> pd.DataFrame:
    rows = []
    for arm, attack, fraction, split, seed in itertools.product(
        ["adult.fedavg", "adult.krum"], ["sign-flip", "backdoor"], [0.0, 0.1, 0.3],
        ["iid", "dirichlet"], [0, 1, 2],
    ):  # fmt: skip
        accuracy = 0.83 - (
            0.6 * fraction if arm == "adult.fedavg" and attack == "sign-flip" else 0.01
        )
        accuracy -= 0.05 if split == "dirichlet" else 0.0
        rows.append({
            "arm": arm, "malicious.name": attack, "malicious.fraction": fraction,
            "clients.partitioner": split, "seed": seed, "status": "ok",
            "central.accuracy": accuracy + 0.001 * seed,
            "central.backdoor_asr": 0.9 * fraction if attack == "backdoor" else float("nan"),
            "detection.tpr": 1.0 if arm == "adult.krum" else float("nan"),
        })  # fmt: skip
    return pd.DataFrame(rows)


def test_worst_case_is_the_lowest_setting_over_fractions_and_splits_with_its_interval() -> None:
    worst = worst_case(_cells())
    fedavg = worst[("adult", "fedavg", "sign-flip")]
    assert abs(fedavg.mean - (0.83 - 0.18 - 0.05 + 0.001)) < 1e-9  # fraction 0.3, dirichlet
    assert fedavg.n == 3 and fedavg.lo <= fedavg.mean <= fedavg.hi
    assert abs(worst[("adult", "krum", "sign-flip")].mean - (0.83 - 0.01 - 0.05 + 0.001)) < 1e-9


def test_results_sections_and_heatmap(tmp_path) -> None:
    ok = _cells()
    sweep = SimpleNamespace(report=SimpleNamespace(rows="malicious.name"))
    assert is_robustness(sweep, ok)
    text = "\n".join(robustness_md(ok, markdown_table))
    for heading in ("Worst-case accuracy", "Clean accuracy", "Backdoor attack success rate", "Detection"):  # fmt: skip
        assert heading in text
    assert "| adult.krum | 1 |" in text  # detection.tpr of the selecting defense
    heatmap(ok, tmp_path / "heatmap.png")
    assert (tmp_path / "heatmap.png").stat().st_size > 10_000


def test_the_shipped_preset_has_the_documented_grid() -> None:
    from flowerbed.server.sweep import load_sweep

    sweep = load_sweep("robustness-benchmark")
    cells = len(sweep.arms) * len(sweep.seeds) * len(list(itertools.product(*sweep.grid.values())))
    assert cells == 1680
    assert {a.name.split(".")[0] for a in sweep.arms} == {"adult", "digits"}


def test_clean_accuracy_counts_each_clean_run_once() -> None:
    """A fraction-0 cell is the same run under every attack's name: the clean interval is over
    seeds x splits (6 runs), not over those runs repeated per attack (12 rows)."""
    from flowerbed.server.sweep_stats import bootstrap

    ok = _cells()
    text = "\n".join(robustness_md(ok, markdown_table))
    clean = ok[(ok["arm"] == "adult.krum") & (ok["malicious.fraction"] == 0)]
    once = clean[clean["malicious.name"] == "sign-flip"]["central.accuracy"].to_numpy()
    assert len(once) == 6 and len(clean) == 12
    assert f"| adult.krum | {bootstrap(once).text()} |" in text
