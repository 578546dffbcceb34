"""The ``inline`` engine: flowerbed's ServerApp logic driving its ClientApp on an in-process Grid.

It lives beside the apps because it binds the ClientApp object to the Grid
(``flowerbed.server.engines.inline``): no Ray, no SuperLink, the same code as the other engines.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowerbed.apps.client_app import app as client_app
from flowerbed.server.engines.inline import InlineGrid
from flowerbed.server.results import default_run_dir
from flowerbed.server.runner import run_experiment


def run_inline(
    cfg: dict[str, Any],
    run_dir: Path | None = None,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run a resolved config in this process; returns the summary (``summary["run_dir"]``)."""
    if on_status is not None:
        on_status("building the workload and evaluating the initial model…")
    grid = InlineGrid(client_app, cfg["clients"]["num"])
    return run_experiment(grid, cfg, Path(run_dir) if run_dir else default_run_dir(cfg), on_round)


def inline_grid(num_nodes: int) -> InlineGrid:
    """An in-process Grid of ``num_nodes`` virtual SuperNodes running flowerbed's ClientApp."""
    return InlineGrid(client_app, num_nodes)
