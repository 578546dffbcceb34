"""2RDM on a deep linear network and on grokking: the numbers and plots of docs/workloads.md.

PYTHONPATH=. python benchmarks/two_rdm.py            # DLN table + docs/img/two_rdm_dln.png
PYTHONPATH=. python benchmarks/two_rdm.py --sgd      # + minibatch-SGD ablation (two_rdm_dln_sgd.png)
PYTHONPATH=. python benchmarks/two_rdm.py --no-noise # + Langevin temperature 0 (no noise at all)
PYTHONPATH=. python benchmarks/two_rdm.py --seeds 0 --before  # the earlier s = 4, 2, 1 setting
PYTHONPATH=. python benchmarks/two_rdm.py --seeds 0 --sweep   # temperature x detector threshold
PYTHONPATH=. python benchmarks/two_rdm.py --grokking # also the grokking run (~1 min)
PYTHONPATH=. python benchmarks/two_rdm.py --federated --seeds 3  # the two-rdm preset, seeds 0-2

The early warning is the online ``RiseDetector`` on log10 tr C alone; the teacher-mode strengths
(transitions) and the loss are used only to score its alarms.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from flowerbed.clients.workloads.two_rdm import (  # noqa: E402
    DLNConfig,
    GrokConfig,
    abs_corr,
    at_step,
    early_warnings,
    run_dln,
    run_grokking,
    score_warnings,
    transition_steps,
    warning_alarms,
)

IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def dln_table(config: DLNConfig) -> tuple[list[str], object, list[int], object]:
    """One row per transition (early warning, PR, top-eigenvector alignment) and one converged."""
    trace = run_dln(config)
    steps = transition_steps(trace)
    score = early_warnings(trace)
    rows = []
    for m, (s, ew) in enumerate(zip(steps, score.drops, strict=True)):
        pr = float(np.median(at_step(trace, trace.participation_ratio, s)))
        shc = float(np.median(at_step(trace, trace.heat_capacity, s)))
        corr = float(np.median([abs_corr(v, trace.signatures[:, m])
                                for v in at_step(trace, trace.top_vectors, s)]))  # fmt: skip
        early = "–"
        if ew.warning_step is not None:
            v = at_step(trace, trace.top_vectors, ew.warning_step, half_width=0)[0]
            early = f"{abs_corr(v, trace.signatures[:, m]):.3f}"
        rows.append(
            f"| {config.seed} | {m} | {s} | {ew.loss_moved_step} | "
            f"{ew.warning_step if ew.warning_step is not None else 'none'} | "
            f"{ew.margin if ew.margin is not None else 'none'} | {pr:.2f} | {corr:.3f} | {early} "
            f"| {shc:.2f} |"
        )
    late = trace.steps >= 0.75 * trace.steps[-1]
    converged = float(np.median(trace.participation_ratio[late]))
    if trace.steps[late][0] >= steps[-1] + 1000:  # only when the last mode has settled
        rows.append(
            f"| {config.seed} | converged | ≥ {int(trace.steps[late][0])} | | false alarms "
            f"{score.false_alarms} | | {converged:.2f} | | | |"
        )
    return rows, trace, steps, score


def loss_speed_baseline(trace) -> object:  # noqa: ANN001
    """The same detector on a scalar observable: log10 of the mean probe loss's speed (mean
    |increment| over the same sliding window as the 2RDM)."""
    w = len(trace.full_loss) - len(trace.loss)
    speed = [np.log10(np.abs(np.diff(trace.full_loss[e - w : e + 1])).mean() + 1e-300)
             for e in range(w, len(trace.full_loss))]  # fmt: skip
    return score_warnings(trace, warning_alarms(np.array(speed)))


def plot(steps, loss, log_trace, pr, marks, title, path, extra=None) -> None:  # noqa: ANN001
    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    axes[0].semilogy(steps, loss)
    axes[0].set_ylabel("probe loss")
    if extra is not None:
        ax = axes[0].twinx()
        for label, (x, y) in extra.items():
            ax.plot(x, y, "--", label=label)
        ax.set_ylabel("accuracy")
        ax.legend(loc="center right")
    axes[1].plot(steps, log_trace)
    axes[1].set_ylabel("log10 tr C")
    axes[2].plot(steps, pr)
    axes[2].set_ylabel("participation ratio")
    axes[2].set_xlabel("step")
    styles = {"transition": ("grey", ":"), "warning": ("tab:red", "--")}
    for ax in axes:
        for label, xs in marks.items():
            color, ls = styles.get(label, ("grey", ":"))
            for k, s in enumerate(xs):
                ax.axvline(s, color=color, lw=0.8, ls=ls, label=label if k == 0 else None)
    axes[1].legend(loc="lower right", fontsize=8)
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def federated(seed: int) -> tuple[int, int, list[str]]:
    """The ``two-rdm`` preset on the inline engine: server-side 2RDM with rounds as checkpoints.

    Returns (transitions reached, transitions warned, table rows); a transition is warned if the
    server's alarm came after the previous transition and before the global loss had moved 5 %.
    """
    import logging
    import tempfile

    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    logging.getLogger("flwr").setLevel(logging.WARNING)
    per_round: list[dict] = []
    with tempfile.TemporaryDirectory() as out:
        cfg = load_experiment("two-rdm", ["engine=inline", f"output.dir={out}", f"seed={seed}"])
        run_inline(cfg, on_round=lambda r, m: per_round.append(dict(m)))
    rows = []
    for r, m in enumerate(per_round):
        if r > 0 and (r % 4 == 0 or m.get("central.rounds_alarm") == 1.0):
            rows.append(
                f"| {seed} | {r} | {m['central.loss']:.3f} | "
                + " / ".join(f"{m[f'central.mode{i}_strength']:.2f}" for i in range(3))
                + f" | {m.get('central.rounds_log_trace', float('nan')):.2f} | "
                f"{'**alarm**' if m.get('central.rounds_alarm') == 1.0 else ''} | "
                f"{m.get('central.rounds_pr', float('nan')):.2f} | "
                f"{m.get('central.rounds_top_eig_corr', float('nan')):.2f} "
                f"(mode {int(m.get('central.rounds_top_eig_mode', -1))}) | "
                f"{m['train.dyn_pr']:.2f} | {m['train.gauss_pr']:.2f} |"
            )
    loss = np.array([m["central.loss"] for m in per_round])
    strengths = np.array([[m[f"central.mode{i}_strength"] for i in range(3)] for m in per_round])
    alarms = [r for r, m in enumerate(per_round) if m.get("central.rounds_alarm") == 1.0]
    reached = warned = 0
    previous = -1
    for col in strengths.T:
        if not (col > 0.5).any():
            break
        crossed = int(np.argmax(col > 0.5))
        start = previous + 1 + int(np.argmin(np.abs(np.gradient(loss))[previous + 1 : crossed]))
        drop = loss[start] - loss[crossed:].min()
        moved = start + int(np.argmax(loss[start:] <= loss[start] - 0.05 * drop))
        reached += 1
        warned += any(previous < a <= moved for a in alarms)
        print(f"seed {seed}: transition at round {crossed}, loss moved 5 % at round {moved}, "
              f"alarms {alarms}")  # fmt: skip
        previous = crossed
    return reached, warned, rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grokking", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--federated", action="store_true")
    parser.add_argument("--sgd", action="store_true", help="also the minibatch-SGD ablation")
    parser.add_argument("--no-noise", action="store_true", help="also Langevin at temperature 0")
    parser.add_argument("--before", action="store_true", help="also the earlier s = 4, 2, 1 runs")
    parser.add_argument("--sweep", action="store_true", help="temperature x threshold, seed 0")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:  # figures go to a temporary folder, not docs/img
        import tempfile

        globals()["IMG"] = Path(tempfile.mkdtemp())
    IMG.mkdir(parents=True, exist_ok=True)
    configs = [DLNConfig(seed=seed) for seed in range(args.seeds)]
    if args.quick:
        args.seeds = 1
        configs = [DLNConfig(seed=0, steps=2000)]
    if args.sgd:  # ablation: minibatch noise (batch 256) instead of Langevin noise
        configs += [DLNConfig(seed=seed, batch_size=256, steps=6500) for seed in range(args.seeds)]
    if args.no_noise:  # no Langevin noise at all: deterministic gradient descent
        configs += [DLNConfig(seed=seed, temperature=0.0) for seed in range(args.seeds)]
    if args.before:  # the earlier setting (s = 4, 2, 1, init 1e-5), and which change fixes what
        old = {"singular_values": [4.0, 2.0, 1.0], "init_scale": 1e-5, "steps": 4000}
        configs += [DLNConfig(**old, batch_size=256),  # the earlier setting
                    DLNConfig(**old, batch_size=256, label_noise=0.0),  # floor is not label noise
                    DLNConfig(**old)]  # Langevin, but modes too close in time  # fmt: skip
    if configs:
        print("| seed | mode | transition step | loss moved 5 % at | alarm at | warning margin "
              "(steps) | PR at transition | top-eigvec \\|corr\\| | same at warning | SHC |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|")
    for config in configs:
        other = config.batch_size or config.singular_values != DLNConfig().singular_values
        if (other or config.temperature != DLNConfig().temperature) and config.seed == 0:
            kind = (f"SGD batch {config.batch_size}, label noise {config.label_noise}"
                    if config.batch_size else f"Langevin T = {config.temperature:g}")  # fmt: skip
            print(f"| *s = {config.singular_values}, init {config.init_scale:g}, {kind}* "
                  "| | | | | | | | | |")  # fmt: skip
        rows, trace, steps, score = dln_table(config)
        print("\n".join(rows))
        default_t = config.temperature == DLNConfig().temperature
        if config.seed == 0 and config.singular_values == DLNConfig().singular_values and default_t:
            name = "two_rdm_dln_sgd.png" if config.batch_size else "two_rdm_dln.png"
            kind = f"minibatch SGD, batch {config.batch_size}" if config.batch_size else "Langevin"
            marks = {"transition": steps,
                     "warning": [w.warning_step for w in score.drops if w.warning_step is not None]}  # fmt: skip
            plot(trace.steps, trace.loss, trace.log_trace, trace.participation_ratio, marks,
                 f"deep linear network, teacher s = 8, 2, 0.5 ({kind})", IMG / name)  # fmt: skip
    print("\nSame detector, Langevin runs: 2RDM (log10 tr C) vs the mean-loss speed baseline")
    print("| seed | 2RDM margins (steps) | loss-speed margins | false alarms 2RDM / speed |")
    print("|---|---|---|---|")
    for seed in range(args.seeds):
        trace = run_dln(configs[0] if args.quick else DLNConfig(seed=seed))
        ours, base = early_warnings(trace), loss_speed_baseline(trace)
        cells = [" / ".join(str(w.margin) for w in sc.drops) for sc in (ours, base)]
        print(f"| {seed} | {cells[0]} | {cells[1]} | {ours.false_alarms} / {base.false_alarms} |")
    if args.sweep:  # the warning shrinks as the thermal floor in the plateaus rises
        print("\n| temperature | warned, false alarms; margins (steps) at a 1-decade threshold "
              "| 2 decades | 3 decades |\n|---|---|---|---|")  # fmt: skip
        for temperature in (0.0, 1e-14, 1e-12, 1e-10, 1e-8):
            trace = run_dln(DLNConfig(temperature=temperature))
            cells = []
            for d in (1, 2, 3):
                sc = early_warnings(trace, decades=d)
                margins = " / ".join(str(w.margin) if w.margin is not None else "none"
                                     for w in sc.drops)  # fmt: skip
                cells.append(f"{sc.warned}/3, {sc.false_alarms}; {margins}")
            print(f"| {temperature:g} | " + " | ".join(cells) + " |")
    if args.federated:
        print("\n| seed | round | loss | mode strengths | rounds log10 tr C | server alarm | "
              "rounds PR | rounds top-eigvec \\|corr\\| | client dyn PR | client Gaussian PR |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|")
        totals = []
        for seed in range(args.seeds):
            reached, warned, rows = federated(seed)
            print("\n".join(rows))
            totals.append(f"seed {seed}: warned {warned} of {reached} transitions reached")
        print("\n".join(totals))
    if args.grokking:
        cfg = GrokConfig()
        grok = run_grokking(cfg)
        ph = grok.phase
        half = int(ph.full_steps[np.argmax(grok.test_accuracy >= 0.5)])
        extra = {"train acc": (ph.full_steps, grok.train_accuracy),
                 "test acc": (ph.full_steps, grok.test_accuracy)}  # fmt: skip
        plot(ph.steps, ph.loss, ph.log_trace, ph.participation_ratio, {"test acc 0.5": [half]},
             f"grokking (a + b) mod {cfg.modulus}", IMG / "two_rdm_grokking.png", extra)  # fmt: skip
        i = int(np.searchsorted(ph.steps, half))
        print(f"grokking: train acc 1.0 at step {int(ph.full_steps[np.argmax(grok.train_accuracy >= 0.99)])}, "
              f"test acc 0.5 at step {half}, final test acc {grok.test_accuracy[-1]:.3f}; "
              f"PR median over run {np.median(ph.participation_ratio):.2f}, at test-acc 0.5 "
              f"{ph.participation_ratio[i]:.2f}; log10 tr C at start {ph.log_trace[0]:.2f}, "
              f"at test-acc 0.5 {ph.log_trace[i]:.2f}, end {ph.log_trace[-1]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
