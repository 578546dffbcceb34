"""Engine overhead benchmark.

(a) flowerbed's per-round time over a bare Flower app doing the same training (same MLP, same
    client data, same FedAvg, same central evaluation, same in-process transport), as a ratio
    measured in one process. Goal <= 1.05.
(b) Peak total RSS of a 10,000-client Ray simulation with 1 % of clients sampled per round
    (every process the run starts, found by an inherited environment tag, sampled every
    0.25 s; the benchmark process itself excluded). Goal <= 3 GB.

    python benchmarks/engine_overhead.py            # both
    python benchmarks/engine_overhead.py --skip-memory
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from flowerbed.apps.inline import InlineGrid, run_inline
from flowerbed.clients.core.config import Experiment
from flowerbed.clients.workloads import build_workload
from flowerbed.server.experiment import load_experiment

ROUNDS = 5
CLIENTS = 10


def bare_flower_round_s(cfg: Experiment) -> float:
    """The same training written directly against Flower, no flowerbed layers."""
    workload = build_workload(cfg)
    data = {i: workload.load_partition(i, CLIENTS) for i in range(CLIENTS)}
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        config = {"partition-id": pid, "server-round": int(msg.content["config"]["server-round"])}
        arrays, metrics = workload.fit(msg.content["arrays"], data[pid], config, context.state)
        return Message(
            RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}), reply_to=msg
        )

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        metrics = workload.evaluate(msg.content["arrays"], data[pid], {})
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord(workload.server_evaluate(server_round, arrays))

    torch.manual_seed(0)
    strategy = FedAvg(min_available_nodes=CLIENTS)
    start = time.perf_counter()
    strategy.start(
        grid=InlineGrid(app, CLIENTS), initial_arrays=workload.init_arrays(), num_rounds=ROUNDS,
        train_config=ConfigRecord(), evaluate_fn=central,
    )  # fmt: skip
    return (time.perf_counter() - start) / ROUNDS


def flowerbed_round_s(cfg: Experiment) -> float:
    start = time.perf_counter()
    run_inline(cfg)  # frozen: every repeat runs the same experiment
    return (time.perf_counter() - start) / ROUNDS


def overhead(repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_experiment(
            "quickstart", [f"rounds={ROUNDS}", f"clients.num={CLIENTS}", "engine=inline",
                           f"output.dir={tmp}", "output.plots=false"],
        )  # fmt: skip
        flowerbed_round_s(cfg)  # warm caches (dataset, encoders) for both arms
        bare, ours = [], []
        for _ in range(repeats):  # interleaved, so drift in machine load hits both arms
            bare.append(bare_flower_round_s(cfg))
            ours.append(flowerbed_round_s(cfg))
    b, o = statistics.median(bare), statistics.median(ours)
    return {"bare_round_s": b, "flowerbed_round_s": o, "ratio": o / b}


def peak_memory(clients: int, fraction: float, rounds: int) -> dict:
    from flowerbed.server.engines.simulation import run_simulation

    tag = f"mem-{os.getpid()}-{time.time_ns()}"
    os.environ["FLOWERBED_BENCH_TAG"] = tag  # inherited by flwr, SuperLink, Ray and its workers
    peak = [0]
    done = threading.Event()

    def ours(proc: psutil.Process) -> bool:
        try:
            return proc.environ().get("FLOWERBED_BENCH_TAG") == tag
        except (psutil.Error, OSError):
            return False

    def sample() -> None:
        while not done.is_set():
            total = 0
            for proc in psutil.process_iter(["pid", "memory_info"]):
                if proc.info["memory_info"] is not None and ours(proc):
                    total += proc.info["memory_info"].rss
            peak[0] = max(peak[0], total)
            time.sleep(0.25)

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_experiment(
            "quickstart", [f"clients.num={clients}", f"clients.fraction={fraction}",
                           f"clients.fraction_evaluate={fraction}", f"rounds={rounds}",
                           f"output.dir={tmp}", "output.plots=false"],
        )  # fmt: skip
        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        start = time.perf_counter()
        summary = run_simulation(cfg, Path(tmp) / "sim")
        wall = time.perf_counter() - start
        done.set()
        thread.join()
    return {"clients": clients, "sampled_per_round": int(clients * fraction), "rounds": rounds,
            "peak_rss_gb": peak[0] / 1e9, "wall_s": wall, "accuracy": summary["metrics"]["central.accuracy"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.skip_memory = 1, True
    result = overhead(args.repeats)
    print(f"(a) per-round time: bare Flower {result['bare_round_s']:.3f} s, flowerbed "
          f"{result['flowerbed_round_s']:.3f} s -> ratio {result['ratio']:.3f} (goal <= 1.05)")  # fmt: skip
    if not args.skip_memory:
        mem = peak_memory(10_000, 0.01, 3)
        print(f"(b) 10,000-client simulation, {mem['sampled_per_round']} sampled/round, "
              f"{mem['rounds']} rounds: peak total RSS {mem['peak_rss_gb']:.2f} GB (goal <= 3 GB), "
              f"wall {mem['wall_s']:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
