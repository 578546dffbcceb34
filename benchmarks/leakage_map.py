"""Benchmark: a map of where leakage stops: classifiers and tabular diffusion (issue 50).

Per workload, the strongest attack's advantage over the prior, as a mean and a 95 % bootstrap
interval over seeds x attacked clients. The grid: rows per client a round x local epochs x local
optimizer (SGD with momentum 0.9, Adam) x attacked round (1 = untrained; ``--trained R`` = after
R rounds of in-process FedAvg of every client's own ``fit``, example-weighted). The strongest
attack is the larger of the attacks' advantages on each repeat (a worst case over the attacks
tried, each prior-keeping):

- ``tabular-mlp`` (quickstart, Adult): TabLeak (``support`` on: the category support read from
  the zero first-layer columns, exact under SGD and Adam);
- ``digits`` (digits MLP): Inverting Gradients unrolled and ``dimitrov-fedavg``;
- ``tabdiff`` (tabdiff-adult-mixed: the presets' 256 x 3 denoiser, mixed regime, lr 0.002 for
  SGD and Adam): Goliath (local-SGD closed form; FedAvg-Adam read as a sign-compressed gradient
  with the category support) and TabLeak (the same engine's TabLeak setting), 1 restart each. A
  client holds exactly ``rows`` rows: 8,192 Adult rows cut into 8192 / rows IID clients.

Batch size is min(rows, 32); FedAvg throughout (the server sees the model delta). It writes
``leakage_map.csv`` (one row per repeat), ``leakage_map.md`` (the table) and ``leakage_map.png``
(a heatmap per workload x optimizer x round: rows per client x local epochs, coloured by the
mean advantage, the interval written in each cell).

    python -m benchmarks.leakage_map --out DIR            # the shipped grid (below)
    python -m benchmarks.leakage_map --quick --out DIR    # 1 seed, 1 client, tiny (seconds)
    python -m benchmarks.leakage_map --workloads tabdiff --rows 8 32 --trained 0 --seeds 3 \
        --attacked 2 --iterations 10 --workers 3 --out DIR  # the tabdiff map in docs

``--workers N`` runs cells in N processes (cells are independent; CPU seconds per cell are
recorded in the csv as ``cpu_s`` and summed in the table's footer).

Shipped classifier grid: rows {8, 32} x epochs {1, 2} x {sgd, adam} x rounds {1, trained 5},
3 seeds x 8 clients (4 attacked), 50 attack steps (toy budgets for a 2-core machine). ``--rows``,
``--epochs``, ``--seeds``, ``--clients``, ``--attacked``, ``--iterations`` and ``--trained``
widen it.
"""

from __future__ import annotations

import argparse
import itertools
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from flwr.app import RecordDict

WORKLOADS = {
    "tabular-mlp": ("quickstart", ["dataset.max_rows=2000"], "lr_sgd=0.5", "lr_adam=0.01"),
    "digits": ("digits-classifier", [], "lr_sgd=0.1", "lr_adam=0.01"),
    # the tabdiff presets' denoiser (256 x 3), mixed regime, their lr for both optimizers; a
    # table of 8,192 Adult rows cut into 8192 / rows clients of exactly ``rows`` rows each
    "tabdiff": ("tabdiff-adult-mixed", ["dataset.max_rows=8192"], "lr_sgd=0.002", "lr_adam=0.002"),
}
TABDIFF_ROWS = 8192


def _lr(workload: str, optimizer: str) -> float:
    spec = dict(s.split("=") for s in WORKLOADS[workload][2:])
    return float(spec[f"lr_{optimizer}"])


def _config(workload: str, seed: int, rows: int, epochs: int, optimizer: str, clients: int):  # noqa: ANN202
    from flowerbed.server.experiment import load_experiment

    preset, extra = WORKLOADS[workload][:2]
    if workload == "tabdiff":  # a client holds `rows` rows (no per-round sampling knob)
        sized = [f"clients.num={TABDIFF_ROWS // rows}"]
    else:
        sized = [f"clients.num={clients}", f"workload.params.round_examples={rows}"]
    return load_experiment(preset, ["engine=inline", f"seed={seed}", *sized,
                                    *extra, "workload.params.protocol=fedavg",
                                    f"workload.params.batch_size={min(rows, 32)}",
                                    f"workload.params.local_epochs={epochs}",
                                    f"workload.params.optimizer={optimizer}",
                                    f"workload.params.lr={_lr(workload, optimizer)}"])  # fmt: skip


def _attacks(workload: str, replay, seed: int, iterations: int) -> dict:  # noqa: ANN001
    from flowerbed.attacks.baseline_common import IG, TABLEAK
    from flowerbed.attacks.dimitrov_fedavg import SETTINGS, DimitrovEngine
    from flowerbed.attacks.inversion.attack import ModelLossAttack
    from flowerbed.attacks.prior import keep_prior

    if workload == "tabdiff":
        from flowerbed.attacks.goliath import GOLIATH, TabularInversion

        budget = {"iterations": iterations, "restarts": 1, "seed": seed}
        return {
            "goliath": keep_prior(TabularInversion(replay, replace(GOLIATH, **budget)), seed),
            "tableak": keep_prior(TabularInversion(replay, replace(TABLEAK, **budget)), seed),
        }
    if workload == "tabular-mlp":
        tableak = replace(TABLEAK, iterations=iterations, restarts=1, seed=seed)
        return {"tableak": keep_prior(ModelLossAttack(replay, tableak, "tableak"), seed)}
    return {
        "inverting-gradients": keep_prior(
            ModelLossAttack(replay, replace(IG, iterations=iterations, seed=seed)), seed),
        "dimitrov-fedavg": keep_prior(
            DimitrovEngine(replay, replace(SETTINGS, iterations=iterations, seed=seed)), seed),
    }  # fmt: skip


def _global(work, rounds: int, clients: int, partitions: int):  # noqa: ANN001, ANN202
    """The global arrays after ``rounds`` rounds of FedAvg of the first ``clients`` clients' own
    ``fit`` (of ``partitions``)."""
    from flwr.app import ArrayRecord

    arrays = work.init_arrays()
    for rnd in range(1, rounds + 1):
        total, acc = 0, None
        for pid in range(clients):
            data = work.load_partition(pid, partitions)
            reply, m = work.fit(arrays, data, {"partition-id": pid, "server-round": rnd},
                                RecordDict())  # fmt: skip
            n = int(m["num-examples"])
            state = {k: v.double() * n for k, v in reply.to_torch_state_dict().items()}
            acc = state if acc is None else {k: acc[k] + state[k] for k in acc}
            total += n
        arrays = ArrayRecord({k: (v / total).float() for k, v in acc.items()})
    return arrays


def cell(workload: str, seed: int, rows: int, epochs: int, optimizer: str, rnd: int,
         clients: int, attacked: int, iterations: int) -> list[dict]:  # fmt: skip
    """One grid cell at one seed: a record per attacked client (every attack's advantage)."""
    from flowerbed.attacks.goliath import TruthScorer
    from flowerbed.attacks.inversion.scoring import ClassifierScorer
    from flowerbed.attacks.inversion.types import DiffusionReplay, ModelLossReplay
    from flowerbed.clients.contracts import TabularDiffusionOffer, offer
    from flowerbed.clients.workloads import build_workload
    from flowerbed.server.wrappers import truth_source

    began = time.process_time()
    cfg = _config(workload, seed, rows, epochs, optimizer, clients)
    work = build_workload(cfg)
    partitions = cfg.clients.num
    if workload == "tabdiff":
        scorer = TruthScorer(truth_source(cfg, work))
        replay = DiffusionReplay.of(offer(work, TabularDiffusionOffer))
    else:
        scorer = ClassifierScorer(truth_source(cfg, work))
        replay = ModelLossReplay(work.model_loss())
    arrays = _global(work, rnd - 1, clients, partitions)
    attacks = _attacks(workload, replay, seed, iterations)
    sent = {k: v.float() for k, v in arrays.to_torch_state_dict().items()}
    out = []
    for pid in range(attacked):
        data = work.load_partition(pid, partitions)
        reply, m = work.fit(arrays, data, {"partition-id": pid, "server-round": rnd}, RecordDict())
        got = {k: v.float() for k, v in reply.to_torch_state_dict().items()}
        n = int(m["num-examples"])
        record = {"workload": workload, "rows": rows, "epochs": epochs, "optimizer": optimizer,
                  "round": rnd, "seed": seed, "client": pid}  # fmt: skip
        for name, attack in attacks.items():
            scores = scorer.score(pid, rnd, sent, attack.invert(sent, got, n))
            record[f"{name}.advantage"] = scores["advantage"]
            record[f"{name}.prior"] = scores["prior"]
        record["strongest"] = max(record[f"{a}.advantage"] for a in attacks)
        out.append(record)
    for record in out:  # the cell's CPU seconds (this process), shared out over its replies
        record["cpu_s"] = (time.process_time() - began) / len(out)
    return out


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per grid cell: the strongest attack's mean advantage and 95 % bootstrap interval."""
    from flowerbed.server.sweep_stats import bootstrap

    keys = ["workload", "optimizer", "round", "rows", "epochs"]
    rows = []
    for key, group in frame.groupby(keys, sort=True):
        est = bootstrap(group["strongest"].to_numpy())
        each = {c.removesuffix(".advantage"): float(group[c].mean()) for c in group.columns
                if c.endswith(".advantage") and group[c].notna().any()}  # fmt: skip
        rows.append(dict(zip(keys, key, strict=True)) | {"advantage": est.mean, "lo": est.lo,
                                                          "hi": est.hi, "repeats": est.n,
                                                          "by_attack": each})  # fmt: skip
    return pd.DataFrame(rows)


def heatmap(summary: pd.DataFrame, path: Path) -> None:
    """One panel per workload x optimizer x round: rows per client (y) x local epochs (x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(summary.groupby(["workload", "optimizer", "round"], sort=True))
    cols = min(4, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, ((workload, optimizer, rnd), part) in zip(axes.flat, panels, strict=False):
        mine = summary[summary["workload"] == workload]  # one set of axes per workload
        rows, epochs = sorted(mine["rows"].unique()), sorted(mine["epochs"].unique())
        grid = np.full((len(rows), len(epochs)), np.nan)
        for _, r in part.iterrows():
            i, j = rows.index(r["rows"]), epochs.index(r["epochs"])
            grid[i, j] = r["advantage"]
            band = "" if np.isnan(r["lo"]) else f"\n[{r['lo']:.2f}, {r['hi']:.2f}]"
            ax.text(j, i, f"{r['advantage']:.2f}{band}", ha="center", va="center", fontsize=9,
                    color="white" if r["advantage"] < 0.5 else "black")  # fmt: skip
        for i, j in zip(*np.nonzero(np.isnan(grid)), strict=True):
            ax.text(j, i, "not run", ha="center", va="center", fontsize=8, color="grey")
        image = ax.imshow(grid, vmin=-0.2, vmax=1.0, cmap="viridis", origin="lower")
        ax.set_xticks(range(len(epochs)), [str(e) for e in epochs])
        ax.set_yticks(range(len(rows)), [str(r) for r in rows])
        ax.set_xlabel("local epochs")
        ax.set_ylabel("rows per client a round")
        ax.set_title(f"{workload}, {optimizer}, round {rnd}", fontsize=10)
    fig.colorbar(
        image, ax=axes.ravel().tolist(), label="strongest attack's advantage over the prior"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 1 client, 8 rows, 1 epoch")
    ap.add_argument("--out", type=Path, default=Path("leakage-map"))
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--rows", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--epochs", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--optimizers", nargs="+", default=["sgd", "adam"], choices=["sgd", "adam"])
    ap.add_argument(
        "--trained", type=int, default=5, help="rounds of FedAvg before the late attack"
    )
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--attacked", type=int, default=4, help="clients attacked per cell")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--workers", type=int, default=1, help="processes running cells at once")
    ap.add_argument(
        "--report",
        nargs="+",
        type=Path,
        metavar="CSV",
        help="re-render the table and heatmap from saved leakage_map.csv files",
    )
    args = ap.parse_args()
    if args.report:
        missing = [str(p) for p in args.report if not p.is_file()]
        if missing:
            ap.error(f"--report: no such file: {', '.join(missing)}")
        render(pd.concat([pd.read_csv(p) for p in args.report], ignore_index=True), args.out)
        return
    if args.quick:
        args.rows, args.epochs, args.optimizers = [8], [1], ["adam"]
        args.trained, args.seeds, args.clients, args.attacked, args.iterations = 1, 1, 4, 1, 3
    if args.workers < 1:
        ap.error(f"--workers must be >= 1 (got {args.workers})")
    if "tabdiff" in args.workloads and any(TABDIFF_ROWS % r for r in args.rows):
        ap.error(f"--rows must divide {TABDIFF_ROWS} for tabdiff (got {args.rows})")
    rounds = sorted({1, args.trained + 1})
    grid = list(itertools.product(args.workloads, args.rows, args.epochs, args.optimizers, rounds,
                                  range(args.seeds)))  # fmt: skip
    jobs = [(w, seed, rows, epochs, opt, rnd, args.clients, args.attacked, args.iterations)
            for w, rows, epochs, opt, rnd, seed in grid]  # fmt: skip
    records = []
    with ProcessPoolExecutor(args.workers) as pool:  # cells are independent processes' work
        for job, out in zip(jobs, pool.map(_cell, jobs), strict=True):
            records += out
            print(f"{job[0]} rows={job[2]} epochs={job[3]} {job[4]} round={job[5]} "
                  f"seed={job[1]}: strongest {out[-1]['strongest']:+.3f}", flush=True)  # fmt: skip
    render(pd.DataFrame(records), args.out, args.workers)


def render(frame: pd.DataFrame, out: Path, workers: int | None = None) -> None:
    """``leakage_map.csv``, ``leakage_map.md`` (the table, CPU footer) and ``leakage_map.png``."""
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "leakage_map.csv", index=False)
    summary = table(frame)
    lines = ["| workload | optimizer | round | rows | epochs | strongest advantage [95 %] | "
             "mean per attack | repeats |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for _, r in summary.iterrows():
        each = ", ".join(f"{a} {v:.2f}" for a, v in r["by_attack"].items())
        lines.append(f"| {r['workload']} | {r['optimizer']} | {r['round']} | {r['rows']} | "
                     f"{r['epochs']} | {r['advantage']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] | "
                     f"{each} | {r['repeats']} |")  # fmt: skip
    if "cpu_s" in frame:
        how = f"; {workers} worker(s)" if workers else ""
        lines.append(f"\nCPU: {float(frame['cpu_s'].sum()):.0f} s in the cells (sum over "
                     f"processes{how})")  # fmt: skip
    (out / "leakage_map.md").write_text("\n".join(lines) + "\n")
    heatmap(summary, out / "leakage_map.png")
    print("\n".join(lines))


def _cell(job: tuple) -> list[dict]:
    return cell(*job)


if __name__ == "__main__":
    main()
