"""Where a deployment round's seconds go: per-message phases from the SuperNodes' own logs.

Runs flowerbed's quickstart on a loopback federation (``flowerbed deploy up``, TLS + SuperNode
auth) with Flower's DEBUG log (every line carries a millisecond timestamp), once per arm
(``flower``: Flower's SuperExec, one ``flwr-clientapp`` interpreter per message, and Flower's
SuperNode; ``warm``: ``flowerbed superexec`` beside Flower's SuperNode; ``fast``: ``flowerbed
superexec`` and ``flowerbed supernode``, whose idle polls double from 0.1 s to 1 s and whose
reply poll is 0.05 s), then splits each message's life on each node into the phases below
(median over nodes, rounds and both message types; the first message of a run is left out).

    python benchmarks/deployment_profile.py --nodes 2 --rounds 3
    python benchmarks/deployment_profile.py --quick      # 2 SuperNodes, 2 rounds
    python benchmarks/deployment_profile.py --nodes 8 --rounds 2 --kinds warm fast

DEBUG logging adds a little to every phase (the SuperExec's task polls are logged too).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
from datetime import datetime
from pathlib import Path

import psutil

from flowerbed.server import deploy
from flowerbed.server.engines.deployment import run_deployment
from flowerbed.server.experiment import load_experiment

#: (phase, the log line that ends it): the line that starts a phase ends the one before
MARKS = [
    ("pull", re.compile(r"Receiving: (\w+) message")),
    ("objects", re.compile(r"Received successfully")),
    ("launch", re.compile(r"\[flwr-clientapp\] Start FAB installation")),
    ("fab", re.compile(r"\[flwr-clientapp\] Start `ClientApp` Loading")),
    ("clientapp", re.compile(r"Finished task")),
    ("handoff", re.compile(r"Sending: \w+ message")),
    ("push", re.compile(r"Sent successfully")),
]
PHASES = {
    "objects": "SuperNode pulls the message's objects from the SuperLink",
    "launch": "task poll + process start (fork, or exec + interpreter + flwr import) + task input",
    "fab": "FAB unpacked, verified, installed (Flower does it per message)",
    "clientapp": "ClientApp: imports, config, data, the work, reply pushed to the SuperNode",
    "handoff": "SuperNode notices the reply (Flower polls every 0.5 s, flowerbed 0.05 s)",
    "push": "SuperNode pushes the reply to the SuperLink",
    "wait": "until the SuperNode's next pull finds the next message (Flower sleeps 3 s when "
    "none, flowerbed 0.1 s doubling to 1 s)",
}
#: arm: (SuperExec, SuperNode) as ``deploy.up`` takes them
ARMS = {"flower": ("flower", "flower"), "warm": ("warm", "flower"), "fast": ("warm", "flowerbed")}
NAMES = {
    "flower": "Flower's SuperExec and SuperNode",
    "warm": "flowerbed superexec, Flower's SuperNode",
    "fast": "flowerbed superexec and supernode",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def _events(directory: Path, node: int) -> list[tuple[float, str, str]]:
    """(time, mark, message type) of one node's SuperNode and SuperExec logs, in time order."""
    events = []
    for name in (f"supernode{node}.log", f"superexec{node}.log"):
        path = directory / name
        if not path.is_file():
            continue
        for line in _ANSI.sub("", path.read_text(errors="replace")).splitlines():
            stamp = _STAMP.search(line)
            if stamp is None:
                continue
            when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for mark, pattern in MARKS:
                if found := pattern.search(line):
                    events.append((when, mark, found.group(1) if found.groups() else ""))
    return sorted(events)


def phases(directory: Path, nodes: int) -> dict[str, list[float]]:
    """Seconds per phase and message, over every node (first message of the run left out)."""
    out: dict[str, list[float]] = {p: [] for p in PHASES}
    for node in range(nodes):
        events = _events(directory, node)
        starts = [i for i, e in enumerate(events) if e[1] == "pull"]
        for k, i in enumerate(starts[1:], start=1):
            end = starts[k + 1] if k + 1 < len(starts) else len(events)
            seen = {mark: when for when, mark, _ in events[i:end]}
            if "push" not in seen:
                continue
            previous = events[i][0]
            for mark, _ in MARKS[1:]:
                if mark in seen:
                    out[mark].append(seen[mark] - previous)
                    previous = seen[mark]
            if k + 1 < len(starts):
                out["wait"].append(events[starts[k + 1]][0] - seen["push"])
    return out


def profile(kind: str, nodes: int, rounds: int, work: Path) -> tuple[dict[str, float], float]:
    os.environ["FLWR_LOG_LEVEL"] = "DEBUG"
    fed = work / f"fed-{kind}"
    superexec, supernode = ARMS[kind]
    state = deploy.up(nodes, fed, superexec=superexec, supernode=supernode)
    try:
        cfg = load_experiment(
            "quickstart",
            [f"clients.num={nodes}", f"rounds={rounds}", "engine=deployment",
             f"deployment.dir={state['dir']}", f"output.dir={work}", "output.plots=false"],
        )  # fmt: skip
        summary = run_deployment(cfg, work / f"run-{kind}")
    finally:
        deploy.down(fed)
    medians = {
        p: statistics.median(v) if v else float("nan") for p, v in phases(fed, nodes).items()
    }
    return medians, statistics.median(summary["round_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 SuperNodes, 2 rounds")
    parser.add_argument(
        "--kinds", nargs="+", choices=list(NAMES), default=list(NAMES), help="arms to profile"
    )
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.rounds = 2, 2
    work = Path(tempfile.mkdtemp(prefix="fb-profile-"))
    rows = {kind: profile(kind, args.nodes, args.rounds, work) for kind in args.kinds}
    print(f"{args.nodes} SuperNodes, {args.rounds} rounds, load avg {psutil.getloadavg()[0]:.1f}")
    print("| phase (per message, median s) | " + " | ".join(NAMES[k] for k in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for phase, what in PHASES.items():
        print(f"| {phase}: {what} | " + " | ".join(f"{r[0][phase]:.2f}" for r in rows.values()) + " |")  # fmt: skip
    print("| **round (ServerApp, median)** | " + " | ".join(f"{r[1]:.2f}" for r in rows.values()) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
