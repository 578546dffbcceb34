"""The simulation engine's own local Ray head: started with the SuperLink, only what a run uses.

Flower's ``flwr-simulation`` calls ``ray.init()``, which starts a Ray head of its own after the
process has imported the ServerApp and the ClientApp: every simulation paid Ray's start-up on its
critical path, with the dashboard, the autoscaler monitor, the log monitor and one pre-started
idle worker per CPU that Flower's actors never use (they need the run's runtime environment).
Flower's backend connects to ``RAY_ADDRESS`` when it is set (the ``--ray ADDRESS`` path uses the
same), so the engine starts a head here while the config is checked and the SuperLink boots:

``ray start --head --block`` (Ray's documented command) on a free port, in the engine's private
home, with ``--include-dashboard=false`` (Ray still runs its API server), ``--no-monitor``,
``RAY_prestart_worker_first_driver=0`` and no Ray Client server (``ray start`` has no flag for
that: Ray's ``RAY_START_HOOK``, :func:`start_hook`, unsets its port before the head starts;
``ray.init()`` starts none either);
same CPUs and memory as ``ray.init()`` would detect. The log monitor stays: it carries the
actors' output to Flower's log (Flower's ``log_to_driver`` default), ``flower.log`` and ``-v``.
It leads its own process group and carries the engine's owner tag, so the engine (or its reaper,
after a SIGKILL) ends it with everything it started. Flower's ``ray.shutdown()`` at the end of a
run then only disconnects its driver (Ray removes that job's actors).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from flowerbed.server.processes import bin_path, free_port

if TYPE_CHECKING:
    from ray._private.parameter import RayParams

#: Ray's settings for a head that only hosts one simulation (``ray start`` flags)
HEAD_FLAGS = (
    "--include-dashboard=false",  # no dashboard process (Flower passes include_dashboard=False)
    "--no-monitor",  # no autoscaler monitor: a local head never scales
    "--disable-usage-stats",
)
#: environment of the head: no idle workers pre-started for the first driver (Flower's actors
#: run in a runtime environment of their own, so they never reuse them)
HEAD_ENV = {
    "RAY_prestart_worker_first_driver": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_START_HOOK": "flowerbed.server.ray_local.start_hook",
}


#: the worker zygote's socket (``apps/ray_zygote.py``); set: workers are forked from it
ZYGOTE_ENV = "FLOWERBED_RAY_ZYGOTE"
#: the zygote's PID (the launcher waits for its socket while it lives)
ZYGOTE_PID_ENV = "FLOWERBED_RAY_ZYGOTE_PID"
#: Ray's own ``setup_worker.py``, for the workers the launcher leaves to Ray
SETUP_WORKER_ENV = "FLOWERBED_RAY_SETUP_WORKER"
#: the launcher the raylet runs instead of Ray's ``setup_worker.py`` (``RayParams.setup_worker_path``)
LAUNCHER = "flowerbed.apps.ray_launch"


def start_hook(ray_params: RayParams, head: bool) -> None:
    """Ray's ``RAY_START_HOOK`` (called by ``ray start`` with its ``RayParams``): no Ray Client
    server on this head (Flower connects as a driver; the server would cost ~1 CPU s and take the
    fixed port 10001, which two runs at once would share). With ``FLOWERBED_RAY_ZYGOTE`` set, the
    raylet starts workers through ``apps/ray_launch.py``, which has the zygote fork them (Ray's
    ``setup_worker.py`` stays what the launcher falls back to)."""
    if not head:
        return
    ray_params.ray_client_server_port = None
    if os.environ.get(ZYGOTE_ENV):
        import importlib.util

        import ray

        workers = Path(ray.__file__).parent / "_private" / "workers"
        os.environ[SETUP_WORKER_ENV] = str(workers / "setup_worker.py")
        spec = importlib.util.find_spec(LAUNCHER)
        if spec is not None and spec.origin:
            ray_params.setup_worker_path = spec.origin


def head_command(port: int, home: Path) -> list[str]:
    """``ray start`` of a blocking head on ``127.0.0.1:port`` with its files under ``home``."""
    return [
        bin_path("ray"), "start", "--head", "--block", f"--port={port}",
        # its agent's HTTP port is fixed (52365) by default: two runs at once would share it
        f"--dashboard-agent-listen-port={free_port()}",
        "--node-ip-address=127.0.0.1", f"--temp-dir={home / 'ray'}", *HEAD_FLAGS,
    ]  # fmt: skip
