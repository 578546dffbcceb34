"""Offline data for Federated Concept-based Models: a registry of concept tasks and
label-availability scenarios.

Built-in tasks: XOR, Trig and Dot follow the Concept Embedding Models definitions (Espinosa
Zarlenga et al., 2022); Dot draws its two vectors independently (one library's generator re-seeds
and makes them equal, which leaves y constant). Digits-addition pairs scikit-learn's bundled 8x8
digits. Any other task is a mapping (``workload.params.task``, YAML): concepts as formulas over
Gaussian inputs and earlier concepts (a DAG), the task as a formula over the concepts;
``random_dag_task`` generates one. A ``Scenario`` says which concepts each client holds labels for
and from which round (built-in patterns, or an explicit ``schedule``), so concepts can appear
mid-run and every client can lack some.
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
from sklearn.datasets import load_digits

from flowerbed.clients.core.errors import ConfigError

SCENARIOS = ("full", "partial", "evolving", "central", "schedule")


@dataclass
class ConceptData:
    """Inputs ``x`` [n, d], binary concept labels ``c`` [n, K] and task labels ``y`` [n]."""

    x: np.ndarray
    c: np.ndarray
    y: np.ndarray
    concept_names: tuple[str, ...]
    n_classes: int


def _xor(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = rng.uniform(0.0, 1.0, size=(n, 2))
    c = (x > 0.5).astype(np.float32)
    y = np.logical_xor(c[:, 0], c[:, 1]).astype(np.int64)
    return x, c, y


def _trig(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b, z = (rng.normal(0.0, 2.0, size=n) for _ in range(3))
    x = np.stack(
        [np.sin(a) + a, np.cos(a) + a, np.sin(b) + b, np.cos(b) + b, np.sin(z) + z,
         np.cos(z) + z, a**2 + b**2 + z**2],
        axis=1,
    )  # fmt: skip
    c = np.stack([a > 0, b > 0, z > 0], axis=1).astype(np.float32)
    y = (a + b + z > 1).astype(np.int64)
    return x, c, y


def _dot(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    v1 = rng.normal(0.0, 2.0, size=(n, 2))
    v3 = rng.normal(0.0, 2.0, size=(n, 2))  # independent of v1 (the broken generator re-seeds)
    v2, v4 = np.array([1.0, 1.0]), np.array([-1.0, -1.0])
    x = np.concatenate([v1 + v3, v1 - v3], axis=1)
    c = np.stack([v1 @ v2 > 0, v3 @ v4 > 0], axis=1).astype(np.float32)
    y = ((v1 * v3).sum(1) > 0).astype(np.int64)
    return x, c, y


@functools.lru_cache(maxsize=4)
def _digit_pools(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    cut = int(0.7 * len(order))
    x = (digits.data / 16.0).astype(np.float32)
    return x[order[:cut]], digits.target[order[:cut]], x[order[cut:]], digits.target[order[cut:]]


def _digits(n: int, rng: np.random.Generator, pool_seed: int, split: str):  # noqa: ANN202
    x_tr, y_tr, x_te, y_te = _digit_pools(pool_seed)
    x_pool, y_pool = (x_tr, y_tr) if split == "train" else (x_te, y_te)
    i, j = rng.integers(0, len(y_pool), size=(2, n))
    x = np.concatenate([x_pool[i], x_pool[j]], axis=1)
    bits = [(y_pool[i] >> b) & 1 for b in range(4)] + [(y_pool[j] >> b) & 1 for b in range(4)]
    c = np.stack(bits, axis=1).astype(np.float32)
    y = (y_pool[i] + y_pool[j]).astype(np.int64)
    return x, c, y


# -- concept tasks: a registry of built-in tasks and tasks defined by formulas (YAML) -------------


@dataclass(frozen=True)
class ConceptTask:
    """A concept task: ``sample(n, rng, split) -> (x, c, y)`` with named binary concepts."""

    name: str
    concept_names: tuple[str, ...]
    n_classes: int
    sample: Callable[[int, np.random.Generator, str], tuple[np.ndarray, np.ndarray, np.ndarray]]


TASKS: dict[str, ConceptTask] = {}


def register_task(task: ConceptTask) -> ConceptTask:
    """Add a built-in task (``workload.params.data=<name>``)."""
    if task.name in TASKS:
        raise RuntimeError(f"concept task '{task.name}' registered twice")
    TASKS[task.name] = task
    return task


register_task(ConceptTask("xor", ("x1_high", "x2_high"), 2, lambda n, rng, split: _xor(n, rng)))
register_task(ConceptTask("trig", ("a_pos", "b_pos", "z_pos"), 2, lambda n, rng, s: _trig(n, rng)))
register_task(ConceptTask("dot", ("v1_pos", "v3_neg"), 2, lambda n, rng, split: _dot(n, rng)))
register_task(
    ConceptTask(
        "digits",
        tuple(f"{op}_bit{b}" for op in "ab" for b in range(4)),
        19,
        lambda n, rng, split: _digits(n, rng, pool_seed=0, split=split),
    )
)

#: functions a formula may call (numpy, elementwise)
FORMULA_FUNCTIONS: dict[str, Callable[..., np.ndarray]] = {
    "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "exp": np.exp, "log": np.log,
    "sqrt": np.sqrt, "abs": np.abs, "where": np.where, "maximum": np.maximum,
    "minimum": np.minimum,
}  # fmt: skip
_BINARY = {
    ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.divide,
    ast.Pow: np.power, ast.Mod: np.mod, ast.BitAnd: np.logical_and, ast.BitOr: np.logical_or,
    ast.BitXor: np.logical_xor,
}  # fmt: skip
_COMPARE = {
    ast.Gt: np.greater, ast.GtE: np.greater_equal, ast.Lt: np.less, ast.LtE: np.less_equal,
    ast.Eq: np.equal, ast.NotEq: np.not_equal,
}  # fmt: skip


def evaluate_formula(formula: str, names: dict[str, np.ndarray], where: str) -> np.ndarray:
    """Evaluate an arithmetic / comparison / boolean expression over named arrays.

    Allowed: numbers, the names given, + - * / ** %, comparisons, ``and or not & | ^ ~`` (logical
    on arrays) and the functions in ``FORMULA_FUNCTIONS``; anything else is a ConfigError."""
    try:
        tree = ast.parse(str(formula), mode="eval")
    except SyntaxError as exc:
        raise ConfigError(f"{where}: cannot parse formula '{formula}' ({exc.msg})") from None

    def ev(node: ast.AST) -> Any:  # noqa: PLR0911 - one case per node type
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ConfigError(
                    f"{where}: unknown name '{node.id}' in '{formula}' "
                    f"(allowed: {', '.join(names)})"
                )
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = ev(node.left), ev(node.right)
            if type(node.op) not in (ast.BitAnd, ast.BitOr, ast.BitXor):  # arithmetic: 0/1
                left, right = (np.asarray(v) * 1 for v in (left, right))
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            value = ev(node.operand)
            if isinstance(node.op, ast.Not | ast.Invert):
                return np.logical_not(value)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BoolOp):
            combine = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
            out = ev(node.values[0])
            for value in node.values[1:]:
                out = combine(out, ev(value))
            return out
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            left, out = ev(node.left), True
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                right = ev(right_node)
                out = np.logical_and(out, _COMPARE[type(op)](left, right))
                left = right
            return out
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORMULA_FUNCTIONS
            and not node.keywords
        ):
            return FORMULA_FUNCTIONS[node.func.id](*(ev(a) for a in node.args))
        raise ConfigError(
            f"{where}: '{ast.unparse(node)}' is not allowed in a formula (allowed: numbers, "
            f"names, + - * / ** %, comparisons, and/or/not, & | ^ ~, "
            f"{', '.join(FORMULA_FUNCTIONS)})"
        )

    return np.asarray(ev(tree))


class TaskSpec(TypedDict, total=False):
    """A formula task as the generators write it (``formula_task`` reads the same keys from a
    user's YAML)."""

    name: str
    inputs: int
    concepts: dict[str, str]
    task: str
    classes: int


class Holding(TypedDict):
    """One concept's entry of a schedule: the clients holding its labels and its first round."""

    clients: list[int]
    round: int


def formula_task(spec: Mapping[str, Any]) -> ConceptTask:
    """A task from a mapping (``workload.params.task``)::

        name: dag6                  # optional
        inputs: 8                   # x ~ N(0, I) of this dimension, named x0 .. x7
        concepts:                   # in order; each over the inputs and earlier concepts
          c0: "x0 + 0.5 * x3 > 0"
          c1: "c0 & (x2 > 0.3)"
        task: "c0 ^ c1"             # over the concepts (and inputs); bool, or int with classes
        classes: 2                  # optional for a boolean task

    Concepts are functions of the inputs (parents named in a formula make a DAG); the task is a
    formula over the concepts."""
    allowed = {"name", "inputs", "concepts", "task", "classes"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ConfigError(
            f"workload.params.task: unknown key '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})"
        )
    for key in ("inputs", "concepts", "task"):
        if key not in spec:
            raise ConfigError(f"workload.params.task needs '{key}' (see docs/fcm.md)")
    inputs = int(spec["inputs"])
    concepts = dict(spec["concepts"])
    if inputs < 1 or not concepts:
        raise ConfigError("workload.params.task needs inputs >= 1 and at least one concept")
    bad = [c for c in concepts if not str(c).isidentifier() or str(c).startswith("x")]
    if bad:
        raise ConfigError(
            f"workload.params.task: concept name '{bad[0]}' must be an identifier not starting "
            "with 'x' (x0, x1, ... name the inputs)"
        )
    names = tuple(str(c) for c in concepts)
    classes = spec.get("classes")

    def sample(n: int, rng: np.random.Generator, split: str) -> tuple:
        x = rng.normal(size=(n, inputs))
        scope: dict[str, np.ndarray] = {f"x{i}": x[:, i] for i in range(inputs)}
        cols = []
        for name in names:
            value = np.broadcast_to(
                evaluate_formula(concepts[name], scope, f"task.concepts.{name}"), (n,)
            )
            scope[name] = value.astype(bool)
            cols.append(scope[name])
        y = np.broadcast_to(evaluate_formula(spec["task"], scope, "task.task"), (n,))
        y = y.astype(np.int64)
        n_classes = int(classes) if classes is not None else 2
        if y.min() < 0 or y.max() >= n_classes:
            raise ConfigError(
                f"workload.params.task.task gives classes {y.min()}..{y.max()}, outside "
                f"0..{n_classes - 1} (set task.classes)"
            )
        return x.astype(np.float32), np.stack(cols, axis=1).astype(np.float32), y

    n_classes = int(classes) if classes is not None else 2
    task = ConceptTask(str(spec.get("name", "formula")), names, n_classes, sample)
    sample(4, np.random.default_rng(0), "train")  # validate every formula now (one-line errors)
    return task


def random_dag_task(
    seed: int,
    concepts: int = 6,
    inputs: int = 8,
    name: str | None = None,
    parents: int = 2,
    task_kind: str = "logic",
) -> TaskSpec:
    """A generated task spec (for ``workload.params.task``): concepts in a random DAG, each a
    threshold of a random linear form of 2-3 inputs, combined with 0-``parents`` earlier concepts
    by and/or/xor (more parents: deeper DAGs); the task over 3-4 concepts is ``logic`` (an
    and/or/xor formula), ``count`` (how many are present, an integer task) or ``vote`` (a signed,
    weighted vote of concepts against a threshold). Redrawn until every concept is balanced
    (positive rate within [0.2, 0.8] on 4000 samples) and so is the task (binary: same range;
    ``count``: no class above 0.8)."""
    if task_kind not in TASK_KINDS:
        raise ConfigError(f"unknown task kind '{task_kind}' (allowed: {', '.join(TASK_KINDS)})")
    rng = np.random.default_rng([seed, 4242])
    for _ in range(200):
        spec: TaskSpec = {"name": name or f"dag{concepts}-{seed}", "inputs": inputs}
        formulas: dict[str, str] = {}
        for j in range(concepts):
            cols = rng.choice(inputs, size=int(rng.integers(2, 4)), replace=False)
            terms = " + ".join(f"{rng.normal():.2f} * x{c}" for c in cols)
            form = f"({terms} > {0.3 * rng.normal():.2f})"
            chosen: np.ndarray | list[int] = (
                rng.choice(j, size=min(j, int(rng.integers(0, parents + 1))), replace=False)
                if j
                else []
            )
            for p in chosen:
                form = f"({form} {rng.choice(['&', '|', '^'])} c{p})"
            formulas[f"c{j}"] = form
        spec["concepts"] = formulas
        used = rng.choice(concepts, size=min(concepts, int(rng.integers(3, 5))), replace=False)
        if task_kind == "logic":
            task = f"c{used[0]}"
            for c in used[1:]:
                task = f"({task} {rng.choice(['&', '|', '^'])} c{c})"
        elif task_kind == "count":
            task = " + ".join(f"c{c}" for c in used)
            spec["classes"] = len(used) + 1
        else:  # vote: signed weights, threshold near the middle of the vote's range
            weights = rng.choice([-1, 1], size=len(used)) * rng.uniform(0.5, 1.5, size=len(used))
            votes = " + ".join(f"{w:.2f} * c{c}" for w, c in zip(weights, used, strict=True))
            task = f"({votes} > {weights[weights < 0].sum() + 0.5 * np.abs(weights).sum():.2f})"
        spec["task"] = task
        x, c, y = formula_task(spec).sample(4000, np.random.default_rng(seed), "train")
        rates = c.mean(0)
        if task_kind == "count":
            balanced = np.bincount(y).max() / len(y) <= 0.8
        else:
            balanced = 0.2 < y.mean() < 0.8
        if balanced and ((rates > 0.2) & (rates < 0.8)).all():
            return spec
    raise RuntimeError("no balanced random DAG task found")


TASK_KINDS = ("logic", "count", "vote")


def random_schedule(
    seed: int, concept_names: tuple[str, ...], num_clients: int, last_round: int
) -> dict[str, Holding]:
    """A generated ``workload.params.schedule``: 2-3 concepts from round 1, the others arriving
    at random rounds in 2..``last_round`` (sorted, so the last one arrives at ``last_round``);
    each concept held by 1-3 clients, at least one concept by a single client, every client
    holding at least one concept that arrives at round 1 or later."""
    rng = np.random.default_rng([seed, 777])
    k = len(concept_names)
    early = min(k, int(rng.integers(2, 4)))
    late = sorted(int(r) for r in rng.integers(2, last_round + 1, size=k - early))
    if late:
        late[-1] = last_round
    rounds = [1] * early + late
    holders = [
        sorted(int(c) for c in rng.choice(num_clients, size=int(rng.integers(1, 4)), replace=False))
        for _ in range(k)
    ]
    single = int(rng.integers(k))
    holders[single] = holders[single][:1]
    for client in range(num_clients):  # nobody without labels: give it a random concept
        if not any(client in h for h in holders):
            j = int(rng.integers(k))
            holders[j] = sorted({*holders[j], client}) if j != single else holders[j]
            if j == single:
                other = (single + 1) % k
                holders[other] = sorted({*holders[other], client})
    return {
        name: {"clients": holders[j], "round": rounds[j]} for j, name in enumerate(concept_names)
    }


#: kinds of ``user_task``: what a task formula written by a user looks like
USER_KINDS = ("threshold", "count", "xor-late", "vote-late")


def user_task(
    seed: int, concepts: int = 9, inputs: int = 12, kind: str = "threshold", depth: int = 3,
    name: str | None = None,
) -> TaskSpec:  # fmt: skip
    """A generated task spec of the kind users write (issue 54), harder than ``random_dag_task``:

    - inputs shared by several concepts (each concept reads 2-3 of ``inputs`` inputs, and every
      concept after the first reuses at least one input an earlier concept read);
    - deeper DAGs: concept ``j`` combines its threshold with up to ``depth`` earlier concepts,
      one of them always the previous concept when ``j >= 2`` (chains of length ``concepts``);
    - a task over many concepts jointly, with the *last* concept (the one a schedule makes
      arrive last) in it: ``threshold`` ``(c_a + c_b + ... >= t) ^ c_last`` over 4-6 concepts,
      ``count`` the number present among 5-7 concepts (an integer task), ``xor-late`` an
      and/or formula over 3-4 concepts XOR ``c_last``, ``vote-late`` a signed weighted vote over
      4-6 concepts AND/OR/XOR ``c_last``.

    Redrawn until every concept has a positive rate in [0.2, 0.8] and the task is balanced
    (binary: rate in [0.25, 0.75]; ``count``: no class above 0.6)."""
    if kind not in USER_KINDS:
        raise ConfigError(f"unknown user task kind '{kind}' (allowed: {', '.join(USER_KINDS)})")
    rng = np.random.default_rng([seed, 5454])
    last = f"c{concepts - 1}"
    for _ in range(400):
        formulas: dict[str, str] = {}
        seen: list[int] = []
        for j in range(concepts):
            width = int(rng.integers(2, 4))
            cols = list(rng.choice(inputs, size=width, replace=False))
            if seen and not set(cols) & set(seen):  # share an input with an earlier concept
                cols[0] = int(rng.choice(seen))
                cols = list(dict.fromkeys(cols))
            seen = sorted({*seen, *(int(c) for c in cols)})
            terms = " + ".join(f"{rng.normal():.2f} * x{c}" for c in cols)
            form = f"({terms} > {0.3 * rng.normal():.2f})"
            parents: list[int] = []
            if j >= 2:
                parents.append(j - 1)
            if j:
                extra = int(rng.integers(0, depth))
                pool = [p for p in range(j) if p not in parents]
                parents += [
                    int(p) for p in rng.choice(pool, size=min(extra, len(pool)), replace=False)
                ]
            for p in parents[:depth]:
                form = f"({form} {rng.choice(['&', '|', '^'])} c{p})"
            formulas[f"c{j}"] = form
        spec: TaskSpec = {
            "name": name or f"user-{kind}-{concepts}-{seed}", "inputs": inputs, "concepts": formulas,
        }  # fmt: skip
        others = [f"c{j}" for j in range(concepts - 1)]
        if kind == "count":
            used = list(
                rng.choice(others, size=min(len(others), int(rng.integers(4, 7))), replace=False)
            )
            used.append(last)
            spec["task"] = " + ".join(str(u) for u in used)
            spec["classes"] = len(used) + 1
        elif kind == "xor-late":
            used = list(
                rng.choice(others, size=min(len(others), int(rng.integers(3, 5))), replace=False)
            )
            body = str(used[0])
            for c in used[1:]:
                body = f"({body} {rng.choice(['&', '|'])} {c})"
            spec["task"] = f"({body} ^ {last})"
        else:
            used = list(
                rng.choice(others, size=min(len(others), int(rng.integers(4, 7))), replace=False)
            )
            if kind == "threshold":
                t = int(rng.integers(2, len(used)))
                spec["task"] = f"(({' + '.join(str(u) for u in used)} >= {t}) ^ {last})"
            else:
                w = rng.choice([-1, 1], size=len(used)) * rng.uniform(0.5, 1.5, size=len(used))
                votes = " + ".join(f"{a:.2f} * {c}" for a, c in zip(w, used, strict=True))
                cut = w[w < 0].sum() + 0.5 * np.abs(w).sum()
                spec["task"] = f"(({votes} > {cut:.2f}) {rng.choice(['&', '|', '^'])} {last})"
        _, c, y = formula_task(spec).sample(4000, np.random.default_rng(seed), "train")
        rates = c.mean(0)
        if kind == "count":
            balanced = np.bincount(y).max() / len(y) <= 0.6
        else:
            balanced = 0.25 <= y.mean() <= 0.75
        if balanced and ((rates > 0.2) & (rates < 0.8)).all():
            return spec
    raise RuntimeError("no balanced user task found")


def user_schedule(
    seed: int, concept_names: tuple[str, ...], num_clients: int, last_round: int, singles: int = 2
) -> dict[str, Holding]:
    """A generated schedule for ``user_task``: 3 concepts from round 1, the others at random rounds
    in 2..``last_round`` in order, the last concept (the one the task needs) at ``last_round``;
    ``singles`` concepts held by one client (one of them arriving late), the others by 2-3
    clients; every client holds at least one concept."""
    rng = np.random.default_rng([seed, 999])
    k = len(concept_names)
    early = min(k, 3)
    late = sorted(int(r) for r in rng.integers(2, last_round + 1, size=k - early))
    if late:
        late[-1] = last_round
    rounds = [1] * early + late
    single = {int(rng.integers(early, k))} if k > early else set()
    while len(single) < min(singles, k):
        single.add(int(rng.integers(k)))
    holders = [
        [int(rng.integers(num_clients))] if j in single
        else sorted(int(c) for c in rng.choice(num_clients, size=int(rng.integers(2, 4)), replace=False))
        for j in range(k)
    ]  # fmt: skip
    for client in range(num_clients):  # nobody without labels: join a multi-holder concept
        if not any(client in h for h in holders):
            j = int(rng.choice([j for j in range(k) if j not in single]))
            holders[j] = sorted({*holders[j], client})
    return {
        name: {"clients": holders[j], "round": rounds[j]} for j, name in enumerate(concept_names)
    }


#: names of the built-in tasks
DATASETS = tuple(TASKS)


def task_problem(data: str) -> str | None:
    """The rule of ``workload.params.data``: a registered task (``None`` when it is one)."""
    return None if data in TASKS else f"unknown concept task '{data}' (allowed: {', '.join(TASKS)})"


def formula_problem(spec: Mapping[str, Any]) -> str | None:
    """The rule of ``workload.params.task``: empty, or a formula task that builds."""
    if not spec:
        return None
    try:
        formula_task(spec)
    except ConfigError as exc:
        return str(exc)
    return None


def get_task(data: str, spec: Mapping[str, Any] | None = None) -> ConceptTask:
    """The task of ``workload.params``: a formula task when ``spec`` is non-empty, else the
    built-in task named ``data``."""
    if spec:
        return formula_task(spec)
    if data not in TASKS:
        raise ConfigError(f"unknown concept task '{data}' (allowed: {', '.join(TASKS)})")
    return TASKS[data]


def make_dataset(task: str | ConceptTask, n: int, seed: int, split: str = "train") -> ConceptData:
    """``n`` samples of a task (a ConceptTask or a built-in name) drawn from ``seed``; digits keep
    train/test images apart."""
    if isinstance(task, str):
        if task not in TASKS:
            raise ValueError(f"unknown concept dataset '{task}' (allowed: {', '.join(TASKS)})")
        task = TASKS[task]
    x, c, y = task.sample(n, np.random.default_rng(seed), split)
    return ConceptData(
        np.asarray(x, dtype=np.float32), np.asarray(c, dtype=np.float32), y,
        task.concept_names, task.n_classes,
    )  # fmt: skip


@dataclass(frozen=True)
class Scenario:
    """Which concepts client ``k`` has labels for (``holds``) and the round each concept appears."""

    concept_names: tuple[str, ...]
    holds: tuple[tuple[str, ...], ...]
    intro_round: dict[str, int]

    def available(self, client: int, server_round: int) -> tuple[str, ...]:
        """Concepts client ``client`` holds labels for at ``server_round``."""
        return tuple(n for n in self.holds[client] if self.intro_round[n] <= max(server_round, 1))

    def initial_concepts(self) -> tuple[str, ...]:
        return tuple(n for n in self.concept_names if self.intro_round[n] <= 1)


def _whole(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def schedule_problem(schedule: Mapping[str, object]) -> str | None:
    """The rule of ``workload.params.schedule``: ``{concept: {clients: [ids >= 0], round: r >= 1}}``
    (the concepts and the number of clients are checked when the workload is built)."""
    for name, entry in schedule.items():
        entry = entry or {}
        if not isinstance(entry, dict):
            return f"{name}: must be a mapping {{clients: [ids], round: r}}, got {entry!r}"
        extra = sorted(set(entry) - {"clients", "round"})
        if extra:
            return f"{name}: unknown key '{extra[0]}' (allowed: clients, round)"
        clients = entry.get("clients", [])
        if not isinstance(clients, list) or not all(_whole(k, 0) for k in clients):
            return f"{name}.clients must be a list of client ids >= 0, got {clients!r}"
        if not _whole(entry.get("round", 1), 1):
            return f"{name}.round must be an integer >= 1, got {entry['round']!r}"
    return None


def schedule_scenario(
    schedule: Mapping[str, Any], concept_names: tuple[str, ...], num_clients: int
) -> Scenario:
    """Explicit holdings and arrival rounds: ``{concept: {clients: [ids], round: r}}`` for every
    concept (``clients: []`` leaves it unlabelled; ``round`` defaults to 1)."""
    unknown = [c for c in schedule if c not in concept_names]
    missing = [c for c in concept_names if c not in schedule]
    if unknown or missing:
        what = f"unknown concept '{unknown[0]}'" if unknown else f"no entry for '{missing[0]}'"
        raise ConfigError(
            f"workload.params.schedule: {what} (concepts: {', '.join(concept_names)}; every "
            "concept needs {clients: [...], round: r})"
        )
    problem = schedule_problem(schedule)
    if problem:
        raise ConfigError(f"workload.params.schedule.{problem}")
    holds: list[list[str]] = [[] for _ in range(num_clients)]
    intro = {}
    for name in concept_names:
        entry = schedule[name] or {}
        clients = [int(k) for k in entry.get("clients", [])]
        if any(k >= num_clients for k in clients):
            raise ConfigError(
                f"workload.params.schedule.{name}.clients: ids must be in 0..{num_clients - 1}"
            )
        intro[name] = int(entry.get("round", 1))
        for k in clients:
            holds[k].append(name)
    return Scenario(concept_names, tuple(tuple(h) for h in holds), intro)


def make_scenario(
    kind: str, concept_names: tuple[str, ...], num_clients: int, rounds: int, seed: int,
    hold_fraction: float = 0.5,
) -> Scenario:  # fmt: skip
    """Label availability: ``full`` (all hold all), ``partial`` (each holds ceil(rho*K), jointly
    covering all), ``evolving`` (partial + half the concepts appear only after round 1),
    ``central`` (one pooled client with every label)."""
    if kind not in SCENARIOS or kind == "schedule":
        allowed = ", ".join(s for s in SCENARIOS if s != "schedule")
        raise ConfigError(f"unknown scenario '{kind}' (allowed: {allowed})")
    k = len(concept_names)
    rng = np.random.default_rng([seed, 11])
    intro = {n: 1 for n in concept_names}
    if kind in ("full", "central"):
        return Scenario(concept_names, tuple(concept_names for _ in range(num_clients)), intro)
    order = [concept_names[i] for i in rng.permutation(k)]
    size = min(k, max(1, math.ceil(hold_fraction * k)))
    holds = tuple(
        tuple(n for n in concept_names if n in {order[(c * size + i) % k] for i in range(size)})
        for c in range(num_clients)
    )
    if kind == "evolving":
        late = [concept_names[i] for i in rng.permutation(k)][math.ceil(k / 2) :]
        for i, name in enumerate(late):
            intro[name] = 1 + max(1, rounds * (i + 1) // (2 * (len(late) + 1)))
    return Scenario(concept_names, holds, intro)
