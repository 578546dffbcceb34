"""Sweep reporting: the privacy-utility study (settings table, Pareto table, frontier plot) and a
small multi-round study sweep whose utility moves with the defense strength."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from flowerbed.apps.inline import inline_grid
from flowerbed.server.sweep import load_sweep, run_sweep
from flowerbed.server.sweep_plots import short_labels
from flowerbed.server.sweep_study import family_of, strength_of


def test_family_and_strength_of_defense_labels():
    assert family_of("dp-sgd(max_grad_norm=1.0,noise_multiplier=0.3)") == "dp-sgd"
    assert family_of("topk(fraction=0.1)+quantize(bits=2)") == "topk+quantize"
    assert family_of("none") == "none"
    assert strength_of("topk(fraction=0.1)+quantize(bits=2)") == "fraction=0.1,bits=2"
    dp = ["dp-sgd(max_grad_norm=1.0,noise_multiplier=0.5)", "dp-sgd(max_grad_norm=1.0,noise_multiplier=2.0)"]  # fmt: skip
    assert list(short_labels(dp).values()) == ["noise_multiplier=0.5", "noise_multiplier=2.0"]
    assert short_labels(dp[:1]) == {dp[0]: "max_grad_norm=1.0,noise_multiplier=0.5"}


STUDY = {
    "name": "tiny-study",
    "base": "goliath-adult-mixed",
    "overrides": [
        "rounds=3",
        "clients.num=2",
        "dataset.max_rows=16",
        "workload.params.lr=0.1",
        "attack.name=goliath-adaptive",
        "attack.params.restarts=1",
        "attack.params.iterations=3",
        "attack.params.cycles=1",
        "attack.params.rounds=[3]",
        "output.plots=false",
    ],  # fmt: skip
    "engine": "inline",
    "grid": {
        "defenses": [
            [],
            [{"name": "dp-sgd", "params": {"noise_multiplier": 0.5}}],
            [{"name": "dp-sgd", "params": {"noise_multiplier": 5.0}}],
            [{"name": "topk", "params": {"fraction": 0.5}}],
            [{"name": "topk", "params": {"fraction": 0.01}}],
        ]
    },
    "report": {
        "rows": "defenses",
        "value": "attack.unaware_success",
        "adaptive": "attack.success",
        "utility": "central.loss",
        "utility_goal": "min",
        "extra": ["dp.epsilon", "comm.upload_bytes_per_client"],
    },  # fmt: skip
}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    (root / "study.yaml").write_text(yaml.safe_dump(STUDY))
    out = run_sweep(load_sweep(root / "study.yaml"), root / "out", inline_grid)
    repeats = pd.read_csv(out / "cells.csv")
    assert len(repeats) == 5 * 2  # two attacked clients (the base's targets), one round each
    return out, repeats.drop_duplicates("cell").set_index("defenses")


def test_study_writes_cells_pareto_table_and_frontier(study):
    out, cells = study
    assert (cells["status"] == "ok").all() and len(cells) == 5
    md = (out / "results.md").read_text()
    assert "## Pareto table" in md and "## Privacy-utility per defense setting" in md
    assert (out / "frontier.png").stat().st_size > 10_000
    # per cell: utility, attack success per attacked round (both attackers), epsilon, bytes
    for column in ("central.loss", "attack.r3.success", "attack.r3.unaware_success"):
        assert cells[column].notna().all(), column
    assert cells["dp.epsilon"].notna().sum() == 2
    dense = cells.loc["none", "comm.upload_bytes_per_client"]
    assert cells.loc["topk(fraction=0.01)", "comm.upload_bytes_per_client"] < dense / 10


def test_utility_moves_with_defense_strength(study):
    _, cells = study
    loss = cells["central.loss"]
    dp_weak, dp_strong = "dp-sgd(noise_multiplier=0.5)", "dp-sgd(noise_multiplier=5.0)"
    assert loss[dp_strong] > loss[dp_weak] + 0.2  # measured 9.79 vs 9.14 (none 8.72)
    assert loss[dp_weak] > loss["none"] + 0.2
    assert abs(loss["topk(fraction=0.01)"] - loss["topk(fraction=0.5)"]) > 1e-3
    eps = cells["dp.epsilon"]
    assert eps[dp_strong] < eps[dp_weak]


def _crowded_study(n: int = 15):
    """A frontier panel of ``n`` dp-sgd settings whose points all but coincide (a cluster a few
    pixels wide beside the undefended point far off), 3 seeds each."""
    from types import SimpleNamespace

    from flowerbed.server.sweep_layout import ReportConfig

    rows = []
    settings = [(f"dp-sgd(max_grad_norm=1.0,noise_multiplier={0.1 * (i + 1):.1f})", 0.5 + 0.0005 * i,
                 0.40 + 0.004 * ((i * 7) % 5)) for i in range(n)]  # fmt: skip
    wide = "local-dp(clipping_norm=1.0,epsilon=10.0,sensitivity=1.0)"  # a long key-table entry
    for setting, utility, leak in [*settings, (wide, 0.45, 0.1), ("none", 0.2, 0.9)]:
        for seed in range(3):
            rows.append({
                "defenses": setting, "seed": seed, "cell": f"{setting}-{seed}",
                "central.loss": utility + 0.0002 * seed,
                "attack.unaware_success": leak + 0.002 * seed, "attack.success": leak,
            })  # fmt: skip
    rep = ReportConfig(rows="defenses", value="attack.unaware_success", adaptive="attack.success",
                       utility="central.loss")  # fmt: skip
    sweep = SimpleNamespace(name="crowded", report=rep, arms=[], grid={"defenses": []})
    return sweep, pd.DataFrame(rows)


def test_crowded_frontier_labels_do_not_overlap(tmp_path):
    """15 settings a few pixels apart (and a long setting name): every label the plot writes
    (the number beside each point, the key table's entries, titles, legend) has a box of its
    own inside the figure, measured with the renderer's window extents."""
    from matplotlib.text import Text

    from flowerbed.server.sweep_plots import frontier_plot

    sweep, frame = _crowded_study()
    fig = frontier_plot(sweep, frame, tmp_path / "frontier.png", close=False)
    renderer = fig.canvas.get_renderer()
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    texts = [t for t in texts if not any(t in ax.get_xticklabels() + ax.get_yticklabels()
                                          for ax in fig.axes)]  # fmt: skip
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in texts]
    overlapping = [(a, b) for i, (a, p) in enumerate(boxes) for b, q in boxes[i + 1 :]
                   if p.overlaps(q)]  # fmt: skip
    keys = [t for t in texts if t.get_text().strip().isdigit()]
    assert len(keys) == 17, [t.get_text() for t in texts]  # 15 + local-dp + undefended
    assert overlapping == [], f"{len(overlapping)} overlapping pairs: {overlapping[:5]}"
    page = fig.bbox
    cut = [a for a, p in boxes if p.x0 < page.x0 or p.x1 > page.x1 or p.y0 < page.y0 or p.y1 > page.y1]  # fmt: skip
    assert cut == [], f"cut off by the figure's edge: {cut}"
