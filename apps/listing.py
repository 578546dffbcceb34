"""``flowerbed list``: what can be run and what is registered.

Without a kind it is compact: one line per kind (its names), the hint for more once at the end.
``flowerbed list KIND`` (or ``--long``) gives the tables: each entry's description, the workloads
it runs on, and for an entry from outside flowerbed its origin. ``--plugin FILE`` (or a module
name) imports a config's plug-in first, so its entries are listed like an installed package's.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Protocol

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from flowerbed.clients.core.registry import Registry
    from flowerbed.clients.workloads import Workload

KINDS = (
    "experiments", "sweeps", "workloads", "strategies", "attacks", "malicious", "defenses",
    "datasets", "engines",
)  # fmt: skip
#: kinds listed with the workloads they run on
ATTACHED = ("attacks", "malicious", "defenses", "strategies")
ORIGIN_NOTE = "entries marked 'from: ...' come from outside flowerbed (their origin)"


def sweep_presets() -> dict[str, str]:
    """``{name: the first sentence of its header comment}`` of every preset in configs/sweeps."""
    from flowerbed.clients.core.config import configs_dir

    presets = {}
    for path in sorted((configs_dir() / "sweeps").glob("*.yaml")):
        header = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            header.append(line.lstrip("# ").strip())
        presets[path.stem] = re.split(r"(?<=\.)\s", " ".join(header), maxsplit=1)[0]
    return presets


def preset_table() -> str:
    """The experiment presets as a Markdown table (the README's table is this, checked by a test)."""
    from flowerbed.clients.core.config import preset_description, preset_names

    rows = [f"| `{name}` | {preset_description(name)} |" for name in preset_names()]
    return "\n".join(["| preset | what it runs |", "|---|---|", *rows]) + "\n"


def entries(kind: str) -> list[tuple[str, str, list[str]]]:
    """``(name, description, [runs on])`` of every entry of ``kind``."""
    from flowerbed.apps.engines import ENGINES
    from flowerbed.clients.core.config import preset_description, preset_names
    from flowerbed.server.experiment import COMPONENTS

    if kind == "experiments":
        return [(p, preset_description(p), []) for p in preset_names()]
    if kind == "sweeps":
        return [(name, text, []) for name, text in sweep_presets().items()]
    if kind == "engines":
        return [(name, help_text, []) for name, (_, _, help_text) in ENGINES.items()]
    registry = getattr(COMPONENTS, kind)
    return [
        (name, _described(registry, name, cls),
         [_runs_on(cls, COMPONENTS.workloads)] if kind in ATTACHED else [])
        for name, cls in registry.items()
    ]  # fmt: skip


def load_listed_plugins(specs: list[str]) -> None:
    """Import plug-ins named on the command line (files or modules), as a config's would be."""
    from flowerbed.clients.core.plugins import load_plugins, normalise

    load_plugins(normalise(specs))


def compact(kinds: tuple[str, ...]) -> RenderableType:
    """One line per kind, its names (outside entries marked ``*``), and the hint once."""
    lines: list[RenderableType] = []
    outside = False
    for kind in kinds:
        names = []
        for name, description, _ in entries(kind):
            marked = "(from: " in description
            outside |= marked
            names.append(f"{name}*" if marked else name)
        line = Text.assemble((f"{kind} ({len(names)}): ", "bold"), ", ".join(names))
        lines.append(line)
    hint = "flowerbed list KIND: descriptions and what each runs on; --long: every kind"
    if outside:
        hint += "; * = from outside flowerbed"
    return Group(*lines, Text(hint, style="dim"))


def tables(kinds: tuple[str, ...]) -> RenderableType:
    """A table per kind; the note on origins once, under the last table that has one."""
    shown: list[RenderableType] = []
    for kind in kinds:
        table = Table(title=kind, show_header=False, title_justify="left")
        for name, description, runs_on in entries(kind):
            table.add_row(name, description, *runs_on)
        shown.append(table)
    if any(k not in ("experiments", "sweeps", "engines") for k in kinds):
        shown.append(Text(ORIGIN_NOTE, style="dim"))
    return Group(*shown)


class _Described(Protocol):
    """A registered class: ``Registry.register`` sets its one-line description."""

    description: str


class _Origins(Protocol):
    """A registry: where each of its entries comes from (``Registry.origin``)."""

    def origin(self, name: str) -> str: ...


def _described(registry: _Origins, entry: str, cls: _Described) -> str:
    """The description, and for an entry from outside flowerbed where it comes from."""
    from flowerbed.clients.core.registry import BUILTIN

    origin = registry.origin(entry)
    return cls.description if origin == BUILTIN else f"{cls.description} (from: {origin})"


def _runs_on(cls: type, workloads: Registry[Workload]) -> str:
    """``on: tabdiff, tabular-mlp`` (the workloads whose offers fit ``cls.needs``)."""
    from flowerbed.clients.core.capabilities import RUN_OFFERS, alternatives, supported_workloads

    needs = getattr(cls, "needs", ())
    if not any(alt - RUN_OFFERS for alt in alternatives(needs)):  # individual-updates: any workload
        return "on: any workload"
    return "on: " + (", ".join(supported_workloads(needs, workloads.items())) or "none")
