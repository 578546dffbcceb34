"""Server-side aggregation strategies, registered by name (``strategy.name`` in a config).

A strategy entry is a class with a ``Params`` dataclass and ``build(cfg) -> flwr Strategy``.
"""

from clients.registry import Registry

STRATEGIES = Registry("strategy", ("strategies",))

__all__ = ["STRATEGIES"]
