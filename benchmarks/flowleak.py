"""FlowLeak: edge/agent recall vs query budget for the three attackers and the ablation.

python benchmarks/flowleak.py [--mas 20] [--seed 0] [--plot docs/img/flowleak_recall.png]
"""

from __future__ import annotations

import argparse

from flowerbed.clients.workloads.flowleak import compare

BUDGETS = (5, 10, 20, 30, 40, 60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mas", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    rows = {b: compare(args.mas, b, args.seed) for b in BUDGETS}
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
