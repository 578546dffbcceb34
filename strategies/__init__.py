"""Server-side aggregation strategies, registered by name (``strategy.name`` in a config).

A strategy entry is a class with a ``Params`` dataclass and ``build(cfg) -> flwr Strategy``.
"""

from flowerbed.clients.core.registry import Registry

STRATEGIES = Registry("strategy", (__name__,), group="flowerbed.strategies")

__all__ = ["STRATEGIES"]
