"""Fourier contours vs U-Net: local (pooled hospitals) and federated (FedAvg over hospitals).

    python -m benchmarks.fourier_contours                  # local, seed 0, default LocalSetup
    python -m benchmarks.fourier_contours --seeds 0 1 2    # per-seed rows
    python -m benchmarks.fourier_contours --ablations      # + contour-model ablations (seed(s) given)
    python -m benchmarks.fourier_contours --federated      # + the `fourier-contours` preset, inline

Prints one markdown row per arm and seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

from flowerbed.apps.inline import run_inline
from flowerbed.clients.workloads.fourier_contours import (
    LocalSetup,
    LossWeights,
    run_contours,
    run_unet,
)
from flowerbed.server.experiment import load_experiment

KEYS = ("dice_lv", "dice_myo", "dice", "boundary_px", "vol_err_pct", "n_output_params")
ABLATIONS = {
    "no moment reference (fixed prior)": {"reference": False},
    "no cross-slice attention": {"cross_slice": False},
    "no mask (soft-raster Dice) loss": {"weights": LossWeights(mask=0.0)},
    "no coefficient loss": {"weights": LossWeights(coef=0.0)},
    "no area (measurement) loss": {"weights": LossWeights(area=0.0)},
}


def row(name: str, m: dict[str, float]) -> str:
    return f"| {name} | " + " | ".join(f"{m[k]:.3f}" for k in KEYS) + " |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=LocalSetup.steps)
    ap.add_argument("--ablations", action="store_true")
    ap.add_argument("--federated", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = ap.parse_args()
    if args.quick:
        args.steps = 3
    setup = LocalSetup(steps=args.steps)
    print("| arm | " + " | ".join(KEYS) + " |\n|---|" + "---|" * len(KEYS))
    for seed in args.seeds:
        t0 = time.perf_counter()
        print(row(f"local Fourier, seed {seed}", run_contours(seed, setup)))
        print(row(f"local U-Net, seed {seed}", run_unet(seed, setup)))
        if args.ablations:
            for name, change in ABLATIONS.items():
                m = run_contours(seed, dataclasses.replace(setup, **change))
                print(row(f"Fourier, {name}, seed {seed}", m))
        print(f"(seed {seed} wall {time.perf_counter() - t0:.1f} s)")
    if args.federated:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            cfg = load_experiment(
                "fourier-contours",
                [
                    "engine=inline",
                    f"rounds={args.rounds}",
                    f"seed={args.seeds[0]}",
                    f"output.dir={tmp}",
                ],
            )
            m = run_inline(cfg)["metrics"]
        print(row("federated Fourier", {k: m[f"central.{k}"] for k in KEYS}))
        print(row("federated U-Net", {k: m[f"central.unet_{k}"] for k in KEYS}))
        print(f"(federated wall {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
