"""benchmarks/scale_memory.py: its arguments, the rows it gives each client, its table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import scale_memory

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--clients", "0"], "--clients must be >= 1 (got 0)"),
        (["--fraction", "1.5"], "--fraction must be in (0, 1] (got 1.5)"),
        (["--clients", "50", "--fraction", "0.01"], "samples none"),
        (["--rounds", "0"], "--rounds must be >= 1 (got 0)"),
        (["--rows-per-client", "0"], "--rows-per-client must be >= 1 (got 0)"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args, says):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale_memory", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("scale_memory: ") and says in done.stderr


def test_every_client_gets_training_rows():
    assert scale_memory.training_rows(10_000) == 0  # Adult's 30,162 rows as they are
    assert scale_memory.training_rows(100_000) == 300_000
    assert scale_memory.training_rows(100_000, per_client=1) == 100_000
    for clients in (10_000, 11_000, 100_000):
        rows = scale_memory.training_rows(clients) or scale_memory.ADULT_TRAIN_ROWS
        assert rows // clients >= 1


def test_the_table_has_both_arms_and_their_ratios():
    gib = scale_memory.GIB
    arm = {"cpu_s": 10.0, "wall_s": 20.0}
    result = {
        "flowerbed": {**arm, "rss": 3 * gib, "pss": 2 * gib},
        "bare": {**arm, "rss": 4 * gib, "pss": 2.5 * gib},
        "load": "1.0 0.5 0.2 -> 2.0 1.5 1.2", "uptime_utc": "12:00", "setting": (100_000, 0.01, 2, 300_000),
    }  # fmt: skip
    table = scale_memory.markdown_table([result]).splitlines()
    assert len(table) == 3
    assert table[2].startswith(
        "| 100,000 at 1 %, 2 rounds (300,000 rows) | 3.00 / 4.00 GiB (**0.75**)"
    )
    assert "2.00 / 2.50 GiB (**0.80**)" in table[2]
    assert table[2].endswith("| 10 / 10 | 20 / 20 s | 1.0 -> 2.0 (`uptime` 12:00 UTC) |")
