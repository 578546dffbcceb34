"""The ``report`` block of a sweep YAML (:class:`ReportConfig`) and the Markdown tables of
results.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import pandas as pd


class Goal(StrEnum):
    max = "max"
    min = "min"


@dataclass
class ReportConfig:
    rows: str | None = None
    columns: str | None = None
    value: str | None = None
    utility: str | None = None
    x: str | None = None
    adaptive: str | None = None
    utility_goal: Goal = Goal.max
    extra: list[str] = field(default_factory=list)


class ReportedSweep(Protocol):
    """What the report reads of a sweep (``server.sweep.SweepConfig``, which imports the report:
    the report names this instead)."""

    name: str
    base: str
    engine: str
    report: ReportConfig


def markdown_table(frame: pd.DataFrame) -> str:
    """A pandas frame (index = first column) as a Markdown table."""
    head = [str(frame.index.name or "")] + [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for index, row in frame.iterrows():
        cells = [_fmt(v) for v in row]
        lines.append("| " + " | ".join([str(index)] + cells) + " |")
    return "\n".join(lines)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"] if "status" in frame else frame
