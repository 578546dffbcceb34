"""The README's examples do what it says they do."""

import json
import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from flowerbed.apps.cli import app

ROOT = Path(__file__).resolve().parents[1]


def test_the_100_client_example_learns(tmp_path):
    readme = (ROOT / "README.md").read_text()
    line = next(
        ln for ln in readme.splitlines() if re.match(r"flowerbed run .*clients\.num=100", ln)
    )
    args = shlex.split(line)[1:]
    assert "--engine" in args
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    history = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    central = [h for h in history if h["scope"] == "central"]
    majority = central[0]["majority_accuracy"]
    assert central[-1]["accuracy"] >= majority + 0.05  # well past the majority class
    assert central[2]["accuracy"] > majority  # and already by round 2
