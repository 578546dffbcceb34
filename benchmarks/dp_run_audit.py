"""The run-level DP audit (``dp.epsilon_audit``, docs/methods/dp-audit.md) per DP path at a few
noise levels: the run's accountant epsilon, the audit from every update the server received and
from the final model only, the audit of the same run with the noise removed from the run's own
code path, and what the canaries cost (CPU seconds and utility against ``canaries: 0``).

    PYTHONPATH=$PWD python -m benchmarks.dp_run_audit            # toy runs, seeds 0-2, 3 levels
    PYTHONPATH=$PWD python -m benchmarks.dp_run_audit --quick    # one level, seed 0 (a minute)
    PYTHONPATH=$PWD python -m benchmarks.dp_run_audit --cost     # CPU cost at quickstart's size

Toy runs: ``quickstart`` (tabular-mlp on Adult) at 2-3 clients, 1000 rows, 2-3 rounds, inline
engine (the claim tests' sizes, tests/clients/test_canaries.py). ``--cost`` times the preset as
users start it (10 clients, all of Adult, 3 rounds) with and without the canaries, CPU seconds of
this process (the inline engine runs every client here), interleaved, best of 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import tempfile
import time
from contextlib import ExitStack
from typing import Any
from unittest import mock

import numpy as np
import torch

from flowerbed.apps.inline import run_inline
from flowerbed.server.experiment import load_experiment

SMALL = ["clients.num=2", "dataset.max_rows=1000", "output.plots=false"]
#: path -> (overrides for a strength, strengths, [(module, function, no-noise stand-in)])
PATHS: dict[str, tuple[Any, tuple[float, ...], list[tuple[str, str, Any]]]] = {
    "dp-sgd / Opacus (tabular-mlp)": (
        lambda s, c: ["rounds=3", *SMALL,
                      f"defenses=[{{name: dp-sgd, params: {{noise_multiplier: {s}, audit_trials: 0, canaries: {c}}}}}]"],
        (1.0, 2.0, 4.0),
        [("opacus.optimizers.optimizer", "_generate_noise",
          lambda std, reference, generator=None, secure_mode=False: torch.zeros_like(reference))]),
    "local-dp (LocalDpMod)": (
        lambda e, c: ["rounds=3", *SMALL,
                      f"defenses=[{{name: local-dp, params: {{epsilon: {e}, audit_trials: 0, canaries: {c}}}}}]"],
        (0.1, 0.25, 0.5),
        [("flwr.clientapp.mod.localdp_mod", "add_gaussian_noise_inplace", lambda arrays, std: None)]),
    "central-dp, client clipping": (
        lambda s, c: ["rounds=2", *SMALL, "clients.num=3",
                      f"defenses=[{{name: central-dp, params: {{noise_multiplier: {s}, clipping: client, audit_trials: 0, canaries: {c}}}}}]"],
        (1.0, 2.0, 4.0),
        [("flwr.serverapp.strategy.dp_fixed_clipping", "add_gaussian_noise_inplace", lambda arrays, std: None)]),
    "central-dp, server clipping": (
        lambda s, c: ["rounds=2", *SMALL, "clients.num=3",
                      f"defenses=[{{name: central-dp, params: {{noise_multiplier: {s}, clipping: server, audit_trials: 0, canaries: {c}}}}}]"],
        (1.0, 2.0, 4.0),
        [("flwr.serverapp.strategy.dp_fixed_clipping", "add_gaussian_noise_inplace", lambda arrays, std: None)]),
}  # fmt: skip
DEFAULT_CANARIES = {"dp-sgd / Opacus (tabular-mlp)": 32}


def run(overrides: list[str], faults: list[tuple[str, str, Any]] = ()) -> tuple[dict, float]:  # type: ignore[assignment]
    """One inline run's summary metrics and the CPU seconds it took."""
    with tempfile.TemporaryDirectory() as out, ExitStack() as stack:
        for module, name, stand_in in faults:
            stack.enter_context(mock.patch.object(importlib.import_module(module), name, stand_in))
        cfg = load_experiment("quickstart", ["engine=inline", f"output.dir={out}", *overrides])
        start = time.process_time()
        metrics = run_inline(cfg)["metrics"]
        return metrics, time.process_time() - start


def tightness(quick: bool, seeds: int) -> None:
    print("| path | strength | accountant eps (run) | audit, every update: mean [min, max] | "
          "audit, final model | audit, noise removed | audit max | canaries - none: accuracy, loss |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for path, (make, strengths, noise_off) in PATHS.items():
        count = DEFAULT_CANARIES.get(path, 64)
        for strength in strengths[-1:] if quick else strengths:
            runs = [run([*make(strength, count), f"seed={s}"])[0] for s in range(seeds)]
            base = [run([*make(strength, 0), f"seed={s}"])[0] for s in range(seeds)]
            broken, _ = run(make(strength, count), noise_off)
            audits = np.array([m["dp.epsilon_audit"] for m in runs])
            finals = [m["dp.epsilon_audit_final"] for m in runs if "dp.epsilon_audit_final" in m]
            final = f"{np.mean(finals):.3f}" if finals else "- (not in the model)"
            pairs = list(zip(runs, base, strict=True))
            d_acc = np.mean([m["central.accuracy"] - b["central.accuracy"] for m, b in pairs])
            d_loss = np.mean([m["central.loss"] - b["central.loss"] for m, b in pairs])
            label = (
                f"eps {strength:g} / update" if path.startswith("local") else f"sigma {strength:g}"
            )
            print(f"| {path} | {label} | {runs[0]['dp.epsilon']:.3f} | {audits.mean():.3f} "
                  f"[{audits.min():.3f}, {audits.max():.3f}] | {final} | "
                  f"{broken['dp.epsilon_audit']:.3f} | {runs[0]['dp.epsilon_audit_max']:.3f} | "
                  f"{d_acc:+.4f}, {d_loss:+.4f} |")  # fmt: skip


COST = {
    "dp-sgd (Opacus), sigma 1": "[{name: dp-sgd, params: {noise_multiplier: 1.0, audit_trials: 0, canaries: %d}}]",
    "local-dp, eps 1": "[{name: local-dp, params: {epsilon: 1.0, audit_trials: 0, canaries: %d}}]",
    "central-dp, server clipping, sigma 1": "[{name: central-dp, params: {noise_multiplier: 1.0, audit_trials: 0, canaries: %d}}]",
}  # fmt: skip


def cost(quick: bool) -> None:
    size = ["clients.num=2", "dataset.max_rows=1000", "rounds=1"] if quick else []
    print("\n| defense | CPU s, canaries: 0 | CPU s, default canaries | overhead | accuracy / loss, 0 -> default |")  # fmt: skip
    print("|---|---|---|---|---|")
    for label, defenses in COST.items():
        count = 32  # the defaults (dp-sgd: per client; local and central DP: canary clients)
        best: dict[int, float] = {}
        acc: dict[int, tuple[float, float]] = {}
        for _ in range(1 if quick else 2):  # interleaved
            for c in (0, count):
                metrics, seconds = run([*size, "output.plots=false", "defenses=" + defenses % c])
                best[c] = min(best.get(c, np.inf), seconds)
                acc[c] = (metrics["central.accuracy"], metrics["central.loss"])
        print(f"| {label} | {best[0]:.1f} | {best[count]:.1f} | {best[count] / best[0] - 1:+.0%} | "
              f"{acc[0][0]:.4f} / {acc[0][1]:.4f} -> {acc[count][0]:.4f} / {acc[count][1]:.4f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one strength, seed 0, tiny cost run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cost", action="store_true", help="only the CPU cost at preset size")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    logging.disable(logging.INFO)
    if not args.cost:
        tightness(args.quick, 1 if args.quick else args.seeds)
    if args.cost or args.quick:
        cost(args.quick)


if __name__ == "__main__":
    main()
