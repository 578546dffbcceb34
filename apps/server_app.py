"""The flowerbed ServerApp (Message API).

Flower's run config is flat, so the experiment crosses over as keys (see pyproject.toml):
``config`` (a resolved config as base64 JSON, what ``flowerbed run`` sends; it works across
machines) or ``experiment`` + ``overrides`` (what ``flwr run . --run-config "experiment='NAME'"``
gives); ``run-dir`` names the run directory (default ``output.dir/<time>-<experiment>``).

On any federation the ServerApp records the engine its Grid really is and, unless the experiment
pins ``clients.num``, runs with the SuperNodes actually connected (``server/federation.py``). On
Flower's simulation it gives the engine's message hand-out an index by node
(``server/dispatch.py``: a sweep over 100,000 nodes no longer checks every message per node).

The module itself imports little: on Flower's simulation the ServerApp runs in a thread of
``flwr-simulation`` beside the one that connects to Ray and creates the ClientApp actors, and
with the simulation engine's warm actors (``apps/ray_warm.py``) ``main`` lets that thread do so
before it imports torch and loads the data (:func:`after_ray_connects`), so the actors' own
imports run in their processes while this one prepares the first round.
"""

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

if TYPE_CHECKING:
    from flowerbed.clients.core.config import Experiment

from flowerbed.server.federation import ERROR_MARKER, grid_engine, one_line

app = ServerApp()

_PINS_CLIENTS = re.compile(r"(^|\s)clients\.num=")


def config_from_run_config(run_config: dict) -> tuple["Experiment", bool]:
    """The resolved experiment, and whether it pins ``clients.num`` (``flowerbed run`` always
    does)."""
    from flowerbed.clients.core.config import decode_config
    from flowerbed.server.experiment import load_experiment, resolve

    encoded = str(run_config.get("config", "") or "")
    if encoded:
        return resolve(decode_config(encoded)), True
    overrides = str(run_config.get("overrides", ""))
    experiment = load_experiment(str(run_config.get("experiment", "quickstart")), overrides)
    return experiment, bool(_PINS_CLIENTS.search(overrides))


def after_ray_connects(timeout_s: float = 15.0) -> None:
    """Wait (at most ``timeout_s``) until this process's Ray driver is connected, when the
    simulation engine's warm actors are on (``server/engines/simulation.RAY_WARM_ENV``).

    Python runs one thread at a time: the ServerApp's imports and data loading held off the
    other thread's Ray connection and actor creation until round 1 was about to be sent (the
    actors appeared 1.3 s before it, under load). Connecting to the engine's running Ray head
    takes a fraction of a second; the actors are created right after it.
    """
    from flowerbed.server.engines.simulation import RAY_WARM_ENV

    if any(os.environ.get(k) != v for k, v in RAY_WARM_ENV.items()):
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        connected = getattr(sys.modules.get("ray"), "is_initialized", None)  # maybe importing
        if connected is not None and connected():
            return
        time.sleep(0.05)


@app.main()
def main(grid: Grid, context: Context) -> None:
    if grid_engine(grid) == "simulation":
        after_ray_connects()
    from flowerbed.server.cells import run_cells
    from flowerbed.server.dispatch import install as install_indexed_dispatch
    from flowerbed.server.experiment import resolve
    from flowerbed.server.federation import fit_to_federation, serverapp_run_dir
    from flowerbed.server.results import default_run_dir
    from flowerbed.server.runner import run_experiment

    run_config = dict(context.run_config)
    if grid_engine(grid) == "simulation":  # this process runs Flower's engine too
        install_indexed_dispatch()
    sweep_dir = str(run_config.get("sweep-dir", "") or "")
    if sweep_dir:  # a sweep: every cell on this one federation (server/sweep.py)
        todo = json.loads((Path(sweep_dir) / "todo.json").read_text())
        run_cells(grid, [(cell, resolve(data)) for cell, data in todo], Path(sweep_dir))
        return
    try:
        experiment, pinned = config_from_run_config(run_config)
        experiment = fit_to_federation(grid, experiment, pinned)
        requested = str(run_config.get("run-dir", "") or "")
        run_dir = serverapp_run_dir(experiment, requested, default_run_dir(experiment))
        run_experiment(grid, experiment, run_dir)
    except Exception as exc:
        if grid_engine(grid) == "deployment":  # the submitter may be on another machine
            print(ERROR_MARKER + one_line(exc), flush=True)
        raise
