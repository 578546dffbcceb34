"""Fourier contours vs U-Net: local (pooled hospitals) and federated (FedAvg over hospitals).

    python -m benchmarks.fourier_contours                 # local, seed 0, default LocalSetup
    python -m benchmarks.fourier_contours --steps 400     # longer training (same for both arms)
    python -m benchmarks.fourier_contours --federated     # + the `fourier-contours` preset, inline

Prints one markdown row per arm and the Fourier/U-Net ratios.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from clients.config import load_experiment
from clients.workloads.fourier_contours import LocalSetup, run_local
from server.engines.inline import run_inline

KEYS = ("dice_lv", "dice_myo", "dice", "boundary_px", "vol_err_pct", "n_output_params")


def row(name: str, m: dict[str, float]) -> str:
    return f"| {name} | " + " | ".join(f"{m[k]:.3f}" for k in KEYS) + " |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=LocalSetup.steps)
    ap.add_argument("--federated", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print("| arm | " + " | ".join(KEYS) + " |\n|---|" + "---|" * len(KEYS))
    t0 = time.perf_counter()
    local = run_local(args.seed, LocalSetup(steps=args.steps))
    print(row("local Fourier", local["fourier"]))
    print(row("local U-Net", local["unet"]))
    print(f"(local wall {time.perf_counter() - t0:.1f} s)")
    if args.federated:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            cfg = load_experiment(
                "fourier-contours",
                [
                    "engine=inline",
                    f"rounds={args.rounds}",
                    f"seed={args.seed}",
                    f"output.dir={tmp}",
                ],
            )
            m = run_inline(cfg)["metrics"]
        fed = {k: m[f"central.{k}"] for k in KEYS}
        fed_unet = {k: m[f"central.unet_{k}"] for k in KEYS}
        print(row("federated Fourier", fed))
        print(row("federated U-Net", fed_unet))
        print(f"(federated wall {time.perf_counter() - t0:.1f} s)")
    f, u = local["fourier"], local["unet"]
    print(
        f"\nlocal Fourier - U-Net Dice {f['dice'] - u['dice']:+.3f}; output params ratio "
        f"{f['n_output_params'] / u['n_output_params']:.4f}"
    )


if __name__ == "__main__":
    main()
