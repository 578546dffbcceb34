"""FlowLeak: edge/agent recall vs query budget for the three attackers and the ablation.

python benchmarks/flowleak.py [--mas 20] [--seed 0] [--plot docs/img/flowleak_recall.png]
python benchmarks/flowleak.py --seeds 5            # the headline ratio per seed (budget 20)
python benchmarks/flowleak.py --federated --seeds 5  # preset, shared bandit statistics vs none
"""

from __future__ import annotations

import argparse

import numpy as np

from flowerbed.clients.workloads.flowleak import compare

BUDGETS = (5, 10, 20, 30, 40, 60)


def per_seed(seeds: int, mas: int) -> None:
    """FlowLeak / random and no-fragments / random edge recall at budget 20, per seed."""
    print("| seed | random | FlowLeak | without fragments (bandit only) | FlowLeak / random | "
          "without fragments / random |\n|---|---|---|---|---|---|")  # fmt: skip
    for seed in range(seeds):
        r = compare(mas, 20, seed)
        rand, ours, bandit = (r[k]["edge_recall"] for k in ("random", "flowleak",
                                                            "flowleak-no-fragments"))  # fmt: skip
        print(f"| {seed} | {rand:.3f} | {ours:.3f} | {bandit:.3f} | {ours / rand:.2f}x | "
              f"{bandit / rand:.2f}x |")  # fmt: skip


def federated(seeds: int) -> None:
    """The ``flowleak`` preset with the bandit statistics shared (FedAvg) and not shared: per
    round, the clients' evaluation audits (fresh MAS) against random tasks on the same MAS."""
    import logging
    import tempfile

    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    logging.getLogger("flwr").setLevel(logging.WARNING)
    print("| seed | shared statistics: FlowLeak edge recall, rounds 1 / 2 / 3 | not shared | "
          "random tasks (same MAS) |\n|---|---|---|---|")  # fmt: skip
    means = {"true": [], "false": []}
    for seed in range(seeds):
        cells, rand = {}, ""
        for share in ("true", "false"):
            rounds: list[dict] = []
            with tempfile.TemporaryDirectory() as out:
                cfg = load_experiment("flowleak", ["engine=inline", f"output.dir={out}",
                                                   f"seed={seed}",
                                                   f"workload.params.share_statistics={share}"])  # fmt: skip
                run_inline(cfg, on_round=lambda r, m, rounds=rounds: rounds.append(dict(m)))
            recalls = [m["eval.edge_recall"] for m in rounds[1:]]
            means[share] += recalls[1:]  # rounds 2.. start from a shared prior
            cells[share] = " / ".join(f"{v:.3f}" for v in recalls)
            rand = " / ".join(f"{m['eval.random_edge_recall']:.3f}" for m in rounds[1:])
        print(f"| {seed} | {cells['true']} | {cells['false']} | {rand} |")
    print(f"rounds 2-3, mean over seeds: shared {np.mean(means['true']):.3f}, "
          f"not shared {np.mean(means['false']):.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mas", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=0, help="per-seed table (and --federated)")
    parser.add_argument("--federated", action="store_true")
    parser.add_argument("--plot", default=None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.mas = 2
    if args.federated:
        federated(args.seeds or 3)
        return
    if args.seeds:
        per_seed(args.seeds, args.mas)
        return
    budgets = (5, 20) if args.quick else BUDGETS  # the table reads budget 20
    rows = {b: compare(args.mas, b, args.seed) for b in budgets}
    arms = list(rows[BUDGETS[0]])
    print(
        "| budget | "
        + " | ".join(f"{a} edge / agent recall" for a in arms)
        + " | flowleak / random |"
    )
    print("|---" * (len(arms) + 2) + "|")
    for b, r in rows.items():
        cells = [f"{r[a]['edge_recall']:.3f} / {r[a]['agent_recall']:.3f}" for a in arms]
        print(
            f"| {b} | "
            + " | ".join(cells)
            + f" | {r['flowleak']['edge_recall'] / r['random']['edge_recall']:.2f}x |"
        )
    print("redundant queries at budget 20:", {a: rows[20][a]["redundant"] for a in arms})
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for arm in arms:
            ax.plot(BUDGETS, [rows[b][arm]["edge_recall"] for b in BUDGETS], marker="o", label=arm)
        ax.set_xlabel("queries")
        ax.set_ylabel("edge recall")
        ax.set_title(f"FlowLeak, {args.mas} generated MAS")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=90)


if __name__ == "__main__":
    main()
