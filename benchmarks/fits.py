"""FiTS vs FS-only vs LIF on the generated ordered-frequency-pair task (centralised, 2 seeds).

Prints test accuracy, firing rates and the fraction of layer-1 f* near a task frequency per arm
(and FiTS / FS minus LIF as the ratio-to-baseline line), and writes the learned-f* histogram to
docs/img/fits_fstar_hist.png.

    PYTHONPATH=$PWD python -m benchmarks.fits            # ~6 x 1-2 min on one core
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from flowerbed.clients.workloads.fits import (
    ARMS,
    log_uniform_near_fraction,
    near_task_fraction,
    run_arm,
)

FREQS = (25.0, 50.0, 100.0, 200.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--n-train", type=int, default=1000)
    parser.add_argument("--png", default="docs/img/fits_fstar_hist.png")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.epochs, args.n_train = [0], 1, 40
        args.png = str(Path(tempfile.mkdtemp()) / "fstar.png")
    results = {arm: [] for arm in ARMS}
    for seed in args.seeds:
        for arm in ARMS:
            start = time.perf_counter()
            r = run_arm(arm, seed, n_train=args.n_train, epochs=args.epochs)
            r["seconds"] = time.perf_counter() - start
            results[arm].append(r)
            print(
                f"seed {seed} {arm:4s} acc {r['accuracy']:.3f} rate1 {r['rate1']:.3f} "
                f"rate2 {r['rate2']:.3f} epoch-1 rate {r['rates'][0]:.3f} ({r['seconds']:.0f} s)",
                flush=True,
            )
    print(
        f"\n| arm | accuracy (seeds {args.seeds}) | mean | rate after epoch 1 | f* near task (±10 %) |"
    )
    print("|---|---|---|---|---|")
    for arm in ARMS:
        accs = [r["accuracy"] for r in results[arm]]
        rate1 = [r["rates"][0] for r in results[arm]]
        near = "–"
        if arm != "lif":
            near = " / ".join(
                f"{near_task_fraction(r['f_learned'], FREQS):.2f}" for r in results[arm]
            )
        print(
            f"| {arm} | {' / '.join(f'{a:.3f}' for a in accs)} | {np.mean(accs):.3f} | "
            f"{' / '.join(f'{x:.3f}' for x in rate1)} | {near} |"
        )
    lif = np.mean([r["accuracy"] for r in results["lif"]])
    for arm in ("fs", "fits"):
        gain = np.mean([r["accuracy"] for r in results[arm]]) - lif
        print(f"{arm} - lif accuracy: {gain:+.3f}")
    print(
        f"f* near task at log-uniform init (expected): {log_uniform_near_fraction(FREQS, (15, 250), 0.1):.2f}"
    )
    delays = np.concatenate([r["group_delay_50hz"].numpy() for r in results["fits"]])
    print(
        f"FiTS layer-1 all-pass group delay at 50 Hz: median {np.median(delays):.2f} steps, "
        f"90th pct {np.percentile(delays, 90):.2f}"
    )
    plot(results, Path(args.png))


def plot(results: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = np.logspace(math.log10(15), math.log10(250), 25)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    for ax, arm in zip(axes, ("fs", "fits"), strict=True):
        f0 = np.concatenate([r["f_init"].numpy() for r in results[arm]])
        f1 = np.concatenate([r["f_learned"].numpy() for r in results[arm]])
        ax.hist(f0, bins=bins, alpha=0.5, label="init")
        ax.hist(f1, bins=bins, alpha=0.6, label="learned")
        for f in FREQS:
            ax.axvline(f, color="k", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xticks([15, 25, 50, 100, 200], ["15", "25", "50", "100", "200"])
        ax.minorticks_off()
        ax.set_title(f"{arm}: layer-1 target frequency f*")
        ax.set_xlabel("f* (Hz)")
    axes[0].set_ylabel("neurons")
    axes[0].legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
