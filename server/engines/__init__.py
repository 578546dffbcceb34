"""Engines: each turns a resolved config into a finished run directory, with the same files.

``inline`` (in-process Grid), ``simulation`` (Flower's Ray Simulation Engine via ``flwr run``);
``deployment`` submits to a running SuperLink (see server/engines/deployment.py when present).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from flowerbed.clients.core.errors import ConfigError

ENGINE_MODULES = {
    "inline": ("flowerbed.server.engines.inline", "run_inline"),
    "simulation": ("flowerbed.server.engines.simulation", "run_simulation"),
    "deployment": ("flowerbed.server.engines.deployment", "run_deployment"),
}


def get_engine(name: str) -> Callable[..., dict[str, Any]]:
    if name not in ENGINE_MODULES:
        raise ConfigError(f"unknown engine '{name}' (allowed: {', '.join(ENGINE_MODULES)})")
    module, func = ENGINE_MODULES[name]
    try:
        return getattr(importlib.import_module(module), func)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"engine '{name}' is not available in this build ({exc})") from None
