"""Sensory Gating numbers for docs/workloads.md: ``python -m benchmarks.sensory_gating``.

Teacher accuracy with vs without F-JEPA per label ratio (3 seeds), then the full pipeline at the low
label ratio: gate keep fraction, student-teacher agreement, alignment vs random masks of equal size,
mask keep per class and the keep of the blur-only sufficiency criterion (the ablation).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from flowerbed.clients.workloads.sensory_gating import (
    StageConfig,
    make_split,
    run_pipeline,
    sufficient_masks,
    teacher_stage,
)

CFG = StageConfig(teacher_steps=150, gate_steps=200, student_steps=400)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    parser.add_argument("--pipeline-ratio", type=float, default=0.1)
    parser.add_argument("--teacher-steps", type=int, default=CFG.teacher_steps)
    parser.add_argument("--no-pipeline", action="store_true", help="teacher table only")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.ratios, args.teacher_steps, args.no_pipeline = [0], [0.1], 3, True
    torch.set_num_threads(1)
    start = time.perf_counter()
    cfg = StageConfig(**{**CFG.__dict__, "teacher_steps": args.teacher_steps})
    no_jepa = StageConfig(**{**cfg.__dict__, "jepa_weight": 0.0})
    print("| label ratio | seed | F-JEPA teacher acc | no-JEPA acc | ratio |")
    print("|---|---|---|---|---|")
    for ratio in args.ratios:
        pairs = []
        for seed in args.seeds:
            a = teacher_stage(seed, ratio, cfg)[1]["teacher_acc"]
            b = teacher_stage(seed, ratio, no_jepa)[1]["teacher_acc"]
            pairs.append((a, b))
            print(f"| {ratio:.2f} | {seed} | {a:.3f} | {b:.3f} | {a / b:.3f} |", flush=True)
        a, b = np.mean(pairs, axis=0)
        print(f"| {ratio:.2f} | mean | {a:.3f} | {b:.3f} | {a / b:.3f} |", flush=True)
    if args.no_pipeline:
        print(f"\nwall {time.perf_counter() - start:.0f} s")
        return
    keys = ("teacher_acc", "mask_keep_frac", "keep_frac", "fidelity", "student_acc",
            "align_gate", "align_random", "align_masks")  # fmt: skip
    print(f"\npipeline at label ratio {args.pipeline_ratio}")
    print("| seed | " + " | ".join(keys) + " | preserved | mask keep N / S / V | blur-only keep |")
    print("|---" * (len(keys) + 4) + "|")
    for seed in args.seeds:
        p = run_pipeline(seed, args.pipeline_ratio, cfg)
        row = " | ".join(f"{p.metrics[k]:.3f}" for k in keys)
        y = make_split(seed, args.pipeline_ratio).train.y[: cfg.mask_windows]
        per_class = " / ".join(f"{float(p.masks[y == c].mean()):.2f}" for c in range(3))
        blur_only = float(sufficient_masks(p.teacher, p.windows, p.attributions, n_fills=0).mean())
        print(f"| {seed} | {row} | {p.preserved:.3f} | {per_class} | {blur_only:.3f} |", flush=True)
    print(f"\nwall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
