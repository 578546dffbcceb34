"""Experiment configs, resolved against every registry.

The core layer (``flowerbed.clients.core.config``) cannot import the layers above it; this module
sees them all and hands their registries in. Everything that turns a preset or a YAML file into a
resolved experiment (the CLI, the ServerApp, sweeps, tests) goes through here.
"""

from __future__ import annotations

from typing import Any

from flowerbed.attacks import ATTACKS
from flowerbed.clients.core import config as core
from flowerbed.clients.core.values import JsonValue
from flowerbed.clients.datasets import DATASETS
from flowerbed.clients.defenses import DEFENSES
from flowerbed.clients.malicious import MALICIOUS
from flowerbed.clients.workloads import WORKLOADS
from flowerbed.server.combinations import check_combinations
from flowerbed.strategies import STRATEGIES

COMPONENTS = core.Components(
    workloads=WORKLOADS, datasets=DATASETS, strategies=STRATEGIES, attacks=ATTACKS,
    defenses=DEFENSES, malicious=MALICIOUS,
)  # fmt: skip


def load_experiment(
    name_or_path: str, overrides: list[str] | str | None = None, **forced: JsonValue
) -> core.Experiment:
    """Preset name (or YAML path) + dotlist overrides (+ forced values) -> resolved experiment."""
    experiment = core.load_experiment(name_or_path, overrides, COMPONENTS, **forced)
    check_combinations(experiment)
    return experiment


def resolve(base: dict[str, Any], overrides: dict[str, Any] | None = None) -> core.Experiment:
    """Validate a raw config (or a resolved experiment's dict) into a typed experiment."""
    experiment = core.resolve(base, overrides, COMPONENTS)
    check_combinations(experiment)
    return experiment


def with_overrides(experiment: core.Experiment, overrides: list[str] | str) -> core.Experiment:
    """``experiment`` resolved again with dotlist ``overrides`` on top (a changed copy)."""
    return resolve(experiment.to_dict(), core.parse_overrides(overrides))
