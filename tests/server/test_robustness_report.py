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
    from flowerbed.server.sweep import cells_of, load_sweep

    sweep = load_sweep("robustness-benchmark")
    full = len(sweep.arms) * len(sweep.seeds) * len(list(itertools.product(*sweep.grid.values())))
    assert full == 1680  # every aggregator alone: every attack, fraction and split
    assert {a.name.split(".")[0] for a in sweep.arms} == {"adult", "digits"}
    # the client-side defenses crossed with the Adult aggregators (30 %, Dirichlet; clean runs):
    # FedAvg x 6 + 4 robust x 5 (not behind secagg) = 26 pairs x (7 + 1) x 3 seeds
    assert len(cells_of(sweep)) == 1680 + 26 * 8 * 3
    robust = [a for a in sweep.arms if a.name.startswith("adult.") and a.name != "adult.fedavg"]
    assert robust and all(a.without == ["secagg"] for a in robust)
    # the same client-side settings whose privacy axis aggregator-privacy measures
    privacy = load_sweep("aggregator-privacy")
    assert sweep.grids[0]["defenses"] == privacy.grid["defenses"][1:]


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


def test_a_client_side_setting_makes_its_own_defense_with_the_aggregator(tmp_path) -> None:
    """With a ``defenses`` grid key, krum under DP-SGD is the defense ``krum+dp-sgd(...)``,
    apart from krum alone, in the worst-case, clean and ASR tables and the heatmap."""
    dp = "dp-sgd(max_grad_norm=1.0,noise_multiplier=0.5)"
    plain = _cells().assign(defenses="none")
    crossed = plain[plain["malicious.fraction"] != 0.1].assign(defenses=dp)
    crossed["central.accuracy"] -= 0.1
    ok = pd.concat([plain, crossed], ignore_index=True)
    worst = worst_case(ok)
    alone, with_dp = (
        worst[("adult", "krum", "sign-flip")],
        worst[("adult", f"krum+{dp}", "sign-flip")],
    )
    assert abs(with_dp.mean - (alone.mean - 0.1)) < 1e-9
    text = "\n".join(robustness_md(ok, markdown_table))
    assert f"| adult.krum+{dp} |" in text and "| adult.krum |" in text
    heatmap(ok, tmp_path / "heatmap.png")
    assert (tmp_path / "heatmap.png").stat().st_size > 10_000
