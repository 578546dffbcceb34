"""The flowerbed ServerApp (Message API).

Flower's run config is flat, so the experiment crosses over as keys (see pyproject.toml):
``config`` (a resolved config as base64 JSON, what ``flowerbed run`` sends; it works across
machines) or ``experiment`` + ``overrides`` (what ``flwr run . --run-config "experiment='NAME'"``
gives); ``run-dir`` names the run directory (default ``output.dir/<time>-<experiment>``).
"""

import json
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from flowerbed.clients.core.config import decode_config
from flowerbed.server.experiment import load_experiment, resolve
from flowerbed.server.results import default_run_dir
from flowerbed.server.runner import run_experiment
from flowerbed.server.sweep import run_cells

app = ServerApp()


def config_from_run_config(run_config: dict) -> dict:
    encoded = str(run_config.get("config", "") or "")
    if encoded:
        return resolve(decode_config(encoded))
    return load_experiment(
        str(run_config.get("experiment", "quickstart")), str(run_config.get("overrides", ""))
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_config = dict(context.run_config)
    sweep_dir = str(run_config.get("sweep-dir", "") or "")
    if sweep_dir:  # a sweep: every cell on this one federation (server/sweep.py)
        todo = json.loads((Path(sweep_dir) / "todo.json").read_text())
        run_cells(grid, [(cell, resolve(cfg)) for cell, cfg in todo], Path(sweep_dir))
        return
    cfg = config_from_run_config(run_config)
    run_dir = str(run_config.get("run-dir", "") or "")
    run_experiment(grid, cfg, Path(run_dir) if run_dir else default_run_dir(cfg))
