"""The one contract of every component kind: ``cls(params, ctx)``.

Workloads, datasets, strategies, defenses and malicious clients subclass :class:`Component`
through their kind's base (``Workload``, ``Dataset``, ``StrategyEntry``, ``Defense``,
``Malicious``; attacks' ``Attack`` keeps the same signature): ``params`` is the component's typed
``Params`` (or its fields as a mapping), ``ctx`` the kind's frozen context (``Context``), never the
experiment config. ``tests/test_components.py`` enumerates the kinds and checks every entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Generic, cast

from typing_extensions import TypeVar

from flowerbed.clients.core.registry import NoParams

C = TypeVar("C")
#: the component's typed ``Params``: a kind's base leaves it open (``object``), a component
#: narrows it with ``params: Params`` (or names it: ``Component[Ctx, MyParams]``)
P = TypeVar("P", default=object)


class Component(Generic[C, P]):
    """Base of each kind's base: keeps ``self.params`` and ``self.ctx`` (a ``Context``)."""

    params: P

    Params: ClassVar[type] = NoParams
    #: the kind's context type (``WorkloadContext``, ``DefenseContext``, ...)
    Context: ClassVar[type]
    #: how a config builds one (named when something else is passed as the context)
    built_by: ClassVar[str] = ""
    registry_name: ClassVar[str]
    description: ClassVar[str]

    def __init__(self, params: P | Mapping[str, object] | None, ctx: C) -> None:
        """``params``: this component's ``Params``, or its fields as a mapping; ``ctx``: its
        kind's context (``TypeError`` for anything else, e.g. a config dict)."""
        if not isinstance(ctx, self.Context):
            raise TypeError(
                f"{type(self).__name__} takes its Params and a {self.Context.__name__}, not "
                f"{type(ctx).__name__} ({self.built_by})"
            )
        self.params = (
            cast(P, params)
            if isinstance(params, self.Params)
            else self.Params(**cast(Mapping[str, object], params or {}))
        )
        self.ctx: C = ctx
