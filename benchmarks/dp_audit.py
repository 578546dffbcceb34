"""The DP audit (``dp.epsilon_audit_step``) per DP code path: the audited lower bound with the noise in
place and with it removed inside the real code path (the accountant still reporting its epsilon),
beside the accountant's epsilon of the audited step and the most the audit's trials can show.

    PYTHONPATH=$PWD python -m benchmarks.dp_audit            # 500 trials per side, seeds 0-2
    PYTHONPATH=$PWD python -m benchmarks.dp_audit --quick    # 100 trials, seed 0 (seconds)

Tables in docs/methods/dp-sgd.md and docs/methods/flower-dp.md ("Auditing").
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any
from unittest import mock

import numpy as np
import torch

from flowerbed.clients.defenses import DefenseContext
from flowerbed.clients.defenses.central_dp import CentralDp
from flowerbed.clients.defenses.dp_sgd import OPACUS, PER_SAMPLE, DpSgd
from flowerbed.clients.defenses.local_dp import LocalDp

CFG = DefenseContext(seed=0, rounds=1, num_clients=3, sampled_clients=3, run_key="audit")
FLOWER_NOISE = "add_gaussian_noise_inplace"

# path -> (defense for a strength and trials, audit route, [(module, function, no-noise stand-in)])
PATHS: dict[str, tuple[Callable[[float, int], Any], str, list[tuple[str, str, Any]]]] = {
    "dp-sgd / privatize (tabdiff)": (
        lambda s, t: DpSgd({"noise_multiplier": s, "audit_trials": t}, CFG), PER_SAMPLE,
        [("flowerbed.clients.defenses.dp_sgd", "gaussian_noise",
          lambda shape, std, generator, dtype: torch.zeros(shape, dtype=dtype))]),
    "dp-sgd / Opacus (tabular-mlp, digits)": (
        lambda s, t: DpSgd({"noise_multiplier": s, "audit_trials": t}, CFG), OPACUS,
        [("opacus.optimizers.optimizer", "_generate_noise",
          lambda std, reference, generator=None, secure_mode=False: torch.zeros_like(reference))]),
    "local-dp (LocalDpMod)": (
        lambda e, t: LocalDp({"epsilon": e, "audit_trials": t}, CFG), "",
        [("flwr.clientapp.mod.localdp_mod", FLOWER_NOISE, lambda arrays, std: None)]),
    "central-dp, client clipping": (
        lambda s, t: CentralDp({"noise_multiplier": s, "clipping": "client", "audit_trials": t}, CFG), "",
        [("flwr.serverapp.strategy.dp_fixed_clipping", FLOWER_NOISE, lambda arrays, std: None)]),
    "central-dp, server clipping": (
        lambda s, t: CentralDp({"noise_multiplier": s, "clipping": "server", "audit_trials": t}, CFG), "",
        [("flwr.serverapp.strategy.dp_fixed_clipping", FLOWER_NOISE, lambda arrays, std: None)]),
}  # fmt: skip
#: strengths: noise multiplier sigma, or local DP's per-update epsilon
STRENGTHS = {"local-dp (LocalDpMod)": (0.5, 1.0, 2.0)}
SIGMAS = (1.0, 2.0, 4.0)


def audit(path: str, strength: float, trials: int, seed: int, noise: bool) -> tuple[dict, float]:
    make, route, mutants = PATHS[path]
    with ExitStack() as stack:
        if not noise:
            for module, name, stand_in in mutants:
                stack.enter_context(mock.patch.object(importlib.import_module(module), name, stand_in))  # fmt: skip
        start = time.perf_counter()
        out = make(strength, trials).audit(route, seed)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 trials, one seed")
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    trials, seeds = (100, 1) if args.quick else (args.trials, args.seeds)
    torch.set_num_threads(1)
    print(f"trials per side {trials}, seeds 0-{seeds - 1}, 95 % confidence, delta 1e-5\n")
    print("| path | strength | accountant eps (step) | audit, noise: mean [min, max] | "
          "audit, noise removed | audit max | s / audit |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for path in PATHS:
        for strength in STRENGTHS.get(path, SIGMAS):
            runs = [audit(path, strength, trials, seed, True) for seed in range(seeds)]
            bounds = np.array([r[0]["epsilon_audit_step"] for r in runs])
            mutant, _ = audit(path, strength, trials, 0, False)
            label = f"eps {strength:g}" if path.startswith("local") else f"sigma {strength:g}"
            seconds = float(np.mean([r[1] for r in runs]))
            print(f"| {path} | {label} | {runs[0][0]['epsilon_step']:.3f} | {bounds.mean():.3f} "
                  f"[{bounds.min():.3f}, {bounds.max():.3f}] | {mutant['epsilon_audit_step']:.3f} | "
                  f"{runs[0][0]['epsilon_audit_step_max']:.3f} | {seconds:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
