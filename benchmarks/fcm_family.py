"""F-CMs vs every baseline of ``benchmarks.fcm`` over a family of generated concept tasks.

    PYTHONPATH=$PWD nice -n 10 python -m benchmarks.fcm_family --tasks 20 --seeds 0 1 2 \
        --jobs 2 --out fam.json                       # the full family (docs/fcm.md)
    PYTHONPATH=$PWD python -m benchmarks.fcm_family --quick   # seconds: 2 tiny tasks, 1 seed
    PYTHONPATH=$PWD python -m benchmarks.fcm_family --summary fam.json   # only the distribution
    PYTHONPATH=$PWD nice -n 10 python -m benchmarks.fcm_family --only 4 13 18 --seeds 0 1 2 \
        --methods "F-CMs, server momentum" "FedAvg full arch, server momentum"   # chosen tasks

Task ``i`` of the family is ``random_dag_task(100 + i)`` with 5-9 concepts, 8-12 inputs, 1-3
parents per concept (DAG depth) and a logic / count / vote task formula, run on 5-6 clients with
``random_schedule`` (2-3 concepts from round 1, the others arriving up to round 12-18 of 30, one
concept held by a single client). Nobody tuned anything on these tasks. Per (task, seed) the
summary takes gap = centralised - F-CMs task accuracy and F-CMs - best non-adaptive FedAvg
baseline (the best of the three on that task and seed), in points; and reports their median,
10th percentile and worst over the family, with the mean lacked-concept accuracy. With the pooled
arms (``POOLED``) it splits centralised - F-CMs into late arrival, label count and federation /
optimisation (``DECOMPOSITION``); ``--summary`` takes several JSON files (merged per task-seed).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.fcm import COLUMNS, METHODS
from flowerbed.apps.inline import run_inline
from flowerbed.clients.core.config import replace_at
from flowerbed.clients.workloads.fcm_data import (
    TASK_KINDS,
    USER_KINDS,
    random_dag_task,
    random_schedule,
    user_schedule,
    user_task,
)
from flowerbed.server.experiment import load_experiment

NON_ADAPTIVE = (
    "FedAvg fixed concept set",
    "FedAvg full arch, masked loss",
    "FedAvg restart-on-change",
)
BASE_PRESET = "fcm-dag6-schedule"
#: diagnostic arms (``--methods``): F-CMs with one factor of the gap to centralised removed
DIAGNOSTICS = (
    "F-CMs, no growth", "F-CMs, all labels", "Centralised, same steps", "F-CMs, warm-up",
    "Centralised, federated labels", "Centralised, arrivals", "Centralised, pooled all labels",
    "F-CMs, server momentum", "FedAvg full arch, server momentum", "Centralised, equal epochs",
    "F-CMs, keep lacked", "F-CMs, catch-up",
)  # fmt: skip
#: the pooled arms (``workload.params.pooled``): one client with every client's data, each example
#: keeping its own client's labels (federated labels), or every example labelling every concept at
#: the scheduled rounds (arrivals), or every label from round 1 (must equal the centralised arm)
POOLED = DIAGNOSTICS[4:7]
CENTRAL = "Centralised, full labels"
#: the decomposition of centralised - F-CMs: (label, minuend, subtrahend)
DECOMPOSITION = (
    ("late arrival", CENTRAL, "Centralised, arrivals"),
    ("label count", "Centralised, arrivals", "Centralised, federated labels"),
    ("federation / optimisation", "Centralised, federated labels", "F-CMs"),
)
#: the same gap, label count and federation taken in the other order (through "F-CMs, all labels"):
#: where the two orders disagree the factors interact
DECOMPOSITION_ALT = (
    ("late arrival", CENTRAL, "Centralised, arrivals"),
    ("federation / optimisation, every label", "Centralised, arrivals", "F-CMs, all labels"),
    ("label count, federated", "F-CMs, all labels", "F-CMs"),
)
#: rounds a grown concept's task-head block stays frozen in the "F-CMs, warm-up" arm
WARMUP = 3
#: weight of the lacked-concept self-distillation of the "F-CMs, keep lacked" arm
KEEP_LACKED = 1.0
#: local epochs of the "F-CMs, catch-up" arm in the 5 rounds from each grown concept's first round
CATCH_UP_EPOCHS = 3
#: server momentum (FedAvgM on the aggregated update) of the "..., server momentum" arms
SERVER_MOMENTUM = 0.5
#: local work per round (``--budget``): ``epochs``: every arm one epoch over its data per round
#: (the same per-example gradients per round; the pooled centralised arm makes ``clients`` times
#: the sequential optimizer steps of a federated client); ``steps``: federated arms run
#: ``clients`` local epochs per round, so a client makes about as many sequential steps per round
#: as the centralised arm (50 / 60 vs 47 / 57 at 300 examples per client), the centralised and
#: pooled arms keep one epoch ("Centralised, equal epochs" gives them ``clients`` epochs too)
BUDGETS = ("epochs", "steps")


def family_task(index: int, rounds: int = 30) -> dict[str, Any]:
    """Task ``index`` of the family: its spec, schedule and number of clients."""
    concepts = 5 + index % 5
    spec = random_dag_task(
        100 + index, concepts=concepts, inputs=8 + (3 * index) % 5, parents=1 + index % 3,
        task_kind=TASK_KINDS[index % len(TASK_KINDS)],
    )  # fmt: skip
    clients = 5 + index % 2
    last = max(2, round(rounds * (0.4 + 0.05 * (index % 5))))  # rounds 12 .. 18 of 30
    schedule = random_schedule(100 + index, tuple(spec["concepts"]), clients, last)
    return {"task": spec, "schedule": schedule, "clients": clients}


def user_family_task(index: int, rounds: int = 30) -> dict[str, Any]:
    """Task ``index`` of the family of issue 54 (what users write, ``user_task``): 7-10 concepts
    over 9-14 inputs shared between concepts, DAG depth 2-3, a threshold / count / XOR / vote task
    that needs many concepts jointly and the concept arriving last, 5-7 clients, two concepts
    held by a single client, arrivals up to round 15-20 of 30 (``user_schedule``)."""
    concepts = 7 + index % 4
    spec = user_task(
        200 + index, concepts=concepts, inputs=concepts + 2 + index % 5,
        kind=USER_KINDS[index % len(USER_KINDS)], depth=2 + index % 2,
    )  # fmt: skip
    clients = 5 + index % 3
    last = max(2, round(rounds * (0.5 + 0.0833 * (index % 3))))  # rounds 15 .. 20 of 30
    schedule = user_schedule(200 + index, tuple(spec["concepts"]), clients, last)
    return {"task": spec, "schedule": schedule, "clients": clients}


#: the task families (``--family``): issue 41's random DAGs and issue 54's user-written kind
FAMILIES = {"dag": family_task, "user": user_family_task}


def run_family_one(
    index: int, method: str, seed: int, rounds: int = 30, extra: list[str] | None = None,
    n_train: int = 300, n_test: int = 1000, budget: str = "epochs", schedule_rounds: int = 0,
    family: str = "dag",
) -> dict[str, float]:  # fmt: skip
    """Final metrics of one (task, method, seed) run through the inline engine (``budget``: the
    local work per round, ``BUDGETS``; ``schedule_rounds``: the run length the task's arrival
    schedule is drawn for, 0 = ``rounds``: a longer run of the same schedule shows convergence)."""
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget '{budget}' (allowed: {', '.join(BUDGETS)})")
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    item = FAMILIES[family](index, schedule_rounds or rounds)
    schedule, base, extra = item["schedule"], method, list(extra or [])
    if method == "F-CMs, no growth":  # the same holders, every concept from round 1
        schedule, base = {c: {**e, "round": 1} for c, e in schedule.items()}, "F-CMs"
    elif method == "F-CMs, all labels":  # every client labels every concept, same arrivals
        clients = list(range(item["clients"]))
        schedule, base = {c: {**e, "clients": clients} for c, e in schedule.items()}, "F-CMs"
    elif method == "F-CMs, warm-up":  # a grown concept's task-head block frozen WARMUP rounds
        base = "F-CMs"
        extra.append(f"strategy.params.warmup={WARMUP}")
    elif method == "F-CMs, keep lacked":  # lacked concepts distilled from the global model
        base = "F-CMs"
        extra.append(f"workload.params.keep_lacked={KEEP_LACKED}")
    elif method == "F-CMs, catch-up":  # more local epochs in the rounds after a growth
        base = "F-CMs"
        extra.append(f"workload.params.growth_epochs={CATCH_UP_EPOCHS}")
    elif method.endswith(", server momentum"):  # FedAvgM on the aggregated update
        base = {"F-CMs": "F-CMs", "FedAvg full arch": "FedAvg full arch, masked loss"}[
            method.removesuffix(", server momentum")
        ]
        extra.append(f"strategy.params.server_momentum={SERVER_MOMENTUM}")
    elif method in POOLED:  # one client with the pool; labels per example as its client had
        everyone = list(range(item["clients"]))
        if method != "Centralised, federated labels":
            schedule = {c: {**e, "clients": everyone} for c, e in schedule.items()}
        if method == "Centralised, pooled all labels":
            schedule = {c: {**e, "round": 1} for c, e in schedule.items()}
        base = "F-CMs"
        extra += ["workload.params.pooled=true", "clients.num=1"]
    elif method == "Centralised, same steps":  # pooled data, batches as many times larger
        base = "Centralised, full labels"
        extra.append(f"workload.params.batch_size={32 * item['clients']}")
    elif method == "Centralised, equal epochs":  # as many epochs per round as a client (steps)
        base = "Centralised, full labels"
        extra.append(f"workload.params.local_epochs={item['clients']}")
    federated = base != CENTRAL and method not in POOLED
    if budget == "steps" and federated:
        extra.append(f"workload.params.local_epochs={item['clients']}")
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            "engine=inline", f"seed={seed}", f"output.dir={tmp}", "output.plots=false",
            f"rounds={rounds}", f"clients.num={item['clients']}",
            f"workload.params.n_train={n_train}", f"workload.params.n_test={n_test}",
        ]  # fmt: skip
        cfg = load_experiment(BASE_PRESET, overrides + METHODS[base] + extra)
        cfg = replace_at(
            cfg, "workload.params",
            task=item["task"], schedule=schedule, central_clients=item["clients"],
        )  # fmt: skip
        metrics = run_inline(cfg)["metrics"]
    prefix = "train.local-" if base == "Local only" else "eval."
    row = {c: metrics[prefix + c] for c in COLUMNS if prefix + c in metrics}
    if method in (*POOLED, "F-CMs, all labels"):
        # every concept is labelled by the last round, so no final lacked-concept score exists;
        # the run's metrics keep the last one reported (an early round's): not a final number
        row.pop("concept_acc_lacked", None)
    return row


def _job(args: tuple) -> tuple[tuple, dict[str, float], float]:
    started = time.perf_counter()
    row = run_family_one(*args)
    return args, row, time.perf_counter() - started


def _dist(values: list[float], worst: str) -> dict[str, float]:
    """n, median, mean, the 10th percentile on the bad side and the worst value."""
    v = np.asarray(values, dtype=float)
    if not len(v):
        return {}
    bad_max = worst == "max"
    return {
        "n": len(v), "median": float(np.median(v)), "mean": float(v.mean()),
        "p10": float(np.percentile(v, 90 if bad_max else 10)),
        "worst": float(v.max() if bad_max else v.min()),
    }  # fmt: skip


def summary(results: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Distributions (points) of centralised - F-CMs and of F-CMs - best non-adaptive baseline,
    over (task, seed) runs and over tasks (each the mean over its seeds). "Best" is taken two
    ways: per run (the highest of the three FedAvg baselines on that task and seed, which favours
    the baselines: the max of three noisy numbers) and once for the family (the baseline with the
    highest median task accuracy over tasks)."""
    by_task: dict[str, dict[str, list[float]]] = {}
    gap, margin, lacked = [], [], []
    for key, by_method in sorted(results.items()):
        if "F-CMs" not in by_method:
            continue
        task = key.split("-seed")[0]
        for method, row in by_method.items():
            by_task.setdefault(task, {}).setdefault(method, []).append(row["task_accuracy"])
        fcm = by_method["F-CMs"]["task_accuracy"]
        lacked.append(by_method["F-CMs"].get("concept_acc_lacked", np.nan))
        if "Centralised, full labels" in by_method:
            gap.append(100 * (by_method["Centralised, full labels"]["task_accuracy"] - fcm))
        base = [by_method[m]["task_accuracy"] for m in NON_ADAPTIVE if m in by_method]
        if base:
            margin.append(100 * (fcm - max(base)))
    task_mean = {t: {m: float(np.mean(v)) for m, v in ms.items()} for t, ms in by_task.items()}
    median = {
        m: float(np.median([tm[m] for tm in task_mean.values() if m in tm]))
        for m in (*METHODS, *DIAGNOSTICS) if any(m in tm for tm in task_mean.values())
    }  # fmt: skip
    counts = {m: sum(m in tm for tm in task_mean.values()) for m in median}
    # the family's best baseline: among those run on every task (a median over fewer tasks is
    # not comparable)
    present = [m for m in NON_ADAPTIVE if m in median]
    complete = [m for m in present if counts[m] == len(task_mean)] or present
    best = max(complete, key=median.__getitem__) if complete else None
    out: dict[str, Any] = {
        "gap_to_centralised": _dist(gap, "max"),  # positive: F-CMs below; worst = largest
        "fcm_minus_best_non_adaptive_per_run": _dist(margin, "min"),  # negative: F-CMs below
        "concept_acc_lacked_mean": float(np.nanmean(lacked)) if lacked else float("nan"),
        "concept_acc_lacked_min": float(np.nanmin(lacked)) if lacked else float("nan"),
        "median_task_accuracy": median,
        "tasks_per_method": counts,
        "best_non_adaptive": best,
    }
    central = "Centralised, full labels"
    rows = [tm for tm in task_mean.values() if "F-CMs" in tm]
    out["task_gap_to_centralised"] = _dist(
        [100 * (tm[central] - tm["F-CMs"]) for tm in rows if central in tm], "max"
    )
    if best:
        out["task_fcm_minus_best_non_adaptive"] = _dist(
            [100 * (tm["F-CMs"] - tm[best]) for tm in rows if best in tm], "min"
        )
        out["task_fcm_minus_best_non_adaptive_per_task"] = _dist(
            [
                100 * (tm["F-CMs"] - max(tm[m] for m in present if m in tm))
                for tm in rows
                if any(m in tm for m in present)
            ],
            "min",
        )
    full = "Federated, full concept labels"
    out["task_gap_to_full_labels"] = _dist(
        [100 * (tm[full] - tm["F-CMs"]) for tm in rows if full in tm], "max"
    )
    for m in present:  # F-CMs against each non-adaptive baseline, per task
        out[f"task_fcm_minus:{m}"] = _dist(
            [100 * (tm["F-CMs"] - tm[m]) for tm in rows if m in tm], "min"
        )
    out["decomposition"] = decomposition(results)
    out["decomposition_alt"] = decomposition(results, DECOMPOSITION_ALT)
    return out


def decomposition(
    results: dict[str, dict[str, dict[str, float]]], path: tuple = DECOMPOSITION
) -> dict[str, Any]:
    """centralised - F-CMs split into its three factors (points): late arrival (centralised -
    centralised with the scheduled arrivals), label count (arrivals - the federated per-example
    labels, pooled), federation / optimisation (pooled with federated labels - F-CMs). The parts
    add up to the gap on every run that has all four arms. Distributions over those runs and over
    tasks (mean of seeds); ``pooled_check``: the largest |pooled all labels - centralised|.
    ``path``: the chain of arms from centralised to F-CMs (DECOMPOSITION or DECOMPOSITION_ALT)."""
    arms = {CENTRAL, "F-CMs", *(m for _, a, b in path for m in (a, b))}
    per_run: dict[str, list[float]] = {}
    per_task: dict[str, dict[str, list[float]]] = {}
    check = []
    for key, by_method in sorted(results.items()):
        acc = {m: 100 * r["task_accuracy"] for m, r in by_method.items()}
        if CENTRAL in acc and "Centralised, pooled all labels" in acc:
            check.append(abs(acc["Centralised, pooled all labels"] - acc[CENTRAL]))
        if not arms <= set(acc):
            continue
        parts = {label: acc[a] - acc[b] for label, a, b in path}
        parts["gap (sum)"] = acc[CENTRAL] - acc["F-CMs"]
        for label, value in parts.items():
            per_run.setdefault(label, []).append(value)
            per_task.setdefault(label, {}).setdefault(key.split("-seed")[0], []).append(value)
    return {
        "runs": {k: _dist(v, "max") for k, v in per_run.items()},
        "tasks": {k: _dist([float(np.mean(t)) for t in v.values()], "max")
                  for k, v in per_task.items()},
        "per_task": {
            t: {k: float(np.mean(v[t])) for k, v in per_task.items()}
            for t in sorted(per_task.get("gap (sum)", {}), key=lambda t: int(t[4:]))
        },
        "pooled_check_max_abs": max(check) if check else None,
        "pooled_check_runs": len(check),
    }  # fmt: skip


def render(s: dict[str, Any]) -> str:
    """The distributions as markdown."""
    lines = [
        "| quantity (points) | over | n | median | mean | 10th pct (bad side) | worst |",
        "|---|---|---|---|---|---|---|",
    ]
    best = s.get("best_non_adaptive")
    for key, label, over in (
        ("gap_to_centralised", "centralised - F-CMs", "runs (task, seed)"),
        ("task_gap_to_centralised", "centralised - F-CMs", "tasks (mean of seeds)"),
        ("task_gap_to_full_labels", "federated full labels - F-CMs", "tasks (mean of seeds)"),
        *((f"task_fcm_minus:{m}", f"F-CMs - {m}", "tasks") for m in NON_ADAPTIVE),
        ("fcm_minus_best_non_adaptive_per_run", "F-CMs - best FedAvg of that run", "runs"),
        ("task_fcm_minus_best_non_adaptive_per_task", "F-CMs - best FedAvg of that task", "tasks"),
        ("task_fcm_minus_best_non_adaptive", f"F-CMs - {best}", "tasks"),
    ):
        d = s.get(key)
        if d:
            lines.append(
                f"| {label} | {over} | {d['n']} | {d['median']:+.2f} | {d['mean']:+.2f} "
                f"| {d['p10']:+.2f} | {d['worst']:+.2f} |"
            )
    lines.append(
        f"\nlacked-concept accuracy of F-CMs (per run): mean {s['concept_acc_lacked_mean']:.3f}, "
        f"min {s['concept_acc_lacked_min']:.3f}\n\n| method | tasks | median task acc over tasks |"
        "\n|---|---|---|"
    )
    for method, value in s["median_task_accuracy"].items():
        lines.append(f"| {method} | {s['tasks_per_method'][method]} | {value:.3f} |")
    dec = s.get("decomposition", {})
    for part, dec_key in (("", "decomposition"), (" (other order)", "decomposition_alt")):
        d_all = s.get(dec_key, {})
        if not d_all.get("runs"):
            continue
        lines += [
            f"\n| centralised - F-CMs, by factor{part} (points) | over | n | median | mean "
            "| 90th pct | max |",
            "|---|---|---|---|---|---|---|",
        ]
        for over in ("runs", "tasks"):
            for label, d in d_all[over].items():
                lines.append(
                    f"| {label} | {over} | {d['n']} | {d['median']:+.2f} | {d['mean']:+.2f} "
                    f"| {d['p10']:+.2f} | {d['worst']:+.2f} |"
                )
    if dec.get("per_task"):
        labels = [label for label, _, _ in DECOMPOSITION]
        lines += [
            "\n| task (mean of its seeds, points) | gap | " + " | ".join(labels) + " |",
            "|---|---|" + "---|" * len(labels),
        ]
        for task, parts in dec["per_task"].items():
            cells = " | ".join(f"{parts[label]:+.2f}" for label in labels)
            lines.append(f"| {task} | {parts['gap (sum)']:+.2f} | {cells} |")
    if dec.get("pooled_check_runs"):
        lines.append(
            f"\npooled all labels vs centralised: max |difference| "
            f"{dec['pooled_check_max_abs']:.2f} points over {dec['pooled_check_runs']} runs"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--first", type=int, default=0, help="index of the first task")
    parser.add_argument("--only", nargs="+", type=int, default=None, help="these task indices")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--methods", nargs="+", default=list(METHODS), choices=[*METHODS, *DIAGNOSTICS]
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--n-train", type=int, default=300, help="examples per client")
    parser.add_argument("--n-test", type=int, default=1000)
    parser.add_argument("--override", nargs="*", default=[], help="extra overrides, all methods")
    parser.add_argument(
        "--schedule-rounds",
        type=int,
        default=0,
        help="draw the arrival schedules for this many rounds (0: --rounds)",
    )
    parser.add_argument("--budget", choices=BUDGETS, default="epochs",
                        help="local work per round: epochs (one each) | steps (clients x epochs "
                             "for federated arms)")  # fmt: skip
    parser.add_argument("--family", choices=list(FAMILIES), default="dag",
                        help="dag: issue 41's random DAG tasks | user: issue 54's user-written kind")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", default=None, help="write raw results (JSON) here")
    parser.add_argument("--summary", nargs="*", default=None, help="only summarise saved JSON")
    parser.add_argument("--quick", action="store_true", help="2 tiny tasks, 1 seed (seconds)")
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {}
    if args.summary is not None:
        for path in args.summary:
            for key, by_method in json.loads(Path(path).read_text()).items():
                results.setdefault(key, {}).update(by_method)
        print(render(summary(results)))
        return
    sizes = {"rounds": args.rounds, "n_train": args.n_train, "n_test": args.n_test}
    tasks, seeds = range(args.first, args.first + args.tasks), args.seeds
    if args.only:
        tasks = args.only
    if args.quick:
        sizes, tasks, seeds = {"rounds": 6, "n_train": 60, "n_test": 200}, range(2), [0]
        args.methods = list(dict.fromkeys([*args.methods, *POOLED]))
    # seed-major: a run cut short has whole seeds over all tasks
    jobs = [
        (i, m, s, sizes["rounds"], args.override, sizes["n_train"], sizes["n_test"], args.budget,
         args.schedule_rounds, args.family)
        for s in seeds for i in tasks for m in args.methods
    ]  # fmt: skip
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for (i, method, seed, *_), row, took in pool.map(_job, jobs):
            results.setdefault(f"task{i}-seed{seed}", {})[method] = row
            print(f"task {i} | seed {seed} | {method} | {took:.0f}s (under load) | "
                  f"{json.dumps({k: round(v, 4) for k, v in row.items()})}", flush=True)  # fmt: skip
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(render(summary(results)))


if __name__ == "__main__":
    main()
