"""Triangular inversion benchmark: error table (method x precision x corr) and CPU time ratios.

Run: ``PYTHONPATH=. python -m benchmarks.triangular_inversion [--batch 256] [--time-batch 2048]``
(``--federated`` for the federated table). Times are best-of-5 process CPU time.
Times are single-thread CPU and printed as ratios to ``torch.linalg.solve_triangular`` in the same
process; they say nothing about NPU/GPU kernels.
"""

from __future__ import annotations

import argparse
import time

import torch

from flowerbed.clients.workloads.triangular_inversion import (
    METHODS,
    growth_flagged,
    invert_unit_lower,
    make_A,
    neumann_growth,
    reference_inverse,
    relative_error,
)

PRECISIONS = ("fp64", "fp32", "bf16", "fp16")


def error_table(batch: int, chunk: int, gated: bool) -> list[str]:
    """Markdown rows: median relative Frobenius error vs fp64 for every method/precision/corr."""
    head = "| corr | precision | growth (median / max) | flagged | " + " | ".join(METHODS) + " |"
    lines = [head, "|---" * (4 + len(METHODS)) + "|"]
    for corr in (0.0, 0.5, 0.9):
        a = make_A(batch, chunk, 64, corr, gated=gated, seed=0)
        ref = reference_inverse(a)
        growth = neumann_growth(a)
        for precision in PRECISIONS:
            errs = [
                relative_error(invert_unit_lower(a, m, precision), ref).median() for m in METHODS
            ]
            flagged = growth_flagged(growth, precision).float().mean()
            cells = " | ".join(f"{float(e):.1e}" for e in errs)
            lines.append(
                f"| {corr} | {precision} | {float(growth.median()):.1e} / {float(growth.max()):.1e} "
                f"| {float(flagged):.2f} | {cells} |"
            )
    return lines


def _best_time(fn, repeats: int = 5) -> float:  # noqa: ANN001
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return best


def time_table(batch: int, chunk: int) -> list[str]:
    """Markdown rows: fp32 CPU time of each method relative to solve_triangular and inv."""
    a = make_A(batch, chunk, 64, 0.5, seed=0).to(torch.float32)
    eye = torch.eye(chunk).expand_as(a)
    unit = eye + a
    base = {
        "solve_triangular": _best_time(
            lambda: torch.linalg.solve_triangular(unit, eye, upper=False, unitriangular=True)
        ),
        "inv": _best_time(lambda: torch.linalg.inv(unit)),
    }
    lines = ["| method (fp32) | CPU time [ms] | / solve_triangular | / inv |", "|---|---|---|---|"]
    rows = {**base}
    for m in METHODS:
        rows[m] = _best_time(lambda m=m: invert_unit_lower(a, m, "fp32"))
    rows["blocked + 1 Newton-Schulz"] = _best_time(
        lambda: invert_unit_lower(a, "blocked", "fp32", 1)
    )
    for name, seconds in rows.items():
        lines.append(
            f"| {name} | {seconds * 1e3:.1f} | {seconds / base['solve_triangular']:.2f} "
            f"| {seconds / base['inv']:.2f} |"
        )
    return lines


def federated_table(rounds: int, out_dir: str) -> list[str]:
    """Markdown rows: the federated preset per (method, precision, gated): recall and kernel metrics."""
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    lines = [
        "| method | precision | gated | recall acc. | acc. exact kernel | acc. Neumann-bf16 kernel | loss | inv. error (median / max) "
        "| growth max | flagged | kernel / solve |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    runs = [(m, "bf16", False) for m in ("fwd", "blocked", "blocked-neumann8", "neumann")]
    runs += [("blocked", "fp32", False), ("neumann", "fp16", False), ("neumann", "bf16", True)]
    for method, precision, gated in runs:
        cfg = load_experiment(
            "triangular-inversion",
            [f"rounds={rounds}", "engine=inline", f"output.dir={out_dir}", "output.plots=false",
             f"workload.params.method={method}", f"workload.params.precision={precision}",
             f"workload.params.gated={gated}"],
        )  # fmt: skip
        m = run_inline(cfg)["metrics"]
        get = lambda key, m=m: m.get(f"eval.{key}", float("nan"))  # noqa: E731
        lines.append(
            f"| {method} | {precision} | {gated} | {get('recall_accuracy'):.3f} "
            f"| {get('recall_accuracy_exact_kernel'):.3f} "
            f"| {get('recall_accuracy_probe_kernel'):.3f} | {get('loss'):.3f} "
            f"| {get('inv_err_median'):.1e} / {get('inv_err_max'):.1e} | {get('growth_max'):.1e} "
            f"| {get('growth_flagged'):.2f} | {get('kernel_vs_solve'):.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--time-batch", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--federated", action="store_true", help="only the federated table")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default="/tmp/flowerbed-triangular")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.batch, args.time_batch = 8, 16
    torch.set_num_threads(args.threads)
    if args.federated:
        print(f"\n### federated preset, {args.rounds} rounds (metrics of the last round)\n")
        print("\n".join(federated_table(args.rounds, args.out)))
        return
    for chunk, gated in ((64, False), (16, False), (64, True)):
        print(f"\n### errors, C = {chunk}, batch {args.batch}, gated = {gated}\n")
        print("\n".join(error_table(args.batch, chunk, gated)))
    for chunk in (64, 16):
        print(f"\n### CPU time, {args.time_batch} x {chunk} x {chunk}, {args.threads} thread(s)\n")
        print("\n".join(time_table(args.time_batch, chunk)))


if __name__ == "__main__":
    main()
