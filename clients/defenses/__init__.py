"""Defenses, registered by name (``defenses: [{name: ..., params: {...}}]`` in a config).

A defense acts at one or more points, each a hook with a do-nothing default:

- ``mods()``: Flower client mods wrapped around the train handler (e.g. ``LocalDpMod``);
- ``make_private(model, optimizer, loader, state)``: the training loop itself (DP-SGD);
- ``on_client_update(sent, updated, config, state)``: the update after training (top-k, quantise);
- server side, a wrapper registered under the same name in ``strategies/defenses.py``.

``declares`` says what the defense changes: "update", "training", "aggregation", "visibility".
"""

from __future__ import annotations

from typing import Any, ClassVar

from flwr.app import ArrayRecord, RecordDict

from flowerbed.clients.core.registry import NoParams, Registry

DEFENSES = Registry("defense", (__name__,))

__all__ = ["DEFENSES", "Defense", "build_defenses"]


class Defense:
    """Base class: every hook is the identity."""

    Params: ClassVar[type] = NoParams
    declares: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: dict[str, Any], params: dict[str, Any]) -> None:
        self.cfg = cfg
        self.params = self.Params(**params)

    def mods(self) -> list[Any]:
        return []

    def make_private(self, model: Any, optimizer: Any, loader: Any, state: RecordDict) -> tuple:
        return model, optimizer, loader

    def after_training(self, state: RecordDict, metrics: dict[str, float]) -> None:
        """Called once local training is over (privacy accounting goes here)."""

    def on_client_update(
        self, sent: ArrayRecord, updated: ArrayRecord, config: dict[str, Any], state: RecordDict
    ) -> ArrayRecord:
        """``config`` holds ``partition-id`` and ``server-round`` (for seeding)."""
        return updated


def build_defenses(cfg: dict[str, Any]) -> list[Defense]:
    return [DEFENSES.get(d["name"])(cfg, d["params"]) for d in cfg["defenses"]]
