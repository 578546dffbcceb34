"""The experiment is typed up to where it leaves a process (issue 52): framework code reads
``experiment.clients.num``, never ``cfg["clients"]["num"]``.

:func:`config_reads` finds string-keyed reads (``x["k"]``, ``x.get("k")``, ``.pop``,
``.setdefault``) of an experiment config whatever the variable is called, by the schema's own keys
(``ExperimentConfig`` and its sections):

- a top-level key (``x["seed"]``) of an object read in that function with no key the schema
  lacks (a run's summary has ``rounds`` and ``seed``, and ``wall_s``: not a config);
- a chain into a section (``x["clients"]["num"]``, ``x.get("output", {}).get("dir")``);
- a name bound to a section (``clients = x["clients"]`` then ``clients["num"]``).

:data:`BOUNDARY` lists the modules allowed to read by string (where a dict comes from or goes to
a file, Flower's run config or Ray) and how often.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from collections import defaultdict
from pathlib import Path

from flowerbed.clients.core.config import ExperimentConfig

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("apps", "server", "strategies", "attacks", "clients")

#: module -> (string reads allowed, why): the serialisation boundary, at most 10 reads in all
BOUNDARY: dict[str, tuple[int, str]] = {
    "clients/core/config.py": (3, "a preset's or YAML file's raw keys: its name, description"),
    "clients/core/files.py": (2, "the experiment's dict as it travels to Ray (plugin files)"),
    "clients/datasets/__init__.py": (1, "the dataset section in a table cache key's JSON"),
    "server/sweep.py": (1, "a sweep file's grid value for defenses (raw overrides)"),
    "server/runner.py": (1, "a finished run's config.yaml: its plugins, before it is typed"),
    "server/defense_axes.py": (2, "a sweep file's raw overrides and base: an arm's strategy"),
}
LIMIT = 10


def schema_keys() -> dict[str, frozenset[str]]:
    """The field names of each part of the experiment schema: ``""`` the top level, else the
    section's key (``clients``, ``resources``, ``workload``, ``defenses``, ...)."""
    out: dict[str, frozenset[str]] = {}

    def walk(cls: type, key: str) -> None:
        hints = typing.get_type_hints(cls)
        out[key] = frozenset(f.name for f in dataclasses.fields(cls))
        for f in dataclasses.fields(cls):
            args = typing.get_args(hints[f.name])
            inner = args[0] if typing.get_origin(hints[f.name]) is list and args else hints[f.name]
            if dataclasses.is_dataclass(inner):
                walk(inner, f.name)  # type: ignore[arg-type]

    walk(ExperimentConfig, "")
    return out


KEYS = schema_keys()
TOP = KEYS[""]
SECTIONS = {name: fields for name, fields in KEYS.items() if name}


def _read(node: ast.AST) -> tuple[ast.expr, str] | None:
    """``(owner, key)`` of ``owner["key"]`` (a load) or ``owner.get("key", ...)``, else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            return node.value, node.slice.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        first = node.args[0]
        if node.func.attr in ("get", "pop", "setdefault") and isinstance(first, ast.Constant):
            if isinstance(first.value, str):
                return node.func.value, first.value
    return None


#: subscripts that only a table or an array takes (``df[df["attack"] == "x"]``, ``a[1:]``, ``a[[0, 2]]``)
NOT_A_KEY = (ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.List, ast.Slice, ast.Tuple)


def _scope_reads(scope: ast.AST) -> tuple[list[tuple[ast.AST, ast.expr, str]], dict[str, frozenset[str]], set[str]]:  # fmt: skip
    """The string reads directly in ``scope`` (not in nested functions or classes), the names it
    binds to a section read (``clients = x["clients"]``) and the objects it indexes as a table or
    an array (a DataFrame's ``df["attack"]`` is not a config's)."""
    reads: list[tuple[ast.AST, ast.expr, str]] = []
    bound: dict[str, frozenset[str]] = {}
    tables: set[str] = set()
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, nested):
            continue
        found = _read(node)
        if found is not None:
            reads.append((node, *found))
        if isinstance(node, ast.Subscript) and isinstance(node.slice, NOT_A_KEY):
            tables.add(ast.unparse(node.value))
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], _read(node.value)
            if isinstance(target, ast.Name) and value is not None and value[1] in SECTIONS:
                bound[target.id] = SECTIONS[value[1]]
        stack.extend(ast.iter_child_nodes(node))
    return reads, bound, tables


def config_reads(source: str) -> list[int]:
    """The line of each read of an experiment config by string in ``source`` (see the module
    docstring); a line with two reads is listed twice."""
    tree = ast.parse(source)
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))]  # fmt: skip
    lines = []
    for scope in scopes:
        reads, bound, tables = _scope_reads(scope)
        keys: dict[str, set[str]] = defaultdict(set)
        for _, owner, key in reads:
            keys[ast.unparse(owner)].add(key)
        for node, owner, key in reads:
            inner, read = _read(owner), keys[ast.unparse(owner)]
            if ast.unparse(owner) in tables:
                continue
            if (
                (key in TOP and read <= TOP)
                or (inner is not None and key in SECTIONS.get(inner[1], ()))
                or (isinstance(owner, ast.Name) and key in bound.get(owner.id, ()))
            ):
                lines.append(node.lineno)  # type: ignore[attr-defined]
    return sorted(lines)


def test_the_scan_finds_config_reads_under_any_name() -> None:
    assert config_reads("def f(run):\n    return run['seed'] + run['rounds']\n") == [2, 2]
    assert config_reads("def f(spec):\n    return spec['clients']['num']\n") == [2, 2]
    assert config_reads("def f(e):\n    return e.get('output', {}).get('dir')\n") == [2, 2]
    assert config_reads("def f(e):\n    c = e['clients']\n    return c['fraction']\n") == [2, 3]
    assert config_reads("def f(e):\n    return e.seed + e.clients.num\n") == []
    assert config_reads("def f(written):\n    return written.get('plugins', [])\n") == [2]
    # keys outside the schema tell another record (counts, a cell's row, a run's summary)
    assert config_reads("def f(c):\n    return c['malicious'] + c['honest']\n") == []
    assert config_reads("def f(row):\n    return row['metrics']['x'], row['id']\n") == []
    assert config_reads("def f(s):\n    return s['seed'], s['rounds'], s['wall_s']\n") == []
    assert config_reads("def f(df):\n    return df[df['attack'] == 'goliath']\n") == []


def framework_reads() -> dict[str, list[int]]:
    """``{module: lines}`` of every module of flowerbed's five packages that reads a config by
    string."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = config_reads(path.read_text())
            if lines:
                found[str(path.relative_to(ROOT))] = lines
    return found


def test_the_framework_reads_the_experiment_by_string_only_at_the_boundary() -> None:
    found = framework_reads()
    outside = {module: lines for module, lines in found.items() if module not in BOUNDARY}
    assert not outside, f"read the typed experiment's attributes instead: {outside}"
    over = {m: len(lines) for m, lines in found.items() if len(lines) > BOUNDARY[m][0]}
    assert not over, over
    assert sum(allowed for allowed, _ in BOUNDARY.values()) <= LIMIT
