"""The ``deployment`` engine: submit to a running SuperLink with ``flwr run`` and collect the results.

The federation is either the loopback one of ``flowerbed deploy up`` (found through its state
file) or any SuperLink given as ``deployment.superlink=HOST:PORT`` (with
``deployment.root_certificates=CA`` or ``deployment.insecure=true``). The ServerApp may run on
another machine, so it also prints each metrics line and the summary behind a marker; this engine
rebuilds the run directory from the streamed log when the ServerApp's own files are not local.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowerbed.clients.core.config import encode_config, to_yaml
from flowerbed.clients.core.errors import ConfigError
from flowerbed.server.deploy import CONNECTION, load_state, write_connection
from flowerbed.server.processes import app_dir, bin_path, flower_env
from flowerbed.server.results import (
    METRICS_MARKER,
    SUMMARY_MARKER,
    atomic_write,
    plot_curves,
    render_report,
)


def _connection(cfg: dict[str, Any], home: Path) -> None:
    deployment = cfg["deployment"]
    if deployment["superlink"]:
        ca = deployment["root_certificates"]
        if not deployment["insecure"] and not ca:
            raise ConfigError(
                "deployment.superlink needs deployment.root_certificates=CA_FILE "
                "(or deployment.insecure=true)"
            )
        if ca and not Path(ca).is_file():
            raise ConfigError(f"root certificate not found: {ca}")
        write_connection(
            home, deployment["superlink"], None if deployment["insecure"] else Path(ca)
        )
        return
    state = load_state(Path(deployment["dir"]))
    if state["nodes"] != cfg["clients"]["num"]:
        raise ConfigError(
            f"clients.num={cfg['clients']['num']} but the federation has {state['nodes']} "
            f"SuperNodes (set clients.num={state['nodes']})"
        )
    ca = None if state["insecure"] else Path(state["dir"]) / "certs" / "ca.crt"
    write_connection(home, state["address"], ca)


def run_deployment(
    cfg: dict[str, Any],
    run_dir: Path,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="fb-deploy-"))
    try:
        _connection(cfg, home / "flwr")
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(run_dir / "config.yaml", to_yaml(cfg))
        env = flower_env(home)
        env["FLWR_HOME"] = str(home / "flwr")
        command = [
            bin_path("flwr"), "run", str(app_dir()), CONNECTION, "--stream",
            "--run-config", f"config='{encode_config(cfg)}' run-dir='{run_dir.resolve()}'",
        ]  # fmt: skip
        log_path = run_dir / "flower.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            history, summary = [], None
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if METRICS_MARKER in line:
                    entry = json.loads(line.split(METRICS_MARKER, 1)[1])
                    history.append(entry)
                    if on_round is not None:
                        on_round(entry["round"], {})
                elif SUMMARY_MARKER in line:
                    summary = json.loads(line.split(SUMMARY_MARKER, 1)[1])
            proc.wait()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if not (run_dir / "summary.json").is_file():
        if summary is None:
            tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
            raise RuntimeError(f"deployment run failed (flwr run exit {proc.returncode}):\n{tail}")
        _rebuild(run_dir, history, summary, cfg)
    return json.loads((run_dir / "summary.json").read_text())


def _rebuild(run_dir: Path, history: list[dict], summary: dict, cfg: dict[str, Any]) -> None:
    """Write the run directory from what the remote ServerApp streamed."""
    atomic_write(run_dir / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in history))
    atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    atomic_write(run_dir / "report.md", render_report(summary, history))
    if cfg["output"]["plots"]:
        plot_curves(history, run_dir / "curves.png", cfg["experiment"])
