"""The live progress display of ``flowerbed run`` and ``flowerbed sweep`` (stderr, 80 columns).

Three lines, each cut to the terminal width rather than wrapped::

    quickstart [simulation] ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━   1/3 0:00:21
      round 2/3: training 10 clients…
      central.accuracy=0.8423  central.loss=0.3512  eval.accuracy=0.8391

The bar, ``n/R`` and the elapsed time keep their width; the name gives way first. Nothing is
drawn when stderr is not a terminal (logs and pipes get the final table only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.text import Text

#: metric scopes shown while a run goes (the summary table shows everything)
SHOWN_SCOPES = ("central", "eval", "attack")


class RunProgress(Progress):
    """A Rich progress bar with a status line and a metrics line under it."""

    def __init__(self, console: Console, unit: str = "") -> None:
        self.status_text = ""
        self.metrics_text = ""
        super().__init__(
            TextColumn(
                "[bold]{task.description}",
                table_column=Column(no_wrap=True, overflow="ellipsis", min_width=8, ratio=1),
            ),
            BarColumn(bar_width=None, table_column=Column(min_width=10, ratio=2)),
            MofNCompleteColumn(table_column=Column(no_wrap=True)),
            TextColumn(unit, table_column=Column(no_wrap=True)) if unit else TextColumn(""),
            TimeElapsedColumn(table_column=Column(no_wrap=True)),
            console=console,
            transient=True,
            expand=True,
            redirect_stdout=False,
            redirect_stderr=False,
            disable=not console.is_terminal,
        )

    def status(self, text: str) -> None:
        """What the run is doing or waiting for (``starting Ray (10 virtual clients)…``)."""
        self.status_text = text
        self.refresh()

    def metrics(self, final: Mapping[str, object]) -> None:
        self.metrics_text = format_metrics(final)
        self.refresh()

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for line in (self.status_text, self.metrics_text):
            if line:
                yield Text(f"  {line}", no_wrap=True, overflow="ellipsis", style="dim")


def format_metrics(final: Mapping[str, object]) -> str:
    """``central.accuracy=0.8423  eval.loss=0.3512`` (the scopes a user watches, in that order)."""
    shown = []
    for scope in SHOWN_SCOPES:
        for key in sorted(k for k in final if k.split(".")[0] == scope):
            value = final[key]
            if isinstance(value, int | float) and not key.endswith("majority_accuracy"):
                shown.append(f"{key}={value:.4g}")
    return "  ".join(shown)
