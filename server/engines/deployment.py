"""The ``deployment`` engine: submit to a running SuperLink with ``flwr run`` and collect the results.

The federation is either the loopback one of ``flowerbed deploy up`` (found through its state
file) or any SuperLink given as ``deployment.superlink=HOST:PORT`` (with
``deployment.root_certificates=CA`` or ``deployment.insecure=true``). The ServerApp may run on
another machine, so it writes its run directory in its own workspace and prints each metrics line,
the summary (and, if it fails, its error) behind a marker; this engine rebuilds the local run
directory from the streamed log and turns a ServerApp failure into a one-line error.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowerbed.clients.core.config import Experiment, encode_config, to_yaml
from flowerbed.clients.core.errors import ConfigError
from flowerbed.server.deploy import CONNECTION, cli_error, load_state, write_connection
from flowerbed.server.federation import ERROR_MARKER
from flowerbed.server.processes import (
    Reaper,
    app_dir,
    bin_path,
    flower_env,
    private_home,
    stop_group,
)
from flowerbed.server.results import (
    METRICS_MARKER,
    SUMMARY_MARKER,
    Summary,
    atomic_write,
    plot_curves,
    render_report,
    titled,
)


def _connection(experiment: Experiment, home: Path) -> None:
    deployment = experiment.deployment
    if deployment.superlink:
        ca = deployment.root_certificates
        if not deployment.insecure and not ca:
            raise ConfigError(
                "deployment.superlink needs deployment.root_certificates=CA_FILE "
                "(or deployment.insecure=true)"
            )
        if ca and not Path(ca).is_file():
            raise ConfigError(f"root certificate not found: {ca}")
        write_connection(
            home, deployment.superlink, None if deployment.insecure or ca is None else Path(ca)
        )
        return
    state = load_state(Path(deployment.dir))
    if state["nodes"] != experiment.clients.num:
        raise ConfigError(
            f"clients.num={experiment.clients.num} but the federation has {state['nodes']} "
            f"SuperNodes (set clients.num={state['nodes']})"
        )
    state_ca = None if state["insecure"] else Path(state["dir"]) / "certs" / "ca.crt"
    write_connection(home, state["address"], state_ca)


class DeploymentError(ConfigError):
    """The federation could not run it (unreachable, refused, the ServerApp failed).

    One line naming the cause; the CLI prints it like any input error (exit status 2). Flower's
    full log is kept outside the run directory, which the CLI removes after a failed run.
    """


def run_deployment(
    experiment: Experiment,
    run_dir: Path,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> Summary:
    """Submit ``experiment`` with ``flwr run --stream``; rebuild ``run_dir`` from the streamed results.

    The ``flwr`` CLI runs in its own process group under a :class:`Reaper`: however this process
    ends (an error, Ctrl-C, ``kill -9``), the CLI does not outlive it.
    """
    if on_status is not None:
        on_status("submitting to the SuperLink…")
    home = private_home("fb-deploy-")
    reaper = Reaper(home)
    proc: subprocess.Popen | None = None
    try:
        _connection(experiment, home / "flwr")
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(run_dir / "config.yaml", to_yaml(experiment))
        env = flower_env(home)
        env["FLWR_HOME"] = str(home / "flwr")
        # the ServerApp may be remote: it gets the run's name and writes it in its own workspace
        command = [
            bin_path("flwr"), "run", str(app_dir()), CONNECTION, "--stream",
            "--run-config", f"config='{encode_config(experiment)}' run-dir='{run_dir.name}'",
        ]  # fmt: skip
        log_path = run_dir / "flower.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,
            )  # fmt: skip
            reaper.watch(proc.pid)
            stream = _Stream(on_round)
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                stream.feed(line)
            proc.wait()
    finally:
        if proc is not None and proc.poll() is None:
            stop_group(proc.pid)
        reaper.done()
        shutil.rmtree(home, ignore_errors=True)
    if stream.error is not None or stream.summary is None:
        kept = Path(tempfile.gettempdir()) / f"flowerbed-{run_dir.name}-flower.log"
        shutil.copyfile(log_path, kept)
        if stream.error is not None:
            raise DeploymentError(f"the ServerApp failed: {stream.error} (Flower's log: {kept})")
        raise DeploymentError(
            f"the run ended without results (flwr run exit {proc.returncode}): "
            f"{_last_problem(log_path)} (Flower's log: {kept})"
        )
    summary: Summary = {**stream.summary, "run_dir": str(run_dir)}
    summary["serverapp_run_dir"] = stream.summary.get("run_dir")
    _rebuild(run_dir, stream.history, summary, experiment)
    return summary


class _Stream:
    """Collects the ServerApp's marker lines from ``flwr run --stream``."""

    def __init__(self, on_round: Callable[[int, dict[str, float]], None] | None) -> None:
        self.on_round = on_round
        self.history: list[dict[str, Any]] = []
        self.final: dict[str, float] = {}
        self.summary: Summary | None = None
        self.error: str | None = None

    def feed(self, line: str) -> None:
        if METRICS_MARKER in line:
            entry = json.loads(line.split(METRICS_MARKER, 1)[1])
            self.history.append(entry)
            for key, value in entry.items():
                if key not in ("round", "scope", "elapsed_s"):
                    self.final[f"{entry['scope']}.{key}"] = value
            if self.on_round is not None:
                self.on_round(entry["round"], self.final)
        elif SUMMARY_MARKER in line:
            self.summary = json.loads(line.split(SUMMARY_MARKER, 1)[1])
        elif ERROR_MARKER in line and self.error is None:
            self.error = line.split(ERROR_MARKER, 1)[1].strip()


def _last_problem(log_path: Path) -> str:
    """Flower's last error box, else the last line naming an error, else the last line."""
    text = log_path.read_text()
    if boxed := cli_error(text):
        return boxed
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if any(word in line for word in ("Error", "error", "Exception", "failed", "Exit Code")):
            return line
    return lines[-1] if lines else "no output"


def _rebuild(run_dir: Path, history: list[dict], summary: Summary, experiment: Experiment) -> None:
    """Write the run directory from what the (possibly remote) ServerApp streamed."""
    atomic_write(run_dir / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in history))
    atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    atomic_write(run_dir / "report.md", render_report(summary, history))
    if experiment.output.plots:
        plot_curves(history, run_dir / "curves.png", titled(experiment), summary.get("startup_s"))
