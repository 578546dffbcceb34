"""Engines by name: each turns a resolved experiment and a run directory into a finished run.

``inline`` (in-process Grid), ``simulation`` (Flower's Ray Simulation Engine via ``flwr run``),
``deployment`` (``flwr run`` against a running SuperLink). All three write the same files and are
called the same way (:class:`Engine`); an engine module may define ``boot()``, a context manager
that starts what the engine needs while the caller checks the config (the simulation engine's
SuperLink) and yields the engine bound to it.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from flowerbed.clients.core.errors import ConfigError

if TYPE_CHECKING:
    from flowerbed.clients.core.config import Experiment
    from flowerbed.server.results import Summary

#: ``on_round(server_round, metrics so far)``, after each round
OnRound = Callable[[int, dict[str, float]], None]
#: ``on_status(text)``: what the engine is doing (starting Ray, submitting, ...)
OnStatus = Callable[[str], None]


class Engine(Protocol):
    """``engine(experiment, run_dir, on_round=None, on_status=None) -> summary``
    (``summary["run_dir"]``)."""

    def __call__(
        self, experiment: Experiment, run_dir: Path, on_round: OnRound | None = None,
        on_status: OnStatus | None = None,
    ) -> Summary: ...  # fmt: skip


ENGINES = {
    "inline": ("flowerbed.apps.inline", "run_inline",
               "in-process Grid, no Ray: same ServerApp/ClientApp code, for tests and sweeps"),
    "simulation": ("flowerbed.server.engines.simulation", "run_simulation",
                   "Flower Simulation Engine on Ray (what `flwr run .` uses)"),
    "deployment": ("flowerbed.server.engines.deployment", "run_deployment",
                   "submit to a running SuperLink (flowerbed deploy up, or docker compose)"),
}  # fmt: skip


def get_engine(name: str) -> Engine:
    """The engine called ``name``; imported on first use."""
    if name not in ENGINES:
        raise ConfigError(f"unknown engine '{name}' (allowed: {', '.join(ENGINES)})")
    module, func, _ = ENGINES[name]
    return getattr(importlib.import_module(module), func)


@contextlib.contextmanager
def booted(name: str, **options: str) -> Iterator[Engine]:
    """The engine ``name``, with what it starts ahead (its module's ``boot(**options)``) running
    until the block ends."""
    engine = get_engine(name)
    boot = getattr(importlib.import_module(ENGINES[name][0]), "boot", None)
    if boot is None:
        yield engine
        return
    with boot(**options) as bound:
        yield bound
