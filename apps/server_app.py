"""The flowerbed ServerApp (Message API).

Flower's run config is flat, so the experiment crosses over as three keys (see pyproject.toml):
``config`` (a resolved config as base64 JSON, what ``flowerbed run`` sends; it works across
machines) or ``experiment`` + ``overrides`` (what ``flwr run . --run-config "experiment='NAME'"``
gives).
"""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from clients.config import decode_config, load_experiment, resolve
from server.runner import run_experiment

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
    run_experiment(grid, config_from_run_config(dict(context.run_config)))
