"""The robustness benchmark's report: attacks (malicious clients) x defenses (aggregators).

A robustness sweep (``configs/sweeps/robustness-benchmark.yaml``) has one arm per
``<dataset>.<aggregator>`` and a grid over ``malicious.name`` x ``malicious.fraction`` x the data
split, optionally x ``defenses`` (client-side defenses: DP-SGD, local/central DP, top-k,
quantisation, secure aggregation); its report names ``rows: malicious.name`` and ``value:
central.accuracy``. A *defense* is the aggregator with the client-side setting
(``krum+dp-sgd(max_grad_norm=1.0,noise_multiplier=0.5)``; the aggregator alone without one). From
its cells:

- **worst-case accuracy** (ByzFL's reading): per (dataset, defense, attack) the lowest seed-mean
  accuracy over the malicious fractions and splits, with the 95 % bootstrap interval over seeds of
  that worst setting; per defense the worst over every attack. ``heatmap.png``: attack x defense,
  one panel per dataset, one colour scale;
- **clean accuracy**: fraction 0, one value per (seed, split): a clean run is the same run under
  every attack's name, counted once;
- **backdoor ASR**: ``central.backdoor_asr`` per (dataset, defense) x fraction, mean over seeds
  and splits with its interval;
- **detection**: ``detection.tpr`` / ``detection.fpr`` of the selecting defenses, mean over cells.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from flowerbed.server.sweep_layout import ReportedSweep
from flowerbed.server.sweep_stats import ARM_KEY, SEED_KEY, Estimate, bootstrap
from flowerbed.server.sweep_study import UNDEFENDED, family_of

ATTACK, FRACTION, SPLIT = "malicious.name", "malicious.fraction", "clients.partitioner"
ACCURACY, ASR = "central.accuracy", "central.backdoor_asr"
CLIENT_SIDE = "defenses"  # the grid key of the client-side defenses (its label; "none")


def is_robustness(sweep: ReportedSweep, ok: pd.DataFrame) -> bool:
    """A robustness sweep: attacks as rows, arms named ``<dataset>.<defense>``, accuracy measured."""
    rep = sweep.report
    return bool(
        rep.rows == ATTACK and ATTACK in ok and ARM_KEY in ok and ACCURACY in ok
        and ok[ARM_KEY].astype(str).str.contains(".", regex=False).all()
    )  # fmt: skip


def split_arms(ok: pd.DataFrame) -> pd.DataFrame:
    """``ok`` with ``dataset`` and ``strategy`` (the arm's two parts), ``client_side`` (the
    ``defenses`` label, ``none`` without one) and ``defense``: the strategy, joined by ``+`` to
    its client-side setting when there is one."""
    parts = ok[ARM_KEY].astype(str).str.split(".", n=1, expand=True)
    strategy = parts[1].astype(str)
    client = ok[CLIENT_SIDE].fillna(UNDEFENDED).astype(str) if CLIENT_SIDE in ok else None
    if client is None:
        client = pd.Series(UNDEFENDED, index=ok.index)
    defense = strategy.where(client == UNDEFENDED, strategy + "+" + client)
    return ok.assign(dataset=parts[0], strategy=strategy, client_side=client, defense=defense)


def short_defense(defense: str) -> str:
    """A heatmap label: ``krum+dp-sgd(...)`` -> ``krum+dp-sgd`` (one strength per family)."""
    return family_of(defense)


def worst_case(ok: pd.DataFrame) -> dict[tuple[str, str, str], Estimate]:
    """(dataset, defense, attack) -> the worst setting's accuracy over seeds (fraction > 0)."""
    frame = split_arms(ok)
    frame = frame[frame[FRACTION].astype(float) > 0] if FRACTION in frame else frame
    settings = [c for c in (FRACTION, SPLIT) if c in frame]
    out = {}
    for (dataset, defense, attack), part in frame.groupby(["dataset", "defense", ATTACK]):
        by_setting = part.groupby(settings)[ACCURACY] if settings else [((), part[ACCURACY])]
        estimates = [bootstrap(values.to_numpy()) for _, values in by_setting]
        out[(str(dataset), str(defense), str(attack))] = min(estimates, key=lambda e: e.mean)
    return out


def _by_arm(series: pd.Series) -> pd.DataFrame:
    """A (dataset, defense[, column]) series as a frame indexed by the arm (``dataset.defense``)."""
    frame = series.unstack() if series.index.nlevels > 2 else series.to_frame()
    frame.index = [f"{d}.{f}" for d, f in frame.index]
    frame.index.name = "arm"
    return frame


def robustness_md(ok: pd.DataFrame, table: Callable[[pd.DataFrame], str]) -> list[str]:
    """results.md sections (``table`` writes a frame as Markdown): worst-case accuracy, clean
    accuracy, backdoor ASR and detection rates."""
    worst = worst_case(ok)
    frame = split_arms(ok)
    lines = [
        "## Worst-case accuracy (attack x defense)",
        "",
        "Per dataset: `central.accuracy` of the worst (malicious fraction > 0, split) setting, "
        f"mean over seeds [95 % bootstrap interval] ({frame[SEED_KEY].nunique() if SEED_KEY in frame else 1} "
        "seeds); the last column is the worst over the attacks. Picture: `heatmap.png`.",
        "",
    ]  # fmt: skip
    for dataset in sorted({k[0] for k in worst}):
        defenses = sorted({k[1] for k in worst if k[0] == dataset})
        attacks = sorted({k[2] for k in worst if k[0] == dataset})
        rows = []
        for defense in defenses:
            cells = [worst.get((dataset, defense, a)) for a in attacks]
            worst_of = min((c for c in cells if c), key=lambda e: e.mean)
            rows.append([defense, *(c.text() if c else "–" for c in cells), worst_of.text()])
        frame_of = pd.DataFrame(rows, columns=["defense", *attacks, "worst"]).set_index("defense")
        lines += [f"### {dataset}", "", table(frame_of), ""]
    if FRACTION in frame:
        clean = frame[frame[FRACTION].astype(float) == 0]
        # a clean run is the same run under every attack's name: count it once per seed and split
        clean = clean.drop_duplicates(
            ["dataset", "defense", *(c for c in (SEED_KEY, SPLIT) if c in clean)]
        )
        if len(clean):
            est = clean.groupby(["dataset", "defense"])[ACCURACY].apply(lambda v: bootstrap(v.to_numpy()).text())  # fmt: skip
            lines += ["## Clean accuracy (no malicious client)", "", table(_by_arm(est).rename(columns={ACCURACY: "accuracy"})), ""]  # fmt: skip
    if ASR in frame and (frame[ATTACK] == "backdoor").any():
        backdoor = frame[frame[ATTACK] == "backdoor"]
        est = backdoor.groupby(["dataset", "defense", FRACTION])[ASR].apply(lambda v: bootstrap(v.to_numpy()).text())  # fmt: skip
        lines += ["## Backdoor attack success rate", "",
                  "`central.backdoor_asr` (triggered test rows of the other classes put in the target), "
                  "mean over seeds and splits [95 % interval]; fraction 0 is the clean model's rate.", "",
                  table(_by_arm(est)), ""]  # fmt: skip
    detection = [c for c in ("detection.tpr", "detection.fpr") if c in frame]
    if detection:
        rates = frame.groupby(["dataset", "defense"])[detection].mean().dropna(how="all").round(3)
        rates.index = [f"{d}.{f}" for d, f in rates.index]
        rates.index.name = "arm"
        if len(rates):
            lines += ["## Detection (selecting defenses)", "",
                      "share of malicious (tpr) / honest (fpr) replies the defense dropped, mean over cells.", "",
                      table(rates), ""]  # fmt: skip
    return lines


def heatmap(ok: pd.DataFrame, path: Path) -> None:
    """Worst-case accuracy, attack (rows) x defense (columns, client-side settings by family),
    one panel per dataset (stacked), one colour scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worst = worst_case(ok)
    datasets = sorted({k[0] for k in worst})
    attacks = sorted({k[2] for k in worst})
    widest = max(len({k[1] for k in worst if k[0] == d}) for d in datasets)
    size = (max(6.0, 0.55 * widest + 3.0), (0.45 * len(attacks) + 2.6) * len(datasets))
    fig, axes = plt.subplots(len(datasets), 1, figsize=size, squeeze=False)
    for ax, dataset in zip(axes[:, 0], datasets, strict=True):
        defenses = sorted({k[1] for k in worst if k[0] == dataset})
        grid = np.array([[worst[(dataset, d, a)].mean if (dataset, d, a) in worst else np.nan
                          for d in defenses] for a in attacks])  # fmt: skip
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(defenses)), [short_defense(d) for d in defenses], rotation=45,
                      ha="right", fontsize=8)  # fmt: skip
        ax.set_yticks(range(len(attacks)), attacks)
        for (i, j), value in np.ndenumerate(grid):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if value < 0.5 else "black")  # fmt: skip
        ax.set_title(f"{dataset}: worst-case accuracy")
    fig.colorbar(image, ax=axes[:, 0].tolist(), label="central.accuracy (worst setting)")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
