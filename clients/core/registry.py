"""Named registries for every pluggable kind (workloads, datasets, strategies, attacks, defenses).

Registering a method is one decorated class in one module; the registry imports the modules of its
package on first lookup, so no central list has to be edited when a method is added. A lookup by
name first tries the module named like the entry (``tabular-mlp`` -> ``tabular_mlp``), so a process
that needs one method (a ClientApp) imports only that method's module.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from typing import TypeVar

from flowerbed.clients.core.errors import ConfigError

T = TypeVar("T")


@dataclasses.dataclass
class NoParams:
    """Parameter schema of a component that takes no parameters."""


class Registry:
    """Maps a name to a class with a one-line description and a typed ``Params`` dataclass."""

    def __init__(self, kind: str, packages: tuple[str, ...]) -> None:
        self.kind = kind
        self._packages = packages
        self._entries: dict[str, type] = {}
        self._discovered = False

    def register(self, name: str, description: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: ``@WORKLOADS.register("tabular-mlp", "MLP classifier on a table")``."""

        def decorate(cls: type[T]) -> type[T]:
            if name in self._entries and self._entries[name] is not cls:
                raise RuntimeError(f"{self.kind} '{name}' registered twice")
            cls.registry_name = name  # type: ignore[attr-defined]
            cls.description = description  # type: ignore[attr-defined]
            if not hasattr(cls, "Params"):
                cls.Params = NoParams  # type: ignore[attr-defined]
            self._entries[name] = cls
            return cls

        return decorate

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for package_name in self._packages:
            package = importlib.import_module(package_name)
            for module in pkgutil.iter_modules(package.__path__):
                if not module.name.startswith("_"):
                    importlib.import_module(f"{package_name}.{module.name}")

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._entries)

    def items(self) -> list[tuple[str, type]]:
        self._discover()
        return sorted(self._entries.items())

    def _import_named(self, name: str) -> None:
        """Import the module named like ``name`` if one exists (cheap path of :meth:`get`)."""
        module = name.replace("-", "_")
        for package_name in self._packages:
            package = importlib.import_module(package_name)
            if any(m.name == module for m in pkgutil.iter_modules(package.__path__)):
                importlib.import_module(f"{package_name}.{module}")

    def get(self, name: str) -> type:
        if name not in self._entries and not self._discovered:
            self._import_named(name)
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
