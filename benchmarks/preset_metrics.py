"""Metrics of presets at small settings on the inline engine, as JSON: a behaviour check.

Run it in two checkouts (before and after a refactoring) and compare the files byte for byte;
the same file means the same metrics, bit for bit, every round (timings are left out)::

    python -m benchmarks.preset_metrics /tmp/after.json
    (cd ../before && python -m benchmarks.preset_metrics /tmp/before.json)
    cmp /tmp/before.json /tmp/after.json && echo identical

``--presets a,b`` picks some of the cases; ``--quick`` runs quickstart for one round (checks the
script runs, .ci/benchmarks).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from flowerbed.apps.inline import run_inline
from flowerbed.server.experiment import load_experiment

#: preset -> small overrides (seconds each on one core)
CASES = {
    "quickstart": ["rounds=2", "clients.num=4", "dataset.max_rows=2000"],
    "fcm-trig-evolving": ["rounds=3"],
    "routing-synthetic-mlp": ["rounds=2"],
    "routing-synthetic-kmeans": ["rounds=3"],
    "tabdiff-adult-gaussian": [
        "rounds=2", "clients.num=3", "dataset.max_rows=1500", "workload.params.quality_rows=300",
    ],
    "filosofer": [
        "rounds=2", "workload.params.train_size=300", "workload.params.local_epochs=1",
        "attack.name=model-stealing", "attack.params.steps=20",
        "defenses=[{name: filosofer, params: {distill_epochs: 5, fisher_chunks: 1}}]",
    ],
}  # fmt: skip
#: keys that hold wall-clock or paths, not results: a timing word as a whole dotted part, any
#: ``..._s`` field (``round_s``, ``elapsed_s``) and the ``time.`` scope; a substring match would
#: also drop real metrics (``unaware_success``, ``dp_steps``, ``group_size``)
TIMING = re.compile(r"(^|\.)(\w+_)?(seconds|run_dir|duration|elapsed)$|_s$|^time\.")


def without_timings(value: Any) -> Any:
    """``value`` without its timing keys (``TIMING``), recursively."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if not TIMING.search(k)}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def preset_metrics(name: str, overrides: list[str]) -> dict[str, Any]:
    """Every round's metrics (metrics.jsonl) and the summary of one inline run."""
    out_dir = tempfile.mkdtemp(prefix=f"fb-preset-{name}-")
    cfg = load_experiment(name, [*overrides, "engine=inline", f"output.dir={out_dir}"])
    run_dir = Path(run_inline(cfg)["run_dir"])
    rounds = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"metrics": without_timings(rounds), "summary": without_timings(summary)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="preset_metrics.json")
    parser.add_argument("--presets", default=",".join(CASES))
    parser.add_argument("--quick", action="store_true", help="quickstart, one round")
    args = parser.parse_args()
    cases = (
        {"quickstart": ["rounds=1", "clients.num=2", "dataset.max_rows=400"]}
        if args.quick
        else {name: CASES[name] for name in args.presets.split(",")}
    )
    result = {name: preset_metrics(name, overrides) for name, overrides in cases.items()}
    if args.quick and args.out == "preset_metrics.json":  # CI's check: leave no file in the tree
        args.out = str(Path(tempfile.mkdtemp(prefix="fb-preset-metrics-")) / args.out)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"{', '.join(result)}: metrics in {args.out}")


if __name__ == "__main__":
    main()
