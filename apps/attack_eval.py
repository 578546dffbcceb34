"""Attack evaluation harness: attack x dataset x regime x batch size over sampled batches.

Each case simulates one honest client update with the workload's own protocol code (the global
model at initialisation, as TabLeak attacks epoch 0), gives the attack only public knowledge and
the update, then scores the reconstruction against the batch (which only the scorer holds).

    python -m flowerbed.apps.attack_eval --datasets adult german --regimes mixed gaussian \
        --batch-sizes 1 2 4 8 16 32 --batches 20 --out docs/goliath_table.md
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from flowerbed.attacks.baselines import CONFIGS, ORACLE, random_reconstruction
from flowerbed.attacks.goliath import Knowledge, invert, observed_target
from flowerbed.attacks.metrics import mask_f1, tableak_accuracy, timestep_mae
from flowerbed.clients.tabdiff.model import build_model, model_params, onehot_rows, sample_latents
from flowerbed.clients.tabdiff.training import local_update
from flowerbed.clients.workloads.tabdiff import TabDiff, encoded
from flowerbed.server.experiment import load_experiment

ATTACK_NAMES = ["goliath", "tableak", "inverting-gradients", "dlg", "idlg", "random", "oracle"]


@dataclass
class Case:
    know: Knowledge
    target: dict[str, torch.Tensor]
    batch: int
    truth_frame: pd.DataFrame  # scorer side only
    truth_latents: list[Any]  # scorer side only (and the oracle upper bound)


def experiment(
    dataset: str, regime: str, protocol: str, overrides: list[str] | None = None
) -> dict:
    return load_experiment(
        "tabdiff-adult-mixed",
        [f"dataset.name={dataset}", f"workload.params.regime={regime}",
         f"workload.params.protocol={protocol}", "engine=inline", *(overrides or [])],
    )  # fmt: skip


def make_case(cfg: dict, batch: int, seed: int, epochs_same_rows: int = 1) -> list[Case]:
    """One client batch and its update(s) (several rounds of fresh latents if asked)."""
    work = TabDiff(cfg)
    data = encoded(json.dumps(cfg["dataset"], sort_keys=True))
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(data.num), batch, replace=False)
    rows = onehot_rows(
        torch.from_numpy(data.num[idx]), torch.from_numpy(data.codes[idx]), work.spec.cat_sizes
    )
    frame = data.prep.decode(data.num[idx].astype(np.float64), data.codes[idx])
    params = model_params(build_model(work.spec, cfg["seed"]))
    protocol = replace(work.protocol, batch_size=max(work.protocol.batch_size, batch))
    cases = []
    for r in range(epochs_same_rows):
        gen = torch.Generator().manual_seed(seed * 7919 + r)
        steps = 1 if protocol.kind == "fedsgd" else protocol.local_epochs
        lats = [sample_latents(work.spec, params, batch, gen) for _ in range(steps)]
        new = local_update(work.model, params, [rows] * steps, lats, protocol)
        sent32 = {k: v.float() for k, v in params.items()}
        reply32 = {k: v.detach().float() for k, v in new.items()}
        know = Knowledge(work.model, sent32, protocol, data.prep)
        cases.append(Case(know, observed_target(know, sent32, reply32), batch, frame, lats))
    return cases


def score(case: Case, rec: Any, stds: dict[str, float]) -> dict[str, float]:
    prep = case.know.prep
    res = tableak_accuracy(
        case.truth_frame, rec.frame, list(prep.numeric), list(prep.categorical), stds
    )
    out = {"accuracy": res["accuracy"], "num_accuracy": res["num_accuracy"],
           "cat_accuracy": res["cat_accuracy"], "seconds": rec.seconds}  # fmt: skip
    if rec.t is not None:
        out["timestep_mae"] = timestep_mae(case.truth_latents[0].t.numpy(), rec.t, res["perm"])
    if rec.mask is not None and case.truth_latents[0].mask is not None:
        out["mask_f1"] = mask_f1(case.truth_latents[0].mask.numpy(), rec.mask, res["perm"])
    return out


def run_attack(name: str, case: Case, budget: dict[str, int], seed: int, marginals: Any) -> Any:
    if name == "random":
        return random_reconstruction(case.know, case.batch, marginals, seed)
    base = ORACLE if name == "oracle" else CONFIGS[name]
    cfg = replace(
        base, seed=seed, **{k: v for k, v in budget.items() if k != "restarts" or base.restarts > 1}
    )
    return invert(case.know, case.target, case.batch, cfg,
                  oracle=case.truth_latents if name == "oracle" else None)  # fmt: skip


def evaluate(datasets: list[str], regimes: list[str], batch_sizes: list[int], batches: int,
             attacks: list[str], budget: dict[str, int], protocol: str = "fedsgd",
             log: Any = print, overrides: list[str] | None = None) -> pd.DataFrame:  # fmt: skip
    torch.set_num_threads(1)
    rows = []
    for ds in datasets:
        for regime in regimes:
            cfg = experiment(ds, regime, protocol, overrides)
            data = encoded(json.dumps(cfg["dataset"], sort_keys=True))
            train = data.table.train
            stds = {c: float(train[c].std()) for c in data.prep.numeric}
            marginals = (data.num, data.codes)
            for b in batch_sizes:
                for i in range(batches):
                    case = make_case(cfg, b, seed=1000 * b + i)[0]
                    for name in attacks:
                        rec = run_attack(name, case, budget, i, marginals)
                        s = score(case, rec, stds)
                        rows.append(
                            {
                                "dataset": ds,
                                "protocol": protocol,
                                "hidden": cfg["workload"]["params"]["hidden"],
                                "regime": regime,
                                "B": b,
                                "batch": i,
                                "attack": name,
                                **s,
                            }
                        )
                        log(
                            f"{ds} {regime} B={b} #{i} {name}: acc={s['accuracy']:.3f} ({rec.seconds:.1f}s)"
                        )
    return pd.DataFrame(rows)


def table(df: pd.DataFrame) -> str:
    """Markdown: mean per-cell accuracy (%) by dataset/regime/attack x batch size, then Goliath's
    margin over the best baseline and Goliath's per-setting details."""
    piv = df.pivot_table(
        index=["dataset", "regime", "attack"], columns="B", values="accuracy", aggfunc="mean"
    )
    piv["mean"] = piv.mean(axis=1)
    lines = ["| dataset | regime | attack | " + " | ".join(f"B={c}" for c in piv.columns[:-1]) + " | mean |",
             "|---" * (len(piv.columns) + 3) + "|"]  # fmt: skip
    for (ds, rg, at), r in piv.iterrows():
        lines.append(
            f"| {ds} | {rg} | {at} | " + " | ".join(f"{100 * v:.1f}" for v in r.to_numpy()) + " |"
        )
    if "goliath" not in set(df["attack"]):
        return "\n".join(lines)
    lines += ["", "| dataset | regime | goliath (mean over B) | best baseline | margin |",
              "|---|---|---|---|---|"]  # fmt: skip
    for (ds, rg), grp in piv.groupby(level=[0, 1]):
        m = grp["mean"].droplevel([0, 1])
        base = m.drop([a for a in ("goliath", "oracle") if a in m.index])
        if base.empty:
            continue
        lines.append(f"| {ds} | {rg} | {100 * m['goliath']:.1f} | {100 * base.max():.1f} "
                     f"({base.idxmax()}) | {100 * (m['goliath'] - base.max()):+.1f} |")  # fmt: skip
    g = df[df["attack"] == "goliath"].copy()
    for col in ("timestep_mae", "mask_f1"):
        if col not in g:
            g[col] = float("nan")
    agg = g.groupby(["dataset", "regime", "B"]).agg(
        n=("accuracy", "size"), acc=("accuracy", "mean"), sd=("accuracy", "std"),
        num=("num_accuracy", "mean"), categ=("cat_accuracy", "mean"),
        exact=("accuracy", lambda a: (a > 0.999).mean()), tmae=("timestep_mae", "mean"),
        f1=("mask_f1", "mean"), sec=("seconds", "mean"), secmax=("seconds", "max"),
    )  # fmt: skip
    lines += ["", "| dataset | regime | B | batches | accuracy ± sd | numeric | categorical | "
              "batches exact | t MAE | mask F1 | s mean / max |", "|---" * 11 + "|"]  # fmt: skip
    fmt = lambda v, f: "–" if pd.isna(v) else format(v, f)  # noqa: E731
    for (ds, rg, b), r in agg.iterrows():
        lines.append(
            f"| {ds} | {rg} | {b} | {int(r.n)} | {100 * r.acc:.1f} ± {fmt(100 * r.sd, '.1f')} | "
            f"{100 * r.num:.1f} | {100 * r.categ:.1f} | {100 * r.exact:.0f} % | "
            f"{fmt(r.tmae, '.4f')} | {fmt(r.f1, '.2f')} | {r.sec:.1f} / {r.secmax:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["adult", "german"])
    ap.add_argument("--regimes", nargs="+", default=["mixed", "gaussian"])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--attacks", nargs="+", default=ATTACK_NAMES)
    ap.add_argument("--iterations", type=int, default=400)
    ap.add_argument("--restarts", type=int, default=4)
    ap.add_argument("--protocol", default="fedsgd")
    ap.add_argument("--out", default="")
    ap.add_argument("--csv", default="")
    ap.add_argument("--report", nargs="+", default=[], help="render saved CSVs instead of running")
    ap.add_argument(
        "overrides", nargs="*", help="dotlist overrides, e.g. workload.params.hidden=64"
    )
    args = ap.parse_args()
    if args.report:
        print(table(pd.concat([pd.read_csv(f) for f in args.report], ignore_index=True)))
        return
    start = time.perf_counter()
    df = evaluate(args.datasets, args.regimes, args.batch_sizes, args.batches, args.attacks,
                  {"iterations": args.iterations, "restarts": args.restarts}, args.protocol,
                  overrides=args.overrides)  # fmt: skip
    md = table(df)
    print(md)
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.csv:
        df.to_csv(args.csv, index=False)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(md + "\n")


if __name__ == "__main__":
    main()
