"""Named registries for every pluggable kind (workloads, datasets, strategies, attacks, defenses).

Registering a method is one decorated class in one module. A registry finds its entries in three
places, so no central list has to be edited when a method is added:

- flowerbed's own package of that kind (imported on first lookup); a lookup by name first tries the
  module named like the entry (``tabular-mlp`` -> ``tabular_mlp``), so a process that needs one
  method (a ClientApp) imports only that method's module;
- installed packages, through entry points of the registry's group (``flowerbed.defenses``, ...):
  ``clipnoise = "fb_clipnoise.clipnoise:ClipNoise"``, loaded when the name is looked up (or the
  registry listed);
- modules and files named by a config's ``plugins`` key (``flowerbed.clients.core.plugins``).

Each entry remembers where it came from (:meth:`Registry.origin`, shown by ``flowerbed list``); a
name registered twice by different code is a ``ConfigError`` naming both origins.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Generic, TypeVar

from flowerbed.clients.core.errors import ConfigError

T = TypeVar("T")  # the kind's base class (``Registry[Workload]``)
S = TypeVar("S")  # a class being registered

#: origin of the registrations made while a plugin or an entry point is being imported
_LOADING: contextvars.ContextVar[str | None] = contextvars.ContextVar("loading", default=None)
BUILTIN = "flowerbed"


@dataclasses.dataclass
class NoParams:
    """Parameter schema of a component that takes no parameters."""


@contextlib.contextmanager
def loading(origin: str) -> Iterator[None]:
    """Registrations made inside this block record ``origin`` (a plugin, an entry point)."""
    token = _LOADING.set(origin)
    try:
        yield
    finally:
        _LOADING.reset(token)


def _same_class(a: type, b: type) -> bool:
    """The same class, or the same definition imported again (``importlib.reload``)."""
    return a is b or (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


class Registry(Generic[T]):
    """Maps a name to a class of the kind (a subclass of ``T``, the kind's base) with a one-line
    description and a typed ``Params`` dataclass.

    ``check(name, cls)``, when given, runs at registration: a class that breaks its kind's
    contract (a workload offering a capability without its Protocol's members) is refused there.
    """

    def __init__(
        self, kind: str, packages: tuple[str, ...], group: str | None = None,
        check: Callable[[str, type], None] | None = None,
    ) -> None:  # fmt: skip
        self.kind = kind
        #: the entry-point group installed packages register this kind under
        self.group = group or f"flowerbed.{kind}s"
        self.check = check
        self._packages = packages
        self._entries: dict[str, type[T]] = {}
        self._origins: dict[str, str] = {}
        self._discovered = False
        self._loaded_points: set[tuple[str, str]] = set()

    def register(self, name: str, description: str) -> Callable[[type[S]], type[S]]:
        """Class decorator: ``@WORKLOADS.register("tabular-mlp", "MLP classifier on a table")``."""

        def decorate(cls: type[S]) -> type[S]:
            origin = self._origin_of(cls)
            if origin != BUILTIN:  # a name flowerbed or an installed package has is caught here
                if name not in self._entries:
                    self._import_named(name)
                for point in self._entry_points(name):
                    if point.module == cls.__module__:  # this very module, being imported
                        self._loaded_points.add((point.name, point.value))
                    else:
                        self._load_entry_point(point)
            existing = self._entries.get(name)
            if existing is not None and not _same_class(existing, cls):
                if self._origins[name] == BUILTIN:
                    raise ConfigError(
                        f"{self.kind} '{name}' is a built-in flowerbed name; {origin} registers "
                        f"it again (rename yours; taken: flowerbed list {self.kind}s)"
                    )
                raise ConfigError(
                    f"{self.kind} '{name}' registered twice: by {self._origins[name]} and by "
                    f"{origin} (rename one)"
                )
            if self.check is not None:
                self.check(name, cls)
            cls.registry_name = name  # type: ignore[attr-defined]
            cls.description = description  # type: ignore[attr-defined]
            if not hasattr(cls, "Params"):
                cls.Params = NoParams  # type: ignore[attr-defined]
            self._entries[name] = cls  # type: ignore[assignment]
            self._origins[name] = origin
            return cls

        return decorate

    def _origin_of(self, cls: type) -> str:
        """flowerbed's own package first: a built-in imported while a plugin loads (the plugin
        asked for its name) is still flowerbed's, not the plugin's."""
        if any(cls.__module__.startswith(f"{p}.") or cls.__module__ == p for p in self._packages):
            return BUILTIN
        loading_origin = _LOADING.get()
        if loading_origin is not None:
            return loading_origin
        return f"module {cls.__module__}"

    def origin(self, name: str) -> str:
        """Where ``name`` came from: ``flowerbed``, ``PACKAGE VERSION (entry point)``,
        ``plugin SPEC`` (a config's ``plugins``) or ``module NAME`` (imported by the caller)."""
        self.get(name)
        return self._origins[name]

    def is_builtin(self, name: str) -> bool:
        return self.origin(name) == BUILTIN

    # ---- discovery --------------------------------------------------------------------------

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for package_name in self._packages:
            package = importlib.import_module(package_name)
            for module in pkgutil.iter_modules(package.__path__):
                if not module.name.startswith("_"):
                    importlib.import_module(f"{package_name}.{module.name}")
        for point in self._entry_points():
            self._load_entry_point(point)

    def _entry_points(self, name: str | None = None) -> list[metadata.EntryPoint]:
        points = metadata.entry_points(group=self.group)
        unique = {(p.name, p.value): p for p in points if name is None or p.name == name}
        return list(unique.values())

    def _load_entry_point(self, point: metadata.EntryPoint) -> None:
        key = (point.name, point.value)
        if key in self._loaded_points:
            return
        self._loaded_points.add(key)
        dist = point.dist
        package = f"{dist.name} {dist.version}" if dist is not None else "an installed package"
        where = f"entry point '{point.name} = {point.value}' ({self.group}) of {package}"
        with loading(f"{package} (entry point)"):
            try:
                point.load()
            except (ImportError, AttributeError, SyntaxError) as exc:
                raise ConfigError(f"{where} failed to load: {type(exc).__name__}: {exc}") from None
        if point.name not in self._entries:
            raise ConfigError(
                f"{where} registers no {self.kind} '{point.name}' (decorate its class with "
                f"@<registry>.register('{point.name}', ...), the entry point's name)"
            )

    def _import_named(self, name: str) -> None:
        """Import flowerbed's module named like ``name`` if one exists (cheap path of :meth:`get`)."""
        module = name.replace("-", "_")
        for package_name in self._packages:
            package = importlib.import_module(package_name)
            if any(m.name == module for m in pkgutil.iter_modules(package.__path__)):
                importlib.import_module(f"{package_name}.{module}")

    # ---- lookup -----------------------------------------------------------------------------

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._entries)

    def items(self) -> list[tuple[str, type[T]]]:
        self._discover()
        return sorted(self._entries.items())

    def get(self, name: str) -> type[T]:
        if name not in self._entries and not self._discovered:
            self._import_named(name)
        if name not in self._entries:
            for point in self._entry_points(name):
                self._load_entry_point(point)
        if name not in self._entries:
            self._discover()
        if name not in self._entries:
            raise ConfigError(
                f"unknown {self.kind} '{name}' (allowed: {', '.join(self.names()) or 'none'})"
            )
        return self._entries[name]

    def __contains__(self, name: str) -> bool:
        self._discover()
        return name in self._entries
