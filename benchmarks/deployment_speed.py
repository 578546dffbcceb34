"""Deployment speed: flowerbed's quickstart on its federation vs a bare Flower app on Flower's.

Both arms train the same MLP (Adult, [64, 32], SGD lr 0.05 momentum 0.9, batch 64, one local
epoch, FedAvg over every node, federated + central evaluation) on a loopback federation of N
SuperNodes (TLS + SuperNode auth), submitted the same way (``flwr run --stream``):

* ``flowerbed``: ``flowerbed deploy up``'s federation: every SuperNode is ``flowerbed
  supernode`` (Flower's, asking again after 0.1 s doubling to 1 s instead of every 3 s) running ``--isolation
  process`` beside a ``flowerbed superexec`` (warm zygote, one forked child per message), and
  flowerbed's ServerApp polls for replies every 0.2 s;
* ``bare``: the same federation with ``superexec="flower"`` and ``supernode="flower"``: every
  SuperNode is Flower's ``flower-supernode`` starting Flower's own ``flower-superexec`` (one
  ``flwr-clientapp`` interpreter per message), Flower's Grid polls every 3 s.

Both federations are up at once and runs alternate (flowerbed, bare, bare, flowerbed, ...), so
machine load hits both arms alike. Pairs repeat until the ratio's interval resolves the goal
(``--goal``, 0.3x): at least ``--pairs``, at most ``--max-pairs``. Each pair gives a ratio (its
flowerbed median round over its bare median round); the interval is the 95 % t-interval of the
mean log ratio over pairs (exponentiated), and the ratio reported is the median over pairs. Per-round time is what each ServerApp measures between two
central evaluations. Memory is the peak over the run of the summed PSS (proportional set size:
pages a forked child shares with its zygote count once, split between them) of every process of
that arm's federation and of the submitting ``flwr`` CLI, sampled every 0.5 s; the summed RSS is
printed beside it.

    python benchmarks/deployment_speed.py --nodes 2 --pairs 3 --rounds 3   # up to --max-pairs 8
    python benchmarks/deployment_speed.py --nodes 2 8 --pairs 2 --max-pairs 2 --rounds 3
    python benchmarks/deployment_speed.py --quick      # 2 SuperNodes, 1 pair, 1 round
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil

from flowerbed.clients.datasets import data_dir
from flowerbed.server import deploy
from flowerbed.server.engines.deployment import run_deployment
from flowerbed.server.experiment import load_experiment
from flowerbed.server.processes import bin_path, flower_env

BARE_APP = Path(__file__).resolve().parent / "bare_flower"


class PeakMemory:
    """Peak of the summed PSS (and of the summed RSS) of root processes and their descendants."""

    def __init__(self, roots: list[int]) -> None:
        self.roots = roots
        self.peak = 0
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            procs = set()
            for pid in self.roots:
                try:
                    root = psutil.Process(pid)
                    procs |= {root, *root.children(recursive=True)}
                except psutil.NoSuchProcess:
                    pass
            procs |= set(me.children(recursive=True))  # this arm's flwr CLI
            pss = rss = 0
            for proc in procs:
                try:
                    info = proc.memory_full_info()
                except psutil.Error:
                    continue
                pss += getattr(info, "pss", info.rss)
                rss += info.rss
            self.peak, self.peak_rss = max(self.peak, pss), max(self.peak_rss, rss)
            self._stop.wait(0.5)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def flowerbed_arm(state: dict, nodes: int, rounds: int, out: Path) -> list[float]:
    cfg = load_experiment(
        "quickstart",
        [f"clients.num={nodes}", f"rounds={rounds}", "engine=deployment",
         f"deployment.dir={state['dir']}", f"output.dir={out}", "output.plots=false"],
    )  # fmt: skip
    run_dir = out / f"flowerbed-{time.time_ns()}"
    run_deployment(cfg, run_dir)
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [h["round_s"] for h in history if h["scope"] == "time"]


def bare_arm(state: dict, rounds: int, out: Path) -> list[float]:
    env = flower_env(out)
    env["FLWR_HOME"] = state["dir"] + "/flwr"
    done = subprocess.run(
        [bin_path("flwr"), "run", str(BARE_APP), deploy.CONNECTION, "--stream", "--run-config",
         f"num-server-rounds={rounds} data-dir='{data_dir()}'"],
        env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    times = [float(m.group(1)) for m in re.finditer(r"BARE-ROUND \d+ ([0-9.]+)", done.stdout)]
    if len(times) != rounds:
        raise RuntimeError(f"bare run did not finish: {done.stdout[-2000:]}")
    return times


def ratio_interval(ratios: list[float], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` t-interval of the geometric mean of ``ratios`` (nan with fewer than 2)."""
    if len(ratios) < 2:
        return float("nan"), float("nan")
    from scipy import stats

    logs = [math.log(r) for r in ratios]
    mean, sem = statistics.mean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    half = stats.t.ppf(0.5 + level / 2, len(logs) - 1) * sem
    return math.exp(mean - half), math.exp(mean + half)


def resolved(ratios: list[float], goal: float) -> bool:
    """Whether the interval of ``ratios`` lies wholly on one side of ``goal``."""
    low, high = ratio_interval(ratios)
    return high < goal or low > goal


def measure(nodes: int, pairs: int, rounds: int, max_pairs: int = 0, goal: float = 0.3) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"fb-speed-{nodes}-"))
    feds = {"flowerbed": work / "fed-warm", "bare": work / "fed-flower"}
    states: dict[str, dict] = {}
    arms: dict[str, dict[str, list[float]]] = {
        a: {"round_s": [], "peak_mb": [], "peak_rss_mb": []} for a in feds
    }
    ratios: list[float] = []
    try:
        states["flowerbed"] = deploy.up(nodes, feds["flowerbed"], superexec="warm")
        states["bare"] = deploy.up(nodes, feds["bare"], superexec="flower", supernode="flower")
        pair = 0
        while pair < pairs or (pair < max_pairs and not resolved(ratios, goal)):
            pair_times: dict[str, list[float]] = {}
            for arm in ("flowerbed", "bare") if pair % 2 == 0 else ("bare", "flowerbed"):
                state = states[arm]
                roots = [p["pid"] for p in state["processes"].values()]
                with PeakMemory(roots) as mem:
                    if arm == "flowerbed":
                        times = flowerbed_arm(state, nodes, rounds, work)
                    else:
                        times = bare_arm(state, rounds, work)
                arms[arm]["round_s"] += times
                pair_times[arm] = times
                arms[arm]["peak_mb"].append(mem.peak / 2**20)
                arms[arm]["peak_rss_mb"].append(mem.peak_rss / 2**20)
                print(f"nodes={nodes} pair={pair} {arm}: rounds {[round(t, 2) for t in times]} s, "
                      f"peak PSS {mem.peak / 2**20:.0f} MB (RSS {mem.peak_rss / 2**20:.0f} MB), "
                      f"load {psutil.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
            ratios.append(
                statistics.median(pair_times["flowerbed"]) / statistics.median(pair_times["bare"])
            )
            low, high = ratio_interval(ratios)
            print(f"nodes={nodes} pair={pair}: ratio {ratios[-1]:.3f}; over {len(ratios)} pairs "
                  f"median {statistics.median(ratios):.3f}, 95% interval [{low:.3f}, {high:.3f}] "
                  f"(goal {goal})", flush=True)  # fmt: skip
            pair += 1
    finally:
        for directory in feds.values():
            deploy.down(directory)
    fb, bare = arms["flowerbed"], arms["bare"]
    return {
        "nodes": nodes,
        "flowerbed_round_s": statistics.median(fb["round_s"]),
        "bare_round_s": statistics.median(bare["round_s"]),
        "ratio": statistics.median(ratios),
        "interval": ratio_interval(ratios),
        "pairs": len(ratios),
        "resolved": resolved(ratios, goal),
        "flowerbed_peak_mb": max(fb["peak_mb"]),
        "bare_peak_mb": max(bare["peak_mb"]),
        "flowerbed_peak_rss_mb": max(fb["peak_rss_mb"]),
        "bare_peak_rss_mb": max(bare["peak_rss_mb"]),
        "load_avg": psutil.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8])
    parser.add_argument(
        "--pairs", type=int, default=3, help="interleaved (flowerbed, bare) pairs, at least"
    )
    parser.add_argument(
        "--max-pairs", type=int, default=8, help="at most, while the interval straddles --goal"
    )
    parser.add_argument("--goal", type=float, default=0.3, help="the ratio to resolve")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.pairs, args.max_pairs, args.rounds = [2], 1, 1, 1
    max_pairs = max(args.pairs, args.max_pairs)
    rows = [measure(n, args.pairs, args.rounds, max_pairs, args.goal) for n in args.nodes]
    print("| SuperNodes | flowerbed s/round | bare Flower s/round | ratio (median of pairs) | "
          "95% interval, pairs | peak PSS flowerbed | peak PSS bare | peak RSS flowerbed / bare | "
          "load avg |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        low, high = r["interval"]
        verdict = "resolved" if r["resolved"] else "not resolved"
        print(f"| {r['nodes']} | {r['flowerbed_round_s']:.2f} | {r['bare_round_s']:.2f} | "
              f"**{r['ratio']:.2f}** | [{low:.2f}, {high:.2f}], {r['pairs']} ({verdict}) | "
              f"{r['flowerbed_peak_mb']:.0f} MB | {r['bare_peak_mb']:.0f} MB | "
              f"{r['flowerbed_peak_rss_mb']:.0f} / {r['bare_peak_rss_mb']:.0f} MB | "
              f"{r['load_avg']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
