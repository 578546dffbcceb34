"""What ``flowerbed run`` does around the engine: read the config's engine without resolving it,
pre-flight, run, and leave no run directory behind when the input was at fault. (It stays in
apps/: it picks the engine from apps.engines and pre-flights with apps.preflight.)
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from flowerbed.apps.cli.flower_log import LogTail, _quiet_flower
from flowerbed.clients.core.errors import ConfigError, RunFailed

if TYPE_CHECKING:
    from flowerbed.apps.engines import Engine
    from flowerbed.apps.progress import RunProgress
    from flowerbed.clients.core.config import Experiment
    from flowerbed.clients.core.values import JsonValue
    from flowerbed.server.results import Summary


def prepare(
    experiment: str, overrides: list[str], isolated: bool = False,
    zygote: tuple[str, int] | None = None, **forced: JsonValue,
) -> Experiment:  # fmt: skip
    """Resolve and pre-flight a config (dataset readable, workload constructible).

    ``isolated``: in a child process, so the heavy imports and the dataset do not stay resident
    in this process while another process runs the experiment; ``zygote``: forked from the
    simulation engine's warm zygote (``preflight_in_child``).
    """
    from flowerbed.apps.preflight import preflight, preflight_in_child

    forced = {k: v for k, v in forced.items() if v is not None}
    if isolated:
        return preflight_in_child(experiment, overrides, forced, zygote)
    return preflight(experiment, overrides, forced)


def raw_engine(experiment: str, overrides: list[str], engine: str | None) -> str:
    """The engine a config asks for, read without resolving it (which imports the registries)."""
    if engine is not None:
        return engine
    return str(raw_setting(experiment, overrides, "engine") or "simulation")


def raw_setting(experiment: str, overrides: list[str], dotted: str) -> object:
    """A key of a config (overrides first, then the preset or file), read without resolving it."""
    from flowerbed.clients.core.config import load_base, parse_overrides
    from flowerbed.clients.core.files import dotted_get

    missing = object()
    for layer in (parse_overrides(overrides), load_base(experiment)):
        value = dotted_get(layer, dotted, missing)
        if value is not missing:
            return value
    return None


def execute(
    experiment: Experiment, run_dir: Path, progress: RunProgress | None = None,
    verbose: bool = False, engine: Engine | None = None,
) -> Summary:  # fmt: skip
    """Run a resolved experiment on its engine; remove the run directory if the input was at
    fault.

    ``engine``: the engine booted before the config was checked (``apps.engines.booted``); by
    default the config's engine.
    """
    from flowerbed.apps.engines import get_engine

    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(
            f"run directory {run_dir} is a file (--out takes a directory: new or empty)"
        )
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"run directory {run_dir} already exists and is not empty")
    engine = engine or get_engine(experiment.engine)
    created = not run_dir.exists()
    log_handler = None
    inline = experiment.engine == "inline"
    if inline:  # Flower logs in this process (elsewhere: RUN_DIR/flower.log)
        log_handler = _quiet_flower(verbose, run_dir / "flower.log")
    rounds = experiment.rounds
    tail = LogTail(run_dir / "flower.log") if verbose and not inline else None

    def on_round(server_round: int, final: dict) -> None:
        if progress is not None:
            progress.update(progress.task_ids[0], completed=server_round)
            progress.metrics(final)
            if server_round < rounds:
                progress.status(f"round {server_round + 1}/{rounds}…")
        if tail is not None:
            tail.flush()

    def on_status(text: str) -> None:
        if progress is not None:
            progress.status(text)
        if tail is not None:
            tail.flush()

    try:
        summary = engine(experiment, run_dir, on_round=on_round, on_status=on_status)
    except ConfigError:
        _remove(run_dir, created)
        raise
    except RunFailed:
        raise
    except Exception as exc:
        cause = _recorded_cause(run_dir)
        if cause is not None:
            kind, message = cause
            if kind == "config":
                _remove(run_dir, created)
                raise ConfigError(message) from None
            raise RunFailed(f"{message} (log: {run_dir / 'flower.log'})") from None
        from flowerbed.server.processes import user_problem

        problem = None
        if experiment.engine == "deployment":  # a SuperLink the user pointed us at
            problem = user_problem(run_dir / "flower.log", exc, experiment.deployment)
        if problem is not None:
            _remove(run_dir, created)
            raise ConfigError(problem) from None
        raise
    except BaseException:  # Ctrl-C, SIGTERM: an unfinished run leaves nothing behind
        _remove(run_dir, created)
        raise
    finally:
        if tail is not None:
            tail.flush()
        if log_handler is not None:
            logging.getLogger("flwr").removeHandler(log_handler)
            logging.getLogger("py.warnings").removeHandler(log_handler)
            log_handler.close()
    return summary


def _recorded_cause(run_dir: Path) -> tuple[str, str] | None:
    from flowerbed.server.results import ERROR_FILE

    path = run_dir / ERROR_FILE
    if not path.is_file():
        return None
    kind, _, message = path.read_text().strip().partition(": ")
    return kind, message


def _remove(run_dir: Path, created: bool) -> None:
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
