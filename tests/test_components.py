"""House rules every component keeps (issue 37): typed inputs, no name tests, no import cycles.

- No registered component's module reads the experiment config: every entry of every registry
  (workloads, attacks, defenses, strategies; built-in ones) lives in a module without a
  ``cfg[...]`` subscript, a ``cfg.get`` or a ``.cfg`` attribute. Components get their ``Params``
  and a typed context; the factories that read a config (``build_workload``, ``build_defenses``,
  ``strategies.context``, the runner) live in modules that register nothing.
- Every kind of component (a field of ``Components``: workloads, datasets, strategies, attacks,
  defenses, malicious clients) has one base class, every built-in entry subclasses it, and its
  constructor is ``(self, params, ctx)``: the typed ``Params`` and the kind's context.
- No attack or strategy tests a defense's or a workload's name (``if defense == "topk"``,
  ``name in ("tabdiff", ...)``): what a component may rely on is a declared capability
  (``needs``) or a published mechanism, never which other component is running.
- No import cycle between flowerbed's modules, function-level imports included (grimp reads every
  import statement): a package importing its own submodules is not a cycle.
- No module in apps/ or server/ over ``MAX_LINES`` lines (issue 52): a longer one hides several
  responsibilities; split it by responsibility.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import grimp

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.common import Attack, AttackContext
from flowerbed.clients.core.config import Components
from flowerbed.clients.datasets import DATASETS, Dataset, DatasetContext
from flowerbed.clients.defenses import DEFENSES, Defense, DefenseContext
from flowerbed.clients.malicious import MALICIOUS, Malicious, MaliciousContext
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyContext, StrategyEntry

ROOT = Path(__file__).resolve().parents[1]
ROOTS = [f"flowerbed.{top}" for top in ("apps", "server", "strategies", "attacks", "clients")]
REGISTRIES = {"workload": WORKLOADS, "attack": ATTACKS, "defense": DEFENSES, "strategy": STRATEGIES,
              "dataset": DATASETS, "malicious": MALICIOUS}  # fmt: skip
#: each kind (a field of ``Components``): its registry, its base class and its context
KINDS = {
    "workloads": (WORKLOADS, Workload, WorkloadContext),
    "datasets": (DATASETS, Dataset, DatasetContext),
    "strategies": (STRATEGIES, StrategyEntry, StrategyContext),
    "attacks": (ATTACKS, Attack, AttackContext),
    "defenses": (DEFENSES, Defense, DefenseContext),
    "malicious": (MALICIOUS, Malicious, MaliciousContext),
}


def config_reads(source: str) -> list[int]:
    """Lines of ``source`` that read a config dict: ``cfg[...]``, ``cfg.get(...)``, ``x.cfg``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            if node.value.id in ("cfg", "config_dict"):
                lines.append(node.lineno)
        elif isinstance(node, ast.Attribute):
            if node.attr == "cfg" or (
                isinstance(node.value, ast.Name) and node.value.id == "cfg" and node.attr == "get"
            ):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_the_scan_finds_config_reads() -> None:
    assert config_reads("def f(cfg):\n    return cfg['seed']\n") == [2]
    assert config_reads("class A:\n    def f(self):\n        return self.cfg\n") == [3]
    assert config_reads("def f(cfg):\n    return cfg.get('seed')\n") == [2]
    assert config_reads("def f(ctx):\n    return ctx.seed\n") == []


def test_no_registered_component_reads_the_experiment_config() -> None:
    offending = {}
    for kind, registry in REGISTRIES.items():
        for name in registry.names():
            if not registry.is_builtin(name):
                continue  # outside code (a test's plug-in) is its author's
            path = Path(inspect.getsourcefile(registry.get(name)))
            lines = config_reads(path.read_text())
            if lines:
                offending[f"{kind} {name} ({path.name})"] = lines
    assert not offending, offending


def test_every_kind_has_one_base_with_one_constructor_signature() -> None:
    assert set(KINDS) == {f.name for f in dataclasses.fields(Components)}, "a kind without a base"
    offending = []
    for kind, (registry, base, context) in KINDS.items():
        assert list(inspect.signature(base.__init__).parameters) == ["self", "params", "ctx"], kind
        declared = getattr(base, "Context", None) or typing.get_type_hints(base.__init__)["ctx"]
        assert declared is context, kind
        for name, cls in registry.items():
            if not registry.is_builtin(name):
                continue  # outside code (a test's plug-in) is its author's
            if not issubclass(cls, base):
                offending.append(f"{kind} {name}: not a {base.__name__}")
            elif list(inspect.signature(cls.__init__).parameters) != ["self", "params", "ctx"]:
                offending.append(f"{kind} {name}: __init__{inspect.signature(cls.__init__)}")
    assert not offending, offending


def compared_names(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` for each string constant in ``names`` that a comparison tests in
    ``source`` (``==``, ``!=``, ``in``; alone or in a tuple, list or set literal)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                for item in items:
                    if isinstance(item, ast.Constant) and item.value in names:
                        hits.append((node.lineno, item.value))
    return hits


def test_the_name_scan_finds_comparisons() -> None:
    names = {"topk", "tabdiff"}
    assert compared_names("if d == 'topk':\n    pass\n", names) == [(1, "topk")]
    assert compared_names("ok = w not in ('tabdiff', 'x')\n", names) == [(1, "tabdiff")]
    assert compared_names("ok = w == 'other'\nlabel = 'topk'\n", names) == []


def test_no_attack_or_strategy_tests_a_defense_or_workload_name() -> None:
    names = set(DEFENSES.names()) | set(WORKLOADS.names())
    offending = {}
    for folder in ("attacks", "strategies"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            hits = compared_names(path.read_text(), names)
            if hits:
                offending[str(path.relative_to(ROOT))] = hits
    assert not offending, offending


def test_no_import_cycle_between_flowerbed_modules() -> None:
    # the five subpackages, as import-linter reads them (``flowerbed`` itself is a namespace
    # package that an editable install maps through a finder: grimp would see no module in it)
    graph = grimp.build_graph(*ROOTS, include_external_packages=False)
    files = [f for top in ROOTS for f in (ROOT / top.split(".")[1]).rglob("*.py")]
    assert len(graph.modules) == len(files), "grimp did not read every module of flowerbed"
    edges = {
        module: {
            imported
            for imported in graph.find_modules_directly_imported_by(module)
            if not imported.startswith(module + ".") and not module.startswith(imported + ".")
        }
        for module in graph.modules
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in sorted(edges.get(module, ())):
            if state.get(imported) == 1:
                cycles.append(path[path.index(imported) :] + [module, imported])
            elif imported not in state:
                visit(imported, [*path, module])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [])
    assert not cycles, [" -> ".join(c) for c in cycles[:5]]


MAX_LINES = 450


def test_no_module_in_apps_or_server_is_over_max_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for top in ("apps", "server")
        for path in (ROOT / top).rglob("*.py")
    }
    assert len(sizes) > 40, "the scan found too few modules"
    too_long = {path: lines for path, lines in sizes.items() if lines > MAX_LINES}
    assert not too_long, f"split by responsibility (<= {MAX_LINES} lines): {too_long}"
