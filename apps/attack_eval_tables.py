"""The Markdown tables of the attack evaluation harness (``apps/attack_eval.py``): mean success by
dataset/setting/attack x batch size; Goliath's margin over the best baseline and its details;
PSNR, labels and timing for model-loss attacks."""

from __future__ import annotations

import pandas as pd


def _index(df: pd.DataFrame) -> list[str]:
    extra = [c for c in ("rounds", "protocol") if c in df and df[c].nunique() > 1]
    return ["dataset", "regime", *extra, "attack"]


def table(df: pd.DataFrame) -> str:
    """Markdown: mean success (%) by dataset/setting/attack x batch size; for Goliath its margin
    over the best baseline and its details; for model-loss attacks PSNR / labels / timing."""
    df = df.copy()
    if "success" not in df:
        df["success"] = df["accuracy"]
    index = _index(df)
    piv = df.pivot_table(index=index, columns="B", values="success", aggfunc="mean")
    piv["mean"] = piv.mean(axis=1)
    head = " | ".join(index)
    lines = [f"| {head} | " + " | ".join(f"B={c}" for c in piv.columns[:-1]) + " | mean |",
             "|---" * (len(piv.columns) + len(index)) + "|"]  # fmt: skip
    for key, r in piv.iterrows():
        cells = " | ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        lines.append(f"| {cells} | " + " | ".join(f"{100 * v:.1f}" for v in r.to_numpy()) + " |")
    if "goliath" in set(df["attack"]):
        lines += _goliath_details(df, piv, index)
    elif "label_accuracy" in df:
        lines += _classifier_details(df, index)
    return "\n".join(lines)


def _goliath_details(df: pd.DataFrame, piv: pd.DataFrame, index: list[str]) -> list[str]:
    group = index[:-1]
    lines = ["", f"| {' | '.join(group)} | goliath (mean over B) | best baseline | margin |",
             "|---" * (len(group) + 3) + "|"]  # fmt: skip
    for key, grp in piv.groupby(level=list(range(len(group)))):
        m = grp["mean"].droplevel(list(range(len(group))))
        base = m.drop([a for a in ("goliath", "oracle") if a in m.index])
        if base.empty or "goliath" not in m.index:
            continue
        cells = " | ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        lines.append(f"| {cells} | {100 * m['goliath']:.1f} | {100 * base.max():.1f} "
                     f"({base.idxmax()}) | {100 * (m['goliath'] - base.max()):+.1f} |")  # fmt: skip
    g = df[df["attack"] == "goliath"].copy()
    for col in ("timestep_mae", "mask_f1"):
        if col not in g:
            g[col] = float("nan")
    agg = g.groupby([*group, "B"]).agg(
        n=("accuracy", "size"), acc=("accuracy", "mean"), sd=("accuracy", "std"),
        num=("num_accuracy", "mean"), categ=("cat_accuracy", "mean"),
        exact=("accuracy", lambda a: (a > 0.999).mean()), tmae=("timestep_mae", "mean"),
        f1=("mask_f1", "mean"), sec=("seconds", "mean"), secmax=("seconds", "max"),
    )  # fmt: skip
    lines += ["", f"| {' | '.join(group)} | B | batches | accuracy ± sd | numeric | categorical | "
              "batches exact | t MAE | mask F1 | s mean / max |",
              "|---" * (len(group) + 9) + "|"]  # fmt: skip
    fmt = lambda v, f: "–" if pd.isna(v) else format(v, f)  # noqa: E731
    for row_key, r in agg.iterrows():
        cells = " | ".join(str(k) for k in (row_key if isinstance(row_key, tuple) else (row_key,)))
        lines.append(
            f"| {cells} | {int(r.n)} | {100 * r.acc:.1f} ± {fmt(100 * r.sd, '.1f')} | "
            f"{100 * r.num:.1f} | {100 * r.categ:.1f} | {100 * r.exact:.0f} % | "
            f"{fmt(r.tmae, '.4f')} | {fmt(r.f1, '.2f')} | {r.sec:.1f} / {r.secmax:.1f} |"
        )
    return lines


def _classifier_details(df: pd.DataFrame, index: list[str]) -> list[str]:
    for col in ("psnr", "identified"):
        if col not in df:
            df[col] = float("nan")
    agg = df.groupby([*index, "B"]).agg(
        n=("success", "size"), succ=("success", "mean"), psnr=("psnr", "median"),
        ident=("identified", "mean"), lab=("label_accuracy", "mean"), sec=("seconds", "mean"),
    )  # fmt: skip
    lines = ["", f"| {' | '.join(index)} | B | batches | success | median PSNR (dB) | identified "
             "| label accuracy | s mean |", "|---" * (len(index) + 7) + "|"]  # fmt: skip
    fmt = lambda v, f: "–" if pd.isna(v) else format(v, f)  # noqa: E731
    for row_key, r in agg.iterrows():
        cells = " | ".join(str(k) for k in (row_key if isinstance(row_key, tuple) else (row_key,)))
        lines.append(f"| {cells} | {int(r.n)} | {100 * r.succ:.1f} | {fmt(r.psnr, '.1f')} | "
                     f"{fmt(100 * r.ident, '.1f')} | {100 * r.lab:.1f} | {r.sec:.1f} |")  # fmt: skip
    return lines
