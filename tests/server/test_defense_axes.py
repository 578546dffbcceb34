"""The three-axis table per defense (``python -m flowerbed.server.defense_axes``) on hand-made
privacy-benchmark and robustness-benchmark sweep directories: each axis from the right sweep with
its interval, unmeasured axes said, bad input refused in one line with nothing written."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flowerbed.server.defense_axes import NOT_MEASURED, main

DP = "dp-sgd(max_grad_norm=1.0,noise_multiplier=2.0)"
SECAGG = "secagg(group_size=8)"


def _sweep_dir(path: Path, name: str, rows: list[dict]) -> Path:
    path.mkdir()
    (path / "sweep.json").write_text(json.dumps({"name": name, "spec": "x", "cells": []}))
    pd.DataFrame(rows).to_csv(path / "cells.csv", index=False)
    return path


def privacy_dir(path: Path) -> Path:
    """Two arms of the shipped privacy benchmark x three settings x 3 seeds x 4 repeats."""
    rows = []
    for arm, setting, seed in itertools.product(["mlp-fedavg", "digits-fedavg"], ["none", DP, SECAGG], [0, 1, 2]):  # fmt: skip
        accuracy = {"none": 0.82, DP: 0.78, SECAGG: 0.82}[setting] + 0.01 * seed
        for rnd, partition in itertools.product([1, 20], [0, 1]):
            adaptive = {"none": 0.9, DP: 0.1, SECAGG: 0.02}[setting] + 0.01 * partition
            unaware = math.nan if setting == SECAGG else adaptive - 0.05 + 0.1 * (rnd == 1)
            rows.append({
                "cell": f"{arm}-{setting}-{seed}", "arm": arm, "defenses": setting, "seed": seed,
                "status": "ok", "central.accuracy": accuracy, "attack.round": rnd,
                "attack.partition": partition, "attack.success": 0.5 + adaptive / 2,
                "attack.advantage": adaptive, "attack.unaware_success": 0.5 + unaware / 2,
                "attack.unaware_advantage": unaware, "attack.prior": 0.5,
            })  # fmt: skip
    return _sweep_dir(path, "privacy-benchmark", rows)


def robustness_dir(path: Path) -> Path:
    rows = []
    for arm, attack, fraction, split, seed in itertools.product(
        ["adult.fedavg", "adult.krum"], ["sign-flip", "backdoor"], [0.0, 0.1, 0.3],
        ["iid", "dirichlet"], [0, 1, 2],
    ):  # fmt: skip
        hit = arm == "adult.fedavg" and attack == "sign-flip"
        rows.append({
            "cell": f"{arm}-{attack}-{fraction}-{split}-{seed}", "arm": arm,
            "malicious.name": attack, "malicious.fraction": fraction,
            "clients.partitioner": split, "seed": seed, "status": "ok",
            "central.accuracy": 0.83 - (0.6 * fraction if hit else 0.01 * fraction) + 0.001 * seed,
            "central.backdoor_asr": (0.9 if arm == "adult.fedavg" else 0.2) * fraction + 0.01 * seed
            if attack == "backdoor" else math.nan,
        })  # fmt: skip
    return _sweep_dir(path, "robustness-benchmark", rows)


def _tables(text: str) -> dict[str, list[list[str]]]:
    """defense -> the rows of its table (cells split, header and rule dropped)."""
    out: dict[str, list[list[str]]] = {}
    for block in text.split("\n## ")[1:]:
        name, *lines = block.splitlines()
        body = [ln for ln in lines if ln.startswith("| ")][1:]
        out[name] = [[c.strip() for c in ln.strip("|").split("|")] for ln in body]
    return out


@pytest.fixture
def dirs(tmp_path) -> tuple[Path, Path]:
    return privacy_dir(tmp_path / "privacy"), robustness_dir(tmp_path / "robustness")


def test_one_table_per_defense_with_each_axis_from_its_benchmark(dirs, tmp_path) -> None:
    out = tmp_path / "axes.md"
    assert main(["--privacy", str(dirs[0]), "--robustness", str(dirs[1]), "--out", str(out)]) == 0
    text = out.read_text()
    tables = _tables(text)
    assert list(tables) == ["none", DP, SECAGG, "krum"]  # fedavg is `none`, first
    none = {row[0]: row for row in tables["none"]}
    assert set(none) == {"privacy-benchmark · mlp-fedavg", "privacy-benchmark · digits-fedavg",
                         "robustness-benchmark · adult"}  # fmt: skip
    # privacy: utility over runs, leakage = the worse attacker per repeat, with intervals
    mlp = none["privacy-benchmark · mlp-fedavg"]
    assert mlp[1].startswith("0.83 [0.82, 0.84] `central.accuracy`")
    worst = np.mean([max(0.9 + 0.01 * p, 0.85 + 0.01 * p + 0.1 * (r == 1)) for r in (1, 20) for p in (0, 1)])  # fmt: skip
    assert mlp[2].startswith(f"{worst:.3g} [") and mlp[3] == mlp[4] == NOT_MEASURED
    # robustness: clean accuracy once per (seed, split), worst case naming the attack, ASR at 30 %
    adult = none["robustness-benchmark · adult"]
    assert adult[1].startswith("0.831 [0.83, 0.832] clean accuracy") and adult[2] == NOT_MEASURED
    assert adult[3].startswith(f"{0.83 - 0.18 + 0.001:.3g} [") and adult[3].endswith("(sign-flip)")
    assert adult[4].startswith(f"{0.27 + 0.01:.3g} [") and adult[4].endswith("at 30% malicious")
    (krum,) = tables["krum"]
    assert krum[2] == NOT_MEASURED and krum[3].endswith("(backdoor)")
    assert all(row[3] == row[4] == NOT_MEASURED for row in tables[DP])
    assert all(row[2].startswith("0.025 [") for row in tables[SECAGG])  # adaptive only
    assert "–" not in text and "| |" not in text and "nan" not in text


@pytest.mark.parametrize("swap", ["missing", "wrong-kind", "unknown-arm"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(dirs, tmp_path, capsys, swap) -> None:
    privacy, robustness = dirs
    if swap == "missing":
        privacy = tmp_path / "nope"
    elif swap == "wrong-kind":
        privacy, robustness = robustness, privacy
    else:
        frame = pd.read_csv(privacy / "cells.csv")
        frame.loc[0, "arm"] = "tabdiff-fedavg-renamed"
        frame.to_csv(privacy / "cells.csv", index=False)
    out = tmp_path / "axes.md"
    assert main(["--privacy", str(privacy), "--robustness", str(robustness), "--out", str(out)]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert not out.exists() and not list(tmp_path.glob(".axes.md*"))


@pytest.mark.parametrize("name", ["privacy-benchmark", "robustness-benchmark"])
def test_the_quick_presets_are_slices_of_the_shipped_benchmarks(name: str) -> None:
    """The toy slices behind the docs' example table run the shipped arms' own settings."""
    from flowerbed.server.sweep import load_sweep

    full, quick = load_sweep(name), load_sweep(f"{name}-quick")
    arms = {arm.name: arm for arm in full.arms}
    assert quick.arms and all(arm == arms[arm.name] for arm in quick.arms)
    assert (quick.base, quick.overrides, quick.seeds) == (full.base, full.overrides, full.seeds)
    assert set(quick.grid) == set(full.grid)
    assert all(value in full.grid[key] for key, values in quick.grid.items() for value in values)


def test_crossed_grids_give_each_pair_three_axes_and_refused_pairs_say_so(dirs, tmp_path) -> None:
    """A robustness sweep crossed with client-side defenses and a second privacy directory
    (aggregator-privacy: the same settings under Krum) fill ``krum+dp-sgd(...)`` on all three
    axes; a pair the robustness sweep refused (``sweep.json``) reads "cannot combine" with why."""
    from flowerbed.server.defense_axes import CANNOT_COMBINE

    privacy, robustness = dirs
    frame = pd.read_csv(privacy / "cells.csv")
    krum = frame[(frame["arm"] == "mlp-fedavg") & (frame["defenses"] != SECAGG)]
    second = _sweep_dir(tmp_path / "aggregator-privacy", "aggregator-privacy",
                        krum.assign(arm="mlp-fedavg-krum").to_dict("records"))  # fmt: skip
    cells = pd.read_csv(robustness / "cells.csv")
    crossed = cells.assign(defenses=DP, **{"central.accuracy": cells["central.accuracy"] - 0.1})
    pd.concat([cells.assign(defenses="none"), crossed]).to_csv(
        robustness / "cells.csv", index=False
    )
    why = (
        "strategy 'krum' needs individual-updates, which defense 'secagg' withholds from the server"
    )
    held = json.loads((robustness / "sweep.json").read_text())
    held["cannot_combine"] = [
        {"arm": "adult.krum", "defenses": SECAGG, "kind": "refused", "reason": why},
        {"arm": "adult.fedavg", "defenses": "topk(fraction=0.1)", "kind": "left out", "reason": "x"},
    ]  # fmt: skip
    (robustness / "sweep.json").write_text(json.dumps(held))
    out = tmp_path / "axes.md"
    args = ["--privacy", str(privacy), "--privacy", str(second), "--robustness", str(robustness)]
    assert main([*args, "--out", str(out)]) == 0
    tables = _tables(out.read_text())
    by_source = {r[0]: r for r in tables[f"krum+{DP}"]}
    assert set(by_source) == {
        "aggregator-privacy · mlp-fedavg-krum",
        "robustness-benchmark · adult",
    }
    assert NOT_MEASURED not in by_source["aggregator-privacy · mlp-fedavg-krum"][1:3]
    assert NOT_MEASURED not in by_source["robustness-benchmark · adult"][3:4]
    assert tables[f"krum+{SECAGG}"] == [["robustness-benchmark · adult", f"{CANNOT_COMBINE}: {why}",
                                         CANNOT_COMBINE, CANNOT_COMBINE, CANNOT_COMBINE]]  # fmt: skip
    assert "topk" not in out.read_text()  # left out by choice: no row
    assert main([*args, "--privacy-sweep", "aggregator-privacy"]) == 2  # one per --privacy
