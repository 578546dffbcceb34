"""F-CMs vs its baselines, federated through the inline engine; mean over seeds, as a markdown table.

    PYTHONPATH=$PWD python -m benchmarks.fcm --presets fcm-trig-evolving fcm-dot-partial \
        fcm-digits-evolving --seeds 0 1 2 --out docs/fcm_results.json
    PYTHONPATH=$PWD python -m benchmarks.fcm --methods F-CMs "Centralised, full labels" \
        --presets fcm-dag6-schedule "fcm-dag6-schedule:workload.params.scenario=evolving"

A preset may carry overrides after a colon (``PRESET:key=value,key=value``); they apply before the
method's own overrides (so the centralised baseline stays centralised).

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
from flowerbed.clients.core.config import replace_at
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
    # the paper's reference ("comparable to full concept supervision"), federated: the same
    # clients, rounds and local steps, every client labelling every concept from round 1
    "Federated, full concept labels": ["workload.params.scenario=full"],
    # the upper bound: one client with the pooled data and every label
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
    preset, _, variant = preset.partition(":")
    with tempfile.TemporaryDirectory() as tmp:
        overrides = ["engine=inline", f"seed={seed}", f"output.dir={tmp}", "output.plots=false"]
        overrides += [o for o in variant.split(",") if o]
        cfg = load_experiment(preset, overrides + METHODS[method] + (extra or []))
        if method.startswith("Centralised"):
            pooled = load_experiment(preset).clients.num
            cfg = replace_at(cfg, "workload.params", central_clients=pooled)
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
        fcm = by_method.get("F-CMs")
        for ref, label in (
            ("Federated, full concept labels", "the federated full-label arm"),
            ("Centralised, full labels", "centralised"),
        ):
            other = by_method.get(ref)
            if not (fcm and other):
                continue
            n = min(len(fcm), len(other))
            gaps = [100 * (other[i]["task_accuracy"] - fcm[i]["task_accuracy"]) for i in range(n)]
            per_seed = ", ".join(f"{g:+.1f}" for g in gaps)
            lines.append(
                f"\nTask-accuracy gap to {label} (points, {ref} - F-CMs, per seed in run "
                f"order): {per_seed}; mean {np.mean(gaps):+.2f}"
            )
    return "\n".join(lines)


#: hand-made mutants (file, original text, replacement) that the claim tests must kill
MUTANTS: dict[str, tuple[str, str, str]] = {
    "untrained task head (clients never train task.*)": (
        "clients/workloads/fcm.py",
        "        k for k in params\n",
        "        k for k in params if not k.startswith('task.')\n",
    ),
    "server skips concept aggregation (concept modules keep their previous value)": (
        "strategies/fcm.py",
        "        held = [(v, w) for v, w in held if w > 0]\n",
        "        held = [(v, w) for v, w in held if w > 0 and not key.startswith('concept.')]\n",
    ),
    "server takes one holder's concept module (no averaging)": (
        "strategies/fcm.py",
        "        held = [(v, w) for v, w in held if w > 0]\n",
        "        held = [(v, w) for v, w in held if w > 0][: 1 if key.startswith('concept.') else None]\n",
    ),
    "server skips task-head aggregation": (
        "strategies/fcm.py",
        "        held = [(v, w) for v, w in held if w > 0]\n",
        "        held = [(v, w) for v, w in held if w > 0 and not key.startswith('task.')]\n",
    ),
    "server skips aggregation (keeps the previous model)": (
        "strategies/fcm.py",
        "        params = aggregate_concept_arrays(\n",
        "        params = dict(self.current)\n        _ = aggregate_concept_arrays(\n",
    ),
    "growth disabled (announced concepts never added)": (
        "strategies/fcm.py",
        '        if new and self.expansion != "ignore":\n',
        '        if new and self.expansion == "restart":\n',
    ),
    "growth restarts the model (re-initialised on every new concept)": (
        "strategies/fcm.py",
        '        if self.expansion == "restart":\n',
        "        if True:\n",
    ),
    "late concepts never trained (held = round-1 concepts only)": (
        "clients/workloads/fcm.py",
        "        held = tuple(n for n in available if n in concepts_of(params))\n",
        "        held = tuple(n for n in available if n in self.scenario.initial_concepts())\n",
    ),
    "warm-up ignored by clients (grown task-head blocks trained at once)": (
        "clients/workloads/fcm.py",
        '        frozen = tuple(e["name"] for e in registry if e.get("task_from", 0) > rnd)\n',
        "        frozen = ()\n",
    ),
    "server optimiser skipped (plain averaging whatever server_momentum / server_lr)": (
        "strategies/fcm.py",
        "        if self.server_lr != 1.0 or self.server_momentum != 0.0:  # default: plain averaging\n",
        "        if False:\n",
    ),
    "catch-up ignored (growth_epochs has no effect)": (
        "clients/workloads/fcm.py",
        "        catch_up = p.growth_epochs and grew_recently(registry, rnd, p.growth_rounds)\n",
        "        catch_up = False\n",
    ),
    "lacked-concept distillation reads the true labels": (
        "clients/workloads/fcm.py",
        "                target = torch.sigmoid(teacher[:, keep])\n",
        "                target = c[b][:, keep]\n",
    ),
}
CLAIM_TESTS = [
    "tests/clients/test_fcm.py::test_fcm_matches_centralised_task_accuracy_on_a_generated_dag",
    "tests/clients/test_fcm.py::test_lacked_concepts_learnt_through_federation_not_locally",
    "tests/clients/test_fcm.py::test_late_concepts_cost_no_task_accuracy_on_generated_tasks",
    "tests/clients/test_fcm.py::test_warm_up_of_grown_concepts_raises_task_accuracy_on_generated_tasks",
    "tests/clients/test_fcm.py::test_server_momentum_raises_task_accuracy_on_the_worst_generated_tasks",
    "tests/strategies/test_fcm.py",
    "tests/clients/test_fcm_user_tasks.py::test_fcm_learns_lacked_and_late_concepts_on_a_user_task",
    "tests/clients/test_fcm_user_tasks.py::test_keep_lacked_distils_only_lacked_trained_modules_and_reads_no_lacked_label",
    "tests/clients/test_fcm_user_tasks.py::test_growth_epochs_run_more_local_epochs_only_in_the_rounds_after_a_growth",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["fcm-trig-evolving", "fcm-dot-partial"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--override", nargs="*", default=[], help="extra overrides (rounds=3)")
    parser.add_argument("--out", default=None, help="write raw results (JSON) here")
    parser.add_argument("--table", nargs="*", default=None, help="only render saved JSON files")
    parser.add_argument("--mutants", nargs="*", default=None, help="run mutants (none: all)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.presets, args.seeds, args.methods = args.presets[:1], [0], args.methods[:1]
        args.override = [*args.override, "rounds=1"]
    if args.mutants is not None:
        from benchmarks.routing import run_mutants

        run_mutants(MUTANTS, args.mutants or list(MUTANTS), CLAIM_TESTS)
        return
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
