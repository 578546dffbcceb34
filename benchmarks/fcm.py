"""F-CMs vs its baselines, federated through the inline engine; mean over seeds, as a markdown table.

    PYTHONPATH=$PWD python -m benchmarks.fcm --presets fcm-trig-evolving fcm-dot-partial \
        fcm-digits-evolving --seeds 0 1 2 --out docs/fcm_results.json

Every method runs the same preset (data, clients, rounds); only the overrides below differ.
Concept accuracy is split into concepts a client holds labels for vs lacks (mean over clients);
for centralised training every concept is held, so its overall concept accuracy is the reference.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from flowerbed.apps.inline import run_inline
from flowerbed.server.experiment import load_experiment

FEDAVG = ["strategy.params.aggregation=fedavg", "workload.params.train_lacked=true"]
METHODS: dict[str, list[str]] = {
    "F-CMs": [],
    "FedAvg fixed concept set": [*FEDAVG, "strategy.params.expansion=ignore"],
    "FedAvg full arch, masked loss": [
        *FEDAVG,
        "strategy.params.expansion=ignore",
        "workload.params.initial_concepts=all",
    ],
    "FedAvg restart-on-change": [*FEDAVG, "strategy.params.expansion=restart"],
    "Local only": [
        "workload.params.local_only=true",
        "workload.params.initial_concepts=all",
        "strategy.params.expansion=ignore",
    ],
    "Centralised, full labels": ["workload.params.scenario=central", "clients.num=1"],
}
COLUMNS = (
    "task_accuracy",
    "concept_acc_held",
    "concept_acc_lacked",
    "concept_accuracy",
    "intervention_auc",
)


def run_one(
    preset: str, method: str, seed: int, extra: list[str] | None = None
) -> dict[str, float]:
    """Final metrics of one run (client-side evaluation; local-only scores its own models)."""
    with tempfile.TemporaryDirectory() as tmp:
        overrides = ["engine=inline", f"seed={seed}", f"output.dir={tmp}", "output.plots=false"]
        cfg = load_experiment(preset, overrides + METHODS[method] + (extra or []))
        if method.startswith("Centralised"):
            cfg["workload"]["params"]["central_clients"] = load_experiment(preset)["clients"]["num"]
        metrics = run_inline(cfg)["metrics"]
    prefix = "train.local-" if method == "Local only" else "eval."
    return {c: metrics[prefix + c] for c in COLUMNS if prefix + c in metrics}


def table(results: dict[str, dict[str, list[dict[str, float]]]]) -> str:
    """Markdown table of means (± std over seeds)."""
    lines = []
    for preset, by_method in results.items():
        lines += [
            f"\n**{preset}** (mean ± std over seeds; n = runs per method: "
            f"{min(len(r) for r in by_method.values())})\n",
            "| method | task acc | concept acc (held) | concept acc (lacked) | concept acc (all) "
            "| intervention AUC |",
            "|---|---|---|---|---|---|",
        ]
        for method in sorted(by_method, key=list(METHODS).index):
            runs = by_method[method]
            cells = []
            for col in COLUMNS:
                vals = [r[col] for r in runs if col in r]
                cells.append(
                    f"{np.mean(vals):.3f} ± {np.std(vals):.3f}" if vals else "n/a (all held)"
                )
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["fcm-trig-evolving", "fcm-dot-partial"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--override", nargs="*", default=[], help="extra overrides (rounds=3)")
    parser.add_argument("--out", default=None, help="write raw results (JSON) here")
    parser.add_argument("--table", nargs="*", default=None, help="only render saved JSON files")
    args = parser.parse_args()
    if args.table is not None:
        saved: dict = {}
        for path in args.table:
            for preset, by_method in json.loads(Path(path).read_text()).items():
                for method, runs in by_method.items():
                    saved.setdefault(preset, {}).setdefault(method, []).extend(runs)
        print(table(saved))
        return
    logging.getLogger("flwr").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for preset in args.presets:
        for method in args.methods:
            for seed in args.seeds:
                started = time.perf_counter()
                row = run_one(preset, method, seed, args.override)
                results.setdefault(preset, {}).setdefault(method, []).append(row)
                print(f"{preset} | {method} | seed {seed} | {time.perf_counter() - started:.0f}s "
                      f"| {json.dumps({k: round(v, 4) for k, v in row.items()})}", flush=True)  # fmt: skip
                if args.out:
                    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
