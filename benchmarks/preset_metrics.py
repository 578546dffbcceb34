"""Metrics of presets at small settings on the inline engine, as JSON: a behaviour check.

Run it in two checkouts (before and after a refactoring) and compare the files byte for byte;
the same file means the same metrics, bit for bit, every round (timings are left out), the same
final model (a SHA-256 per array, with its name), and the same attack scores. Besides presets, the
cases add to a preset a gradient-inversion attack, defenses (DP with its accountant and run audit,
secure aggregation, compression) and malicious clients against robust aggregators::

    python -m benchmarks.preset_metrics /tmp/after.json
    (cd ../before && python -m benchmarks.preset_metrics /tmp/before.json)
    cmp /tmp/before.json /tmp/after.json && echo identical

``--presets a,b`` picks some of the cases; ``--quick`` runs quickstart for one round (checks the
script runs, .ci/benchmarks).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flowerbed.apps.inline import run_inline
from flowerbed.server.experiment import load_experiment

#: quickstart at a tiny size (the base of the defense and malicious-client cases)
TINY = ["rounds=2", "clients.num=3", "dataset.max_rows=600"]
#: a Goliath preset at a tiny size: one round, two clients, one attacked
GOLIATH = [
    "rounds=1", "clients.num=2", "dataset.max_rows=600", "attack.params.target_clients=[0]",
    "workload.params.hidden=64",
]  # fmt: skip
#: case -> (preset, small overrides), seconds each on one core; ``preset+what`` names a preset with
#: an attack, defense or malicious client added
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
    # attack outputs: gradient inversion of a classifier and of tabular diffusion, with scores
    "inversion-digits": [
        "rounds=2", "clients.num=2", "attack.params.rounds=[1,2]", "attack.params.iterations=10",
    ],
    "quickstart+dlg": [
        *TINY, "workload.params.protocol=fedsgd", "workload.params.batch_size=4",
        "attack.name=dlg", "attack.params.iterations=10", "output.save_rounds=[1]",
    ],
    "goliath-adult-gaussian": [*GOLIATH, "attack.params.iterations=10"],
    # defenses: DP (accountant epsilon and the run audit), secure aggregation, compression
    "quickstart+dp-sgd": [
        *TINY, "defenses=[{name: dp-sgd, params: {noise_multiplier: 1.0, audit_trials: 50, canaries: 8}}]",
    ],
    "quickstart+central-dp": [
        *TINY, "defenses=[{name: central-dp, params: {noise_multiplier: 0.5, audit_trials: 50, canaries: 8}}]",
    ],
    "quickstart+local-dp": [
        *TINY, "defenses=[{name: local-dp, params: {epsilon: 2.0, audit_trials: 50, canaries: 8}}]",
    ],
    "goliath-adult-mixed+secagg": [
        *GOLIATH, "attack.name=goliath-adaptive", "attack.params.iterations=10",
        "defenses=[{name: secagg}]",
    ],
    "quickstart+topk": [*TINY, "defenses=[{name: topk, params: {fraction: 0.1}}]"],
    "quickstart+quantize": [*TINY, "defenses=[{name: quantize, params: {bits: 4}}]"],
    # malicious clients against robust aggregators
    "quickstart+sign-flip+krum": [
        *TINY, "clients.num=5", "malicious.name=sign-flip", "malicious.fraction=0.2",
        "malicious.params.scale=10", "strategy.name=krum", "strategy.params.num_malicious=1",
    ],
    "quickstart+alie+multikrum": [
        *TINY, "clients.num=7", "malicious.name=alie", "malicious.fraction=0.3",
        "strategy.name=multikrum", "strategy.params.num_malicious=2", "strategy.params.num_selected=3",
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
    if isinstance(value, list):  # (the run's own output folder is a temporary path)
        return [without_timings(v) for v in value if not str(v).startswith("output.dir=")]
    return value


def preset_metrics(name: str, overrides: list[str]) -> dict[str, Any]:
    """Every round's metrics (metrics.jsonl), the summary, digests of the final model (and of the
    models ``output.save_rounds`` keeps) and the attack's scores (attacks.jsonl) of one inline run;
    ``name`` is a preset, or ``preset+what`` for a preset with an attack, defense or malicious
    client added by ``overrides``."""
    out_dir = tempfile.mkdtemp(prefix=f"fb-preset-{name}-")
    preset = name.split("+")[0]
    cfg = load_experiment(preset, [*overrides, "engine=inline", f"output.dir={out_dir}"])
    run_dir = Path(run_inline(cfg)["run_dir"])
    summary = json.loads((run_dir / "summary.json").read_text())
    result = {
        "metrics": without_timings(jsonl(run_dir / "metrics.jsonl")),
        "summary": without_timings(summary),
        "model": digests(dict(np.load(run_dir / "model.npz"))),
    }
    if (run_dir / "attacks.jsonl").exists():  # the attack's scores per attacked reply
        result["attacks"] = without_timings(jsonl(run_dir / "attacks.jsonl"))
    for saved in sorted(run_dir.glob("model.r*.pt")):  # output.save_rounds: state-dict keys too
        state = torch.load(saved, map_location="cpu")
        result[saved.name] = digests({k: v.numpy() for k, v in state.items()})
    return result


def jsonl(path: Path) -> list[Any]:
    """The records of a JSON-lines file."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def digests(arrays: dict[str, np.ndarray]) -> dict[str, str]:
    """Name -> dtype, shape and SHA-256 of the bytes of each array: the model bit for bit."""
    return {
        name: f"{a.dtype}{list(a.shape)}:{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()}"
        for name, a in arrays.items()
    }


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
