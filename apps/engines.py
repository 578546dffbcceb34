"""Engines by name: each turns a resolved config and a run directory into a finished run.

``inline`` (in-process Grid), ``simulation`` (Flower's Ray Simulation Engine via ``flwr run``),
``deployment`` (``flwr run`` against a running SuperLink). All three write the same files.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from flowerbed.clients.core.errors import ConfigError

ENGINES = {
    "inline": ("flowerbed.apps.inline", "run_inline",
               "in-process Grid, no Ray: same ServerApp/ClientApp code, for tests and sweeps"),
    "simulation": ("flowerbed.server.engines.simulation", "run_simulation",
                   "Flower Simulation Engine on Ray (what `flwr run .` uses)"),
    "deployment": ("flowerbed.server.engines.deployment", "run_deployment",
                   "submit to a running SuperLink (flowerbed deploy up, or docker compose)"),
}  # fmt: skip


def get_engine(name: str) -> Callable[..., dict[str, Any]]:
    """``engine(cfg, run_dir, on_round=None) -> summary``; imported on first use."""
    if name not in ENGINES:
        raise ConfigError(f"unknown engine '{name}' (allowed: {', '.join(ENGINES)})")
    module, func, _ = ENGINES[name]
    return getattr(importlib.import_module(module), func)
