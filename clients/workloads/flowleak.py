"""FlowLeak: coverage-guided extraction of dynamic multi-agent workflows (MAS), no LLM needed.

The paper's claim: fully adversarial extraction queries overfit one branch of a dynamic workflow
(*branch overfitting*), while a task-preserving payload template (TPPT) follows real branches, and
coverage-guided branch exploration (CGBE) — mutating tasks that revealed new workflow edges, with
operators chosen by a bandit rewarded by new edges and steered by leaked router digests — reaches
far more of the workflow than random tasks at the same query budget.

Read top to bottom: MAS simulator (generator + execution + leakage), attackers (naive, TPPT with
random tasks, FlowLeak CGBE), metrics, the federated workload (bandit statistics are the weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from flowerbed.clients.core.params import param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload

# ---- task space --------------------------------------------------------------------------------
FEATURES: dict[str, int] = {  # feature -> number of values
    "topic": 8, "language": 4, "attachment": 2, "difficulty": 2, "urgency": 2, "length": 2, "format": 4,
}  # fmt: skip
FEATURE_NAMES = list(FEATURES)
Task = tuple[int, ...]  # one value per feature, in FEATURE_NAMES order


def random_task(rng: np.random.Generator) -> Task:
    return tuple(int(rng.integers(FEATURES[f])) for f in FEATURE_NAMES)


# ---- MAS generator -----------------------------------------------------------------------------
@dataclass
class Router:
    """Branch point: sends the task to ``branches[value of feature]`` (or ``default``)."""

    feature: str
    branches: dict[int, str]
    default: str


@dataclass
class MAS:
    """A dynamic workflow: agents, routers, a guard, verifier loops and summarisers."""

    entry: str
    next_of: dict[str, str] = field(default_factory=dict)  # static successor
    routers: dict[str, Router] = field(default_factory=dict)  # agent -> its branch decision
    verifier_of: dict[str, str] = field(default_factory=dict)  # agent -> verifier (hard tasks)
    guard: str | None = None
    summarisers: set[str] = field(default_factory=set)
    sink: str = "responder"

    def graph(self) -> tuple[set[str], set[tuple[str, str]]]:
        """True agents and edges (everything some task can traverse)."""
        edges: set[tuple[str, str]] = set()
        for a, b in self.next_of.items():
            edges.add((a, b))
        for a, router in self.routers.items():
            for b in [*router.branches.values(), router.default]:
                edges.add((a, b))
        for a, v in self.verifier_of.items():
            edges |= {(a, v), (v, a)}
        agents = {a for e in edges for a in e} | {self.entry}
        return agents, edges


def generate_mas(rng: np.random.Generator, branch_points: int = 8, depth: int = 5) -> MAS:
    """A random MAS: entry -> guard -> router tree; nested routers make some branches rare."""
    mas = MAS(entry="intake")
    counter = [0]

    def new(role: str) -> str:
        counter[0] += 1
        return f"{role}{counter[0]}"

    mas.guard = "guard"
    mas.next_of["intake"] = "guard"

    def build(parent: str, level: int, budget: list[int], used: frozenset[str]) -> None:
        """Attach below ``parent`` either a router (if budget allows) or a worker chain.

        Routers below a router test other features, and never give every value a branch, so
        every edge is reachable; budget is spent depth first, so the first branch nests deepest
        (a rare conjunction of conditions, the case coverage guidance is for).
        """
        if budget[0] > 0 and level < depth:
            budget[0] -= 1
            feature = str(rng.choice([f for f in FEATURE_NAMES if f not in used]))
            n_values = FEATURES[feature]
            chosen = rng.choice(
                n_values, size=int(rng.integers(1, max(1, n_values // 2) + 1)), replace=False
            )
            branches = {}
            for value in sorted(int(v) for v in chosen):
                head = new("specialist")
                branches[value] = head
                build(head, level + 1, budget, used | {feature})
            default = new("generalist")
            mas.next_of[default] = mas.sink
            mas.routers[parent] = Router(feature, branches, default)
            return
        chain = [parent] + [new("worker") for _ in range(int(rng.integers(0, 2)))]
        if rng.random() < 0.4:
            chain.append(new("summariser"))
            mas.summarisers.add(chain[-1])
        for a, b in zip(chain, chain[1:], strict=False):
            mas.next_of[a] = b
        mas.next_of[chain[-1]] = mas.sink
        if "difficulty" not in used and rng.random() < 0.5:  # reachable: some task here is hard
            mas.verifier_of[chain[0]] = new("verifier")

    router = "router"
    mas.next_of["guard"] = router
    build(router, 0, [branch_points], frozenset())
    return mas


def single_path_mas() -> MAS:
    """No branching at all: every query traverses every agent (a parser check)."""
    mas = MAS(entry="intake", guard=None)
    chain = ["intake", "planner", "writer", "responder"]
    for a, b in zip(chain, chain[1:], strict=False):
        mas.next_of[a] = b
    return mas


# ---- execution and leakage ---------------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    task: Task | None  # None: a fully adversarial payload with no legitimate task
    structured: bool  # the TPPT asks for a structured trace [role | digest | next]


@dataclass(frozen=True)
class Leak:
    edges: frozenset[tuple[str, str]]
    digests: dict[str, str]  # router -> name of the feature it branches on (its instruction digest)


def execute(mas: MAS, query: Query, rng: np.random.Generator, p_leak: float = 0.9) -> Leak:
    """Run a query through the MAS; return the trace that survives to the final answer."""
    task = dict(zip(FEATURE_NAMES, query.task, strict=True)) if query.task is not None else None
    path = [mas.entry]
    agent = mas.entry
    for _ in range(64):
        if agent == mas.sink:
            break
        if agent == mas.guard and task is None:
            nxt = mas.sink  # the guard refuses a non-task payload: straight to a refusal answer
        elif agent in mas.routers:
            router = mas.routers[agent]
            value = task[router.feature] if task is not None else None
            nxt = (
                router.branches.get(value, router.default) if value is not None else router.default
            )
        else:
            nxt = mas.next_of.get(agent, mas.sink)
        if agent in mas.verifier_of and task is not None and task["difficulty"] == 1:
            path += [mas.verifier_of[agent], agent]  # verifier loop on hard tasks
        path.append(nxt)
        agent = nxt
    # leakage: each agent appends its trace entry; entries survive later hops with p_keep
    trace: list[tuple[str, str]] = []
    digests: dict[str, str] = {}
    for a, b in zip(path, path[1:], strict=False):
        if a in mas.summarisers:  # summarisers drop unstructured text and may drop structured
            trace = [e for e in trace if query.structured and rng.random() < 0.85]
        if rng.random() < p_leak:
            trace.append((a, b))
            if query.structured and a in mas.routers:
                digests[a] = mas.routers[a].feature
        keep = 0.97 if query.structured else 0.7
        trace = [e for e in trace if rng.random() < keep]
    return Leak(frozenset(trace), digests)


# ---- attackers ---------------------------------------------------------------------------------
OPERATORS = [f"mutate:{f}" for f in FEATURE_NAMES] + ["crossover", "fresh", "targeted"]
BANDIT_ARMS = len(OPERATORS) - 1  # "targeted" is not chosen by the bandit: it runs whenever it can


def naive_attack(mas: MAS, budget: int, rng: np.random.Generator) -> list[set[tuple[str, str]]]:
    """Fully adversarial queries ('print your workflow'): no task, unstructured trace."""
    found: set[tuple[str, str]] = set()
    curve = []
    for _ in range(budget):
        found |= execute(mas, Query(None, structured=False), rng).edges
        curve.append(set(found))
    return curve


def random_task_attack(
    mas: MAS, budget: int, rng: np.random.Generator
) -> list[set[tuple[str, str]]]:
    """TPPT with random legitimate tasks (baseline B2)."""
    found: set[tuple[str, str]] = set()
    curve = []
    for _ in range(budget):
        found |= execute(mas, Query(random_task(rng), structured=True), rng).edges
        curve.append(set(found))
    return curve


@dataclass
class Bandit:
    """UCB1 over mutation operators, rewarded by the number of new edges a query revealed."""

    value: np.ndarray
    count: np.ndarray

    @classmethod
    def fresh(cls) -> Bandit:
        return cls(np.zeros(len(OPERATORS)), np.zeros(len(OPERATORS)))

    def choose(self, rng: np.random.Generator) -> int:
        count, value = self.count[:BANDIT_ARMS], self.value[:BANDIT_ARMS]
        total = count.sum() + 1
        bonus = np.sqrt(2 * math.log(total) / np.maximum(count, 1e-9))
        score = np.where(count > 0, value + bonus, np.inf)
        best = np.flatnonzero(score == score.max())
        return int(rng.choice(best))

    def update(self, op: int, reward: float) -> None:
        self.count[op] += 1
        self.value[op] += (reward - self.value[op]) / self.count[op]


def flowleak_attack(
    mas: MAS, budget: int, rng: np.random.Generator, bandit: Bandit | None = None,
    use_fragments: bool = True,
) -> tuple[list[set[tuple[str, str]]], Bandit]:  # fmt: skip
    """TPPT + coverage-guided branch exploration; returns the recall curve and the bandit.

    Extracted fragments steer the next task: a leaked router digest names the feature that router
    branches on, and a task already seen to pass through that router, with only that feature
    changed to a value not yet tried there, reaches the router again and takes another branch.
    """
    bandit = bandit or Bandit.fresh()
    explorer = _Explorer(rng)
    found: set[tuple[str, str]] = set()
    curve = []
    for _ in range(budget):
        if not explorer.corpus:
            op = OPERATORS.index("fresh")
        elif use_fragments and explorer.open_routers():  # a known router has untried branches
            op = OPERATORS.index("targeted")
        else:
            op = bandit.choose(rng)
        task = explorer.propose(OPERATORS[op])
        leak = execute(mas, Query(task, structured=True), rng)
        new = leak.edges - found
        found |= leak.edges
        explorer.observe(task, leak, bool(new))
        bandit.update(op, min(len(new), 3) / 3)
        curve.append(set(found))
    return curve, bandit


class _Explorer:
    """The fuzzing state: a corpus of tasks that revealed new edges, and per-router coverage."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.corpus: list[Task] = []
        self.digests: dict[str, str] = {}  # router -> feature it branches on
        self.through: dict[str, list[Task]] = {}  # router -> tasks seen passing through it
        self.tried: dict[str, set[int]] = {}  # router -> values of its feature already sent there

    def propose(self, op: str) -> Task:
        rng = self.rng
        if op == "fresh" or not self.corpus:
            return random_task(rng)
        if op == "targeted":
            open_routers = self.open_routers()
            if open_routers:
                router = open_routers[int(rng.integers(len(open_routers)))]
                feature = self.digests[router]
                seeds = self.through[router]
                task = list(seeds[int(rng.integers(len(seeds)))])
                task[FEATURE_NAMES.index(feature)] = int(rng.choice(self._untried(router, feature)))
                return tuple(task)
        seed = self.corpus[-1 - int(rng.integers(min(len(self.corpus), 4)))]  # recent first
        task = list(seed)
        if op == "crossover":
            other = self.corpus[int(rng.integers(len(self.corpus)))]
            mask = rng.random(len(task)) < 0.5
            return tuple(o if m else t for t, o, m in zip(task, other, mask, strict=True))
        feature = (
            op.split(":", 1)[1] if op.startswith("mutate:") else str(rng.choice(FEATURE_NAMES))
        )
        i = FEATURE_NAMES.index(feature)
        task[i] = int(rng.choice([v for v in range(FEATURES[feature]) if v != task[i]]))
        return tuple(task)

    def open_routers(self) -> list[str]:
        return [
            r for r, f in sorted(self.digests.items()) if r in self.through and self._untried(r, f)
        ]

    def _untried(self, router: str, feature: str) -> list[int]:
        return [v for v in range(FEATURES[feature]) if v not in self.tried.get(router, set())]

    def observe(self, task: Task, leak: Leak, new: bool) -> None:
        if new:
            self.corpus.append(task)
        self.digests.update(leak.digests)
        for a, _ in leak.edges:
            self.through.setdefault(a, []).append(task)
        for router, feature in self.digests.items():
            if any(a == router for a, _ in leak.edges):
                self.tried.setdefault(router, set()).add(task[FEATURE_NAMES.index(feature)])


# ---- metrics -----------------------------------------------------------------------------------
def recall(mas: MAS, edges: set[tuple[str, str]]) -> dict[str, float]:
    agents, true_edges = mas.graph()
    found_agents = {a for e in edges for a in e}
    return {
        "edge_recall": len(edges & true_edges) / len(true_edges),
        "agent_recall": len(found_agents & agents) / len(agents),
        "edge_precision": len(edges & true_edges) / max(len(edges), 1),
    }


def redundant_queries(curve: list[set]) -> int:
    """Queries that revealed no new edge."""
    sizes = [0] + [len(c) for c in curve]
    return sum(b == a for a, b in zip(sizes, sizes[1:], strict=False))


def compare(num_mas: int, budget: int, seed: int) -> dict[str, dict[str, float]]:
    """Mean recall of the three attackers over ``num_mas`` generated MAS at equal budget."""
    results: dict[str, list[dict[str, float]]] = {
        "naive": [], "random": [], "flowleak": [], "flowleak-no-fragments": [],
    }  # fmt: skip
    for i in range(num_mas):
        mas = generate_mas(np.random.default_rng([seed, i]))
        runs = {
            "naive": naive_attack(mas, budget, np.random.default_rng([seed, i, 1])),
            "random": random_task_attack(mas, budget, np.random.default_rng([seed, i, 2])),
            "flowleak": flowleak_attack(mas, budget, np.random.default_rng([seed, i, 3]))[0],
            "flowleak-no-fragments": flowleak_attack(
                mas, budget, np.random.default_rng([seed, i, 3]), use_fragments=False
            )[0],
        }
        for name, curve in runs.items():
            scores = recall(mas, curve[-1])
            scores["redundant"] = redundant_queries(curve)
            scores["stealth"] = 0.0 if name == "naive" else 1.0  # share of task-like queries
            results[name].append(scores)
    return {k: {m: float(np.mean([r[m] for r in v])) for m in v[0]} for k, v in results.items()}


# ---- federated workload ------------------------------------------------------------------------
class ClientId(TypedDict):
    """A client's partition: its id only (the workflows are drawn from the seed and the id)."""

    partition_id: int


@WORKLOADS.register(
    "flowleak", "FlowLeak: coverage-guided MAS workflow extraction; bandit stats federated"
)
class FlowLeak(Workload):
    """Clients audit their own private MAS; the bandit's operator statistics are the weights.

    Every audit also runs TPPT with random tasks on the same MAS at the same budget
    (``random_*`` metrics), so a run shows FlowLeak's gain over that baseline. With
    ``share_statistics: false`` a client ignores the statistics it receives and starts every
    audit from a fresh bandit (the no-sharing arm the benchmark compares against).
    """

    @dataclass
    class Params:
        mas_per_client: int = param(4, ge=1)
        budget: int = param(40, ge=1)
        share_statistics: bool = True

    params: Params

    def load_partition(self, partition_id: int, num_partitions: int) -> ClientId:
        return {"partition_id": partition_id}

    def init_arrays(self) -> ArrayRecord:
        bandit = Bandit.fresh()
        return ArrayRecord({"op_value": Array(bandit.value), "op_count": Array(bandit.count)})

    def _audit(
        self, arrays: ArrayRecord, partition_id: int, server_round: int
    ) -> tuple[Bandit, dict]:
        if self.params.share_statistics:
            prior = Bandit(
                arrays["op_value"].numpy().copy(), np.minimum(arrays["op_count"].numpy(), 5.0)
            )
        else:
            prior = Bandit.fresh()
        scores = []
        for j in range(self.params.mas_per_client):
            key = client_seed(self.ctx.seed, partition_id, server_round, salt=j)
            mas = generate_mas(np.random.default_rng(key))
            curve, prior = flowleak_attack(
                mas, self.params.budget, np.random.default_rng(key + 1), prior
            )
            baseline = random_task_attack(mas, self.params.budget, np.random.default_rng(key + 2))
            scores.append(
                recall(mas, curve[-1])
                | {"redundant": redundant_queries(curve)}
                | {f"random_{k}": v for k, v in recall(mas, baseline[-1]).items()}
            )
        return prior, {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}

    def fit(self, arrays: ArrayRecord, data: ClientId, config: RoundConfig, state: RecordDict):
        bandit, scores = self._audit(arrays, data["partition_id"], int(config["server-round"]))
        out = ArrayRecord({"op_value": Array(bandit.value), "op_count": Array(bandit.count)})
        return out, {"num-examples": self.params.budget * self.params.mas_per_client, **scores}

    def evaluate(
        self, arrays: ArrayRecord, data: ClientId, config: RoundConfig
    ) -> dict[str, float]:
        _, scores = self._audit(
            arrays, data["partition_id"], 10_000 + int(config.get("server-round", 0))
        )
        return {"num-examples": self.params.mas_per_client, **scores}
