"""A run's summary as the terminal shows it (``flowerbed run``, ``flowerbed show``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table as RichTable
from rich.text import Text

if TYPE_CHECKING:
    from flowerbed.server.results import Summary


def summary_view(summary: Summary) -> Group:
    """The summary table, then one line of counts and timings (never a wrapped caption)."""
    table = RichTable(
        title=f"{summary['experiment']} ({summary['engine']}, seed {summary['seed']})"
    )
    table.add_column("metric", no_wrap=True, overflow="fold")
    table.add_column("final", justify="right", no_wrap=True)
    for key, value in summary["metrics"].items():
        table.add_row(key, f"{value:.4g}")
    overrides = " ".join(summary.get("overrides", []))
    shown = [Text(f"overrides: {overrides}")] if overrides else []
    return Group(table, *shown, Text(summary_caption(summary)))


def summary_caption(summary: Summary) -> str:
    """``3 rounds, 10 clients; 24.1 s (start-up 9.2 s); failed replies: none``."""
    per_round = summary.get("failures_per_round", [])
    failed = [f"round {i}: {n}" for i, n in enumerate(per_round, start=1) if n]
    failures = f"{sum(per_round)} ({', '.join(failed)})" if failed else "none"
    timing = f"{summary['wall_s']} s"
    if "startup_s" in summary:
        timing += f" (start-up {summary['startup_s']} s)"
    from flowerbed.server.results import dropped_note

    return (
        f"{summary['rounds']} rounds, {summary['clients']} clients; {timing}; "
        f"failed replies: {failures}{dropped_note(summary)}"
    )
