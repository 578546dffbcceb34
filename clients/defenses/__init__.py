"""Defenses, registered by name (``defenses: [{name: ..., params: {...}}]`` in a config).

A defense may transform a client's reply (a train hook run after local training) and/or wrap the
server strategy; the base class states both hooks. Filled by the defenses issue.
"""

from __future__ import annotations

from typing import Any, ClassVar

from flwr.app import ArrayRecord

from clients.registry import DEFENSES, NoParams

__all__ = ["DEFENSES", "Defense"]


class Defense:
    """Client-side transform of an update and/or a server-side strategy wrapper."""

    Params: ClassVar[type] = NoParams

    def __init__(self, cfg: dict[str, Any], params: dict[str, Any]) -> None:
        self.cfg = cfg
        self.params = self.Params(**params)

    def on_client_update(
        self, sent: ArrayRecord, updated: ArrayRecord, metrics: dict[str, float], context: Any
    ) -> ArrayRecord:
        """Transform a client's trained arrays before they are sent (default: unchanged)."""
        return updated

    def wrap_strategy(self, strategy: Any) -> Any:
        """Wrap the server strategy (default: unchanged)."""
        return strategy
