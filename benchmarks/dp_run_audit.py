"""The run-level DP audit (``dp.epsilon_audit``, docs/methods/dp-audit.md) per DP path at a few
noise levels: the run's accountant epsilon, the audit from every update the server received and
from the final model only, the audit of the same run with the noise removed from the run's own
code path, and what the canaries cost (CPU seconds and utility against ``canaries: 0``).

    PYTHONPATH=$PWD python -m benchmarks.dp_run_audit            # toy runs, seeds 0-2, 3 levels
    PYTHONPATH=$PWD python -m benchmarks.dp_run_audit --quick    # one level, seed 0 (a minute)
    PYTHONPATH=$PWD python -m benchmarks.dp_run_audit --cost     # CPU cost per DP path

Toy runs: ``quickstart`` (tabular-mlp on Adult) at 2-3 clients, 1000 rows, 2-3 rounds, inline
engine (the claim tests' sizes, tests/clients/test_canaries.py). ``--cost`` times every DP path
in its preset as users start it (quickstart: 10 clients, all of Adult, 3 rounds; digits-classifier
at 3 rounds; tabular diffusion as the privacy benchmark's tabdiff-fedsgd arm runs it, 5 rounds) with the default canaries and with ``canaries: 0``,
CPU seconds of this process (the inline engine runs every client here), interleaved, 3 repeats,
the ratio of the medians (target <= 1.20); ``--quick``: 2 clients, 300 rows, one round, once.
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
    """One inline ``quickstart`` run with ``faults`` patched in: summary metrics, CPU seconds."""
    with ExitStack() as stack:
        for module, name, stand_in in faults:
            stack.enter_context(mock.patch.object(importlib.import_module(module), name, stand_in))
        return timed("quickstart", overrides)


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


DP_SGD = "[{name: dp-sgd, params: {noise_multiplier: 1.0, audit_trials: 0, canaries: %d}}]"
TABDIFF_ARM = ["clients.num=8", "rounds=5", "dataset.max_rows=64", "workload.params.protocol=fedsgd",
               "workload.params.batch_size=8", "workload.params.lr=0.1", "workload.params.hidden=64",
               "workload.params.quality_rows=256", "workload.params.sample_steps=10"]  # fmt: skip
#: path -> (preset, overrides as users run it, defenses with the canary count left open)
COST: dict[str, tuple[str, list[str], str]] = {
    "dp-sgd / Opacus (tabular-mlp, quickstart)": ("quickstart", [], DP_SGD),
    "dp-sgd / Opacus (digits-classifier)": ("digits-classifier", ["rounds=3"], DP_SGD),
    # the privacy benchmark's tabdiff-fedsgd arm without its attack, 5 of its 20 rounds
    "dp-sgd / per-sample (tabdiff, privacy-benchmark arm)": ("tabdiff-adult-mixed", TABDIFF_ARM, DP_SGD),
    "local-dp, eps 1 (quickstart)": ("quickstart", [], "[{name: local-dp, params: {epsilon: 1.0, audit_trials: 0, canaries: %d}}]"),
    "central-dp, client clipping, sigma 1 (quickstart)": ("quickstart", [], "[{name: central-dp, params: {noise_multiplier: 1.0, clipping: client, audit_trials: 0, canaries: %d}}]"),
    "central-dp, server clipping, sigma 1 (quickstart)": ("quickstart", [], "[{name: central-dp, params: {noise_multiplier: 1.0, clipping: server, audit_trials: 0, canaries: %d}}]"),
}  # fmt: skip
#: --quick: every path at a toy size (seconds)
QUICK = {
    "quickstart": ["clients.num=2", "dataset.max_rows=300", "rounds=1"],
    "digits-classifier": ["clients.num=2", "rounds=1", "workload.params.round_examples=64"],
    "tabdiff-adult-mixed": ["clients.num=2", "dataset.max_rows=300", "rounds=1",
                            "workload.params.hidden=32", "workload.params.eval_rows=64"],
}  # fmt: skip


def timed(preset: str, overrides: list[str]) -> tuple[dict, float]:
    """One inline run of ``preset``: its summary metrics and the CPU seconds it took."""
    with tempfile.TemporaryDirectory() as out:
        cfg = load_experiment(preset, ["engine=inline", f"output.dir={out}", "output.plots=false", *overrides])  # fmt: skip
        start = time.process_time()
        metrics = run_inline(cfg)["metrics"]
        return metrics, time.process_time() - start


def cost(quick: bool, repeats: int, only: str = "") -> None:
    """Per DP path: CPU seconds with the default canaries (32: per client for dp-sgd, canary
    clients for local and central DP) and with ``canaries: 0``, interleaved, ``repeats`` times;
    the ratio of the medians (the issue's target: <= 1.20)."""
    print("\n| DP path (preset as users run it) | CPU s, `canaries: 0` (median) | CPU s, default canaries (median) | audit on / off | repeats | accuracy / loss, 0 -> default |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    timed("quickstart", [*QUICK["quickstart"], "defenses=" + DP_SGD % 0])  # warm-up, not counted
    for label, (preset, overrides, defenses) in COST.items():
        if only not in label:
            continue
        size = [*overrides, *QUICK[preset]] if quick else overrides
        seconds: dict[int, list[float]] = {0: [], 32: []}
        utility: dict[int, tuple[float, float]] = {}
        for _ in range(repeats):  # interleaved: off, on, off, on, ...
            for count in (0, 32):
                metrics, spent = timed(preset, [*size, "defenses=" + defenses % count])
                seconds[count].append(spent)
                assert ("dp.epsilon_audit" in metrics) == bool(count), (label, count)
                key = (
                    "central.accuracy"
                    if "central.accuracy" in metrics
                    else "central.efficacy_synthetic"
                )
                utility[count] = (
                    metrics.get(key, float("nan")),
                    metrics.get("central.loss", float("nan")),
                )
        off, on = float(np.median(seconds[0])), float(np.median(seconds[32]))
        print(f"| {label} | {off:.2f} | {on:.2f} | {on / off:.3f} | {repeats} | "
              f"{utility[0][0]:.4f} / {utility[0][1]:.4f} -> {utility[32][0]:.4f} / {utility[32][1]:.4f} |",
              flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one strength, seed 0, tiny cost run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cost", action="store_true", help="only the CPU cost per DP path")
    parser.add_argument("--repeats", type=int, default=3, help="cost: interleaved repeats")
    parser.add_argument("--path", default="", help="cost: only the DP paths whose label has this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    logging.disable(logging.INFO)
    if not args.cost:
        tightness(args.quick, 1 if args.quick else args.seeds)
    if args.cost or args.quick:
        cost(args.quick, 1 if args.quick else args.repeats, args.path)


if __name__ == "__main__":
    main()
