"""Pre-flight of ``flowerbed run``: resolve the config, read the dataset, build the workload.

Everything that can reject a user's input happens here, before a run directory exists. For the
engines that run the experiment in other processes (simulation, deployment), the CLI runs this
module as a short-lived child process (``python -m flowerbed.apps.preflight``), so torch, the
dataset and the workload never stay resident in the CLI process while the run goes on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from flowerbed.clients.core.errors import ConfigError


def preflight(experiment: str, overrides: list[str], forced: dict[str, Any]) -> dict[str, Any]:
    """The resolved config; raises ``ConfigError`` for anything wrong with the input."""
    from flowerbed.clients.datasets import load_table
    from flowerbed.clients.workloads import WORKLOADS
    from flowerbed.server.experiment import load_experiment

    cfg = load_experiment(experiment, overrides, **forced)
    if "dataset" in getattr(WORKLOADS.get(cfg["workload"]["name"]), "reads", ()):
        try:
            load_table(cfg["dataset"])
        except (FileNotFoundError, OSError) as exc:
            raise ConfigError(
                f"dataset '{cfg['dataset']['name']}' could not be read: {exc}"
            ) from None
    WORKLOADS.get(cfg["workload"]["name"])(cfg)
    check_superlink(cfg)
    check_ray_address(cfg)
    return cfg


def check_ray_address(cfg: dict[str, Any]) -> None:
    """``simulation.ray_address`` has an allowed form and goes with the simulation engine."""
    from flowerbed.server.ray_cluster import check_address

    address = cfg["simulation"]["ray_address"]
    if not address:
        return
    check_address(address)
    if cfg["engine"] != "simulation":
        raise ConfigError(
            f"simulation.ray_address runs the simulation engine on a Ray cluster; it does not "
            f"apply to engine '{cfg['engine']}' (use engine=simulation, or unset it)"
        )


def check_superlink(cfg: dict[str, Any]) -> None:
    """A deployment run names a SuperLink that answers, with TLS the given CA verifies."""
    from flowerbed.server.processes import probe_superlink

    deployment = cfg["deployment"]
    if cfg["engine"] != "deployment" or not deployment["superlink"]:
        return
    ca = None if deployment["insecure"] else deployment["root_certificates"]
    if ca and not Path(ca).is_file():
        raise ConfigError(f"root certificate not found: {ca}")
    problem = probe_superlink(deployment["superlink"], ca)
    if problem:
        raise ConfigError(problem)


def preflight_in_child(
    experiment: str, overrides: list[str], forced: dict[str, Any]
) -> dict[str, Any]:
    """:func:`preflight` in a child process; its ``ConfigError`` is raised here, one line."""
    request = json.dumps({"experiment": experiment, "overrides": overrides, "forced": forced})
    proc = subprocess.run(
        [sys.executable, "-m", "flowerbed.apps.preflight"],
        input=request, capture_output=True, text=True, check=False,
    )  # fmt: skip
    answer = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode == 0 and answer:
        return json.loads(answer)["config"]
    if proc.returncode == 2 and answer:
        raise ConfigError(json.loads(answer)["error"])
    raise RuntimeError(f"pre-flight failed (exit {proc.returncode}):\n{proc.stderr.strip()}")


def main() -> None:
    request = json.loads(sys.stdin.read())
    try:
        cfg = preflight(request["experiment"], request["overrides"], request["forced"])
    except ConfigError as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(2)
    print(json.dumps({"config": cfg}))


if __name__ == "__main__":
    main()
