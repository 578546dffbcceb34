"""Sweep statistics: bootstrap intervals, paired comparisons, ties that are not domination, and the
frontier's labels (constructed frames: no runs, milliseconds)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from flowerbed.server.sweep import Arm, SweepConfig
from flowerbed.server.sweep_labels import place_labels
from flowerbed.server.sweep_layout import Goal, ReportConfig
from flowerbed.server.sweep_plots import frontier_plot
from flowerbed.server.sweep_stats import bootstrap, paired
from flowerbed.server.sweep_study import panels_of, pareto

REPORT = ReportConfig(rows="defenses", value="attack.unaware_success", adaptive="attack.success",
                      utility="central.accuracy", utility_goal=Goal.max)  # fmt: skip


def test_bootstrap_interval_holds_the_mean_narrows_with_n_and_is_seeded():
    rng = np.random.default_rng(1)
    small, large = rng.normal(0.5, 0.1, 8), rng.normal(0.5, 0.1, 800)
    a, b = bootstrap(small), bootstrap(large)
    assert a.lo < a.mean < a.hi and b.lo < b.mean < b.hi
    assert (b.hi - b.lo) < (a.hi - a.lo) / 5  # ~ 1/sqrt(100) of the width
    # coverage: the 95 % interval of a mean of 20 holds the true mean in ~95 % of samples
    covered = [e.lo < 0.5 < e.hi for e in (bootstrap(rng.normal(0.5, 0.1, 20)) for _ in range(200))]
    assert 0.88 <= np.mean(covered) <= 0.99
    assert bootstrap(small) == a  # same values, same interval
    one = bootstrap([0.3])
    assert one.mean == 0.3 and np.isnan(one.lo) and not one.excludes_zero()
    assert bootstrap([np.nan, np.nan]).n == 0


def test_paired_difference_cancels_the_shared_seed_effect():
    seeds = pd.Index(range(6), name="seed")
    effect = pd.Series([0.0, 0.5, 1.0, 1.5, 2.0, 2.5], index=seeds)  # the seed moves both
    a, b = effect + 0.10, effect + 0.11
    diff = paired(b, a)
    assert abs(diff.mean - 0.01) < 1e-12 and diff.excludes_zero()  # paired: exact 0.01 each
    unpaired = bootstrap(b.to_numpy() - a.sample(frac=1, random_state=3).to_numpy())
    assert not unpaired.excludes_zero()  # shuffled pairs: the seed effect swamps 0.01


def _study(rows: dict[str, tuple[list[float], list[float]]], seeds: int = 4) -> pd.DataFrame:
    """Repeats: per setting (utility per seed, leakage per seed x client), 2 clients, 1 round."""
    out = []
    for setting, (utility, leak) in rows.items():
        for s in range(seeds):
            for client in range(2):
                out.append({
                    "cell": f"{setting}-{s}", "defenses": setting, "seed": s, "status": "ok",
                    "central.accuracy": utility[s], "attack.round": 1, "attack.partition": client,
                    "attack.success": leak[2 * s + client], "attack.prior": 0.5,
                    "attack.advantage": (leak[2 * s + client] - 0.5) / 0.5,
                })  # fmt: skip
    return pd.DataFrame(out)


SWEEP = SweepConfig(name="constructed", grid={"defenses": []}, seeds=[0, 1, 2, 3], report=REPORT)


def test_settings_inside_each_others_interval_tie_a_clear_loser_is_dominated():
    noise = np.random.default_rng(0).normal(0, 0.05, 8)
    frame = _study({
        "none": ([0.80, 0.82, 0.78, 0.81], list(0.90 + noise)),
        # better than none by less than the noise on both axes: a tie, not a domination
        "topk(fraction=0.5)": ([0.81, 0.80, 0.79, 0.82], list(0.89 + noise[::-1])),
        # worse on both axes by far more than the noise
        "quantize(bits=2)": ([0.60, 0.62, 0.58, 0.61], list(0.99 + noise / 10)),
    })  # fmt: skip
    (panel,) = panels_of(SWEEP, frame)
    assert panel.advantage  # the prior was measured: leakage is the advantage over it
    topk_vs_none = panel.comparisons["none"]["topk(fraction=0.5)"]
    assert topk_vs_none.utility.mean > 0 and topk_vs_none.privacy.mean > 0  # better on both...
    assert topk_vs_none.tie and not topk_vs_none.dominates  # ...but inside the intervals
    assert panel.comparisons["quantize(bits=2)"]["none"].dominates
    front = pareto(panel, "central.accuracy", Goal.max)
    assert set(front) == {"none", "topk(fraction=0.5)"}
    est = panel.estimates["none"]
    assert est["worst_case"].lo < est["worst_case"].mean < est["worst_case"].hi
    assert est["runs"].mean == 4 and est["repeats"].mean == 8


def test_domination_needs_both_paired_differences_outside_their_intervals():
    """``none`` is better than each other setting on both axes, but beyond the interval on one
    axis only: nothing is dominated, every setting stays on the front."""
    noise = np.random.default_rng(0).normal(0, 0.05, 8)
    frame = _study({
        "none": ([0.80, 0.82, 0.78, 0.81], list(0.90 + noise)),
        # worse than none: by far on utility, inside the interval on leakage (and the mirror)
        "utility-only": ([0.60, 0.62, 0.58, 0.61], list(0.905 + noise[::-1])),
        "privacy-only": ([0.81, 0.80, 0.79, 0.80], list(0.99 + noise / 10)),
    })  # fmt: skip
    (panel,) = panels_of(SWEEP, frame)
    one_axis = [panel.comparisons["utility-only"]["none"], panel.comparisons["privacy-only"]["none"]]  # fmt: skip
    assert all(c.utility.mean > 0 and c.privacy.mean > 0 for c in one_axis)  # none: better on both
    assert [c.utility.excludes_zero() for c in one_axis] == [True, False]
    assert [c.privacy.excludes_zero() for c in one_axis] == [False, True]
    assert not any(c.dominates for c in one_axis)
    assert set(pareto(panel, "central.accuracy", Goal.max)) == set(panel.comparisons)


def test_frontier_panels_have_bars_prior_line_and_no_overlapping_labels(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    rng = np.random.default_rng(2)
    settings = {"none": 0.8} | {f"topk(fraction={f})": 0.8 - 0.001 * i for i, f in enumerate([0.3, 0.1, 0.05, 0.01])}  # fmt: skip
    frames = []
    for arm in ("fedsgd", "fedavg"):
        rows = {s: (list(u + rng.normal(0, 0.01, 4)), list(0.9 + rng.normal(0, 0.01, 8))) for s, u in settings.items()}  # fmt: skip
        frames.append(_study(rows).assign(arm=arm, cell=lambda f, a=arm: f["cell"] + a))
    sweep = SweepConfig(name="two-arms", grid={"defenses": []}, seeds=[0, 1, 2, 3], report=REPORT,
                        arms=[Arm(name="fedsgd"), Arm(name="fedavg")])  # fmt: skip
    frame = pd.concat(frames, ignore_index=True)
    frontier_plot(sweep, frame, tmp_path / "frontier.png")
    assert (tmp_path / "frontier.png").stat().st_size > 10_000
    assert len(panels_of(sweep, frame)) == 2
    # labels of points crowded together (utility within 0.004, leakage within noise) do not overlap
    fig, ax = plt.subplots()
    points = [(f"label {i}", 0.8 + 0.0005 * i, 0.9) for i in range(8)]
    ax.scatter([p[1] for p in points], [p[2] for p in points])
    texts = place_labels(fig, ax, points)
    renderer = fig.canvas.get_renderer()
    # the numbers' own boxes (an annotation's extent also spans its leader line)
    boxes = [Text.get_window_extent(t, renderer) for t in texts]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b)
    plt.close(fig)


def test_repeats_from_attacks_jsonl_merge_the_unaware_rows_and_fall_back_to_metrics(tmp_path):
    import json

    from flowerbed.server.sweep_stats import attack_repeats

    run = tmp_path / "run"
    run.mkdir()
    lines = [
        {"round": 1, "partition": 0, "success": 0.7, "prior": 0.5, "advantage": 0.4},
        {"round": 1, "partition": 0, "attacker": "unaware", "success": 0.6, "prior": 0.5},
        {"round": 1, "partition": 3, "success": 0.9, "unaware_success": 0.8, "prior": 0.5},
    ]
    (run / "attacks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"cut')
    reps = {(r["attack.round"], r["attack.partition"]): r for r in attack_repeats(run)}
    assert set(reps) == {(1, 0), (1, 3)}
    assert reps[(1, 0)]["attack.success"] == 0.7 and reps[(1, 0)]["attack.unaware_success"] == 0.6
    assert reps[(1, 3)]["attack.unaware_success"] == 0.8 and reps[(1, 0)]["attack.advantage"] == 0.4
    (run / "attacks.jsonl").unlink()
    scores = [{"round": 2, "scope": "attack", "unaware_success": 0.2}, {"round": 2, "scope": "attack", "success": 0.3},
              {"round": 2, "scope": "attack", "unaware_success": 0.4}, {"round": 2, "scope": "attack", "success": 0.5},
              {"round": 2, "scope": "central", "accuracy": 0.9}]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in scores))
    reps = attack_repeats(run)
    assert [(r["attack.partition"], r["attack.unaware_success"], r["attack.success"]) for r in reps] == [
        (0, 0.2, 0.3), (1, 0.4, 0.5)]  # fmt: skip
