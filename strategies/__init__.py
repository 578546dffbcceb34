"""Server-side aggregation strategies, registered by name (``strategy.name`` in a config).

A strategy entry subclasses ``StrategyEntry`` (``strategies/context.py``): a ``Params`` dataclass,
``StrategyEntry(params, ctx)``, and ``strategy()`` returning the Flower strategy that runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowerbed.clients.core.registry import Registry

if TYPE_CHECKING:
    from flowerbed.strategies.context import StrategyEntry

STRATEGIES: Registry[StrategyEntry] = Registry(
    "strategy", (__name__,), group="flowerbed.strategies"
)

__all__ = ["STRATEGIES"]
