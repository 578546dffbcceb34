"""F-CMs client side: a concept-based model (CEM or CBM) whose concept set grows during federation.

Paper: Fenoglio et al., "Federated Concept-Based Models" (arXiv 2602.04093). Clients hold labels for
different concepts; the model has one module per concept and a task head with one input block per
concept, so a concept that appears mid-run is added without touching the rest. Parameters travel as
named arrays: ``enc.*`` (shared encoder), ``concept.<name>.*`` (one module per concept),
``scorer.*`` (CEM's shared probability scorer), ``task.in.<name>`` / ``task.in.bias`` /
``task.out.*`` (task head). A client trains the modules of the concepts it has labels for, uses the
others in the forward pass frozen, and sends back only what it trained (see strategies/fcm.py).

Data generators live in ``clients.workloads.fcm_data``.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, RecordDict

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.params import choices, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext
from flowerbed.clients.workloads.fcm_data import (
    SCENARIOS,
    ConceptData,
    Scenario,
    formula_problem,
    get_task,
    make_dataset,
    make_scenario,
    schedule_problem,
    schedule_scenario,
    task_problem,
)

REGISTRY_KEY = "fcm-registry"
LOCAL_STATE_KEY = "fcm-local-model"
Params = dict[str, torch.Tensor]


# -- model (functional, over named tensors) -----------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a concept-based model; ``kind`` is ``cem`` (embeddings) or ``cbm`` (scalars)."""

    in_dim: int
    hidden: int
    emb: int
    task_hidden: int
    n_classes: int
    kind: str = "cem"

    @property
    def block(self) -> int:
        """Width of one concept's input to the task head."""
        return self.emb if self.kind == "cem" else 1


def _uniform(shape: tuple[int, ...], fan_in: int, gen: torch.Generator) -> torch.Tensor:
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(shape, generator=gen) * 2 - 1) * bound


def _name_seed(seed: int, name: str, salt: int = 0) -> int:
    return int(np.random.SeedSequence([seed, zlib.crc32(name.encode()), salt]).generate_state(1)[0])


def init_concept(spec: ModelSpec, name: str, seed: int) -> Params:
    """A new concept module (PyTorch-default uniform init), seeded by (seed, name) only."""
    gen = torch.Generator().manual_seed(_name_seed(seed, name))
    out = 2 * spec.emb if spec.kind == "cem" else 1
    return {
        f"concept.{name}.weight": _uniform((out, spec.hidden), spec.hidden, gen),
        f"concept.{name}.bias": _uniform((out,), spec.hidden, gen),
    }


def expand(params: Params, spec: ModelSpec, name: str, seed: int) -> Params:
    """Add concept ``name``: a fresh module and a zero task-head block, so predictions are unchanged."""
    out = dict(params)
    out.update(init_concept(spec, name, seed))
    out[f"task.in.{name}"] = torch.zeros(spec.task_hidden, spec.block)
    return out


def init_params(spec: ModelSpec, concepts: tuple[str, ...], seed: int) -> Params:
    """A full model for ``concepts``, seeded from ``seed``."""
    gen = torch.Generator().manual_seed(_name_seed(seed, "__model__"))
    h, t = spec.hidden, spec.task_hidden
    params: Params = {
        "enc.0.weight": _uniform((h, spec.in_dim), spec.in_dim, gen),
        "enc.0.bias": _uniform((h,), spec.in_dim, gen),
        "enc.1.weight": _uniform((h, h), h, gen),
        "enc.1.bias": _uniform((h,), h, gen),
    }
    if spec.kind == "cem":
        params["scorer.weight"] = _uniform((1, 2 * spec.emb), 2 * spec.emb, gen)
        params["scorer.bias"] = _uniform((1,), 2 * spec.emb, gen)
    fan_in = max(1, spec.block * len(concepts))
    for name in concepts:
        params.update(init_concept(spec, name, seed))
        params[f"task.in.{name}"] = _uniform((t, spec.block), fan_in, gen)
    params["task.in.bias"] = _uniform((t,), fan_in, gen)
    params["task.out.weight"] = _uniform((spec.n_classes, t), t, gen)
    params["task.out.bias"] = _uniform((spec.n_classes,), t, gen)
    return params


def concepts_of(params: Params | ArrayRecord) -> tuple[str, ...]:
    """Concept names present in a parameter set, sorted (the model is order-independent)."""
    return tuple(sorted({k.split(".")[1] for k in params.keys() if k.startswith("concept.")}))


def forward(
    params: Params,
    spec: ModelSpec,
    x: torch.Tensor,
    concepts: tuple[str, ...],
    truth: torch.Tensor | None = None,
    intervene: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Task logits [n, classes] and concept logits [n, K]; where ``intervene`` [n, K] is true the
    predicted concept probability is replaced by ``truth`` (test-time intervention / RandInt)."""
    h = F.leaky_relu(F.linear(x, params["enc.0.weight"], params["enc.0.bias"]))
    h = F.leaky_relu(F.linear(h, params["enc.1.weight"], params["enc.1.bias"]))
    hidden = params["task.in.bias"].expand(len(x), -1)
    logits = []
    for j, name in enumerate(concepts):
        z = F.linear(h, params[f"concept.{name}.weight"], params[f"concept.{name}.bias"])
        if spec.kind == "cem":
            z = F.leaky_relu(z)
            logit = F.linear(z, params["scorer.weight"], params["scorer.bias"])
        else:
            logit = z
        prob = torch.sigmoid(logit)
        if intervene is not None and truth is not None:
            prob = torch.where(intervene[:, j : j + 1], truth[:, j : j + 1], prob)
        if spec.kind == "cem":
            emb = prob * z[:, : spec.emb] + (1 - prob) * z[:, spec.emb :]
        else:
            emb = prob
        hidden = hidden + F.linear(emb, params[f"task.in.{name}"])
        logits.append(logit)
    out = F.linear(F.leaky_relu(hidden), params["task.out.weight"], params["task.out.bias"])
    concept_logits = torch.cat(logits, dim=1) if logits else torch.zeros(len(x), 0)
    return out, concept_logits


# -- local step -------------------------------------------------------------------------------
def local_train(
    params: Params,
    spec: ModelSpec,
    data: ConceptData,
    held: tuple[str, ...],
    *,
    train_lacked: bool,
    epochs: int,
    lr: float,
    batch_size: int,
    concept_weight: float,
    rand_int: float,
    seed: int,
    frozen: tuple[str, ...] = (),
    label_mask: np.ndarray | None = None,
    keep_lacked: float = 0.0,
    fresh: tuple[str, ...] = (),
) -> tuple[Params, float]:
    """Joint training: task CE + concept BCE masked to ``held``. Modules of lacked concepts are
    frozen (``train_lacked=False``, F-CMs) or trained by the task gradient only (FedAvg baselines).
    ``frozen``: concepts in warm-up, whose task-head block ``task.in.<name>`` is not trained.
    ``label_mask`` [n, data concepts]: which (example, concept) labels exist (pooled data with
    per-example labels); the BCE is the mean over the labelled pairs of ``held`` concepts and
    RandInt uses a true label only where it exists. ``None``: every example labels ``held``.
    ``keep_lacked`` > 0: the concepts this client lacks (except the ``fresh`` ones, added this
    round) are distilled from the round's global model: BCE of their logits against the global
    model's own probabilities on this client's inputs, weighted by ``keep_lacked`` (no labels read;
    keeps the shared encoder readable by modules the client cannot train)."""
    concepts = concepts_of(params)
    global_model = {k: v.detach() for k, v in params.items()}  # the round's, for keep_lacked
    params = {k: v.detach().clone() for k, v in params.items()}
    trainable = [
        k for k in params
        if (not k.startswith("concept.") or train_lacked or k.split(".")[1] in held)
        and k not in {f"task.in.{n}" for n in frozen}
    ]  # fmt: skip
    for k in trainable:
        params[k].requires_grad_(True)
    opt = torch.optim.Adam([params[k] for k in trainable], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    cols = [data.concept_names.index(n) for n in concepts]
    c = torch.from_numpy(data.c[:, cols])
    mask = torch.tensor([n in held for n in concepts], dtype=torch.bool)
    labelled = None if label_mask is None else torch.from_numpy(label_mask[:, cols]) & mask
    distil = keep_lacked > 0 and not train_lacked
    keep = torch.tensor([distil and n not in held and n not in fresh for n in concepts])
    total, steps = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(order), batch_size):
            b = order[start : start + batch_size]
            # RandInt: ground truth replaces held concepts w.p. rand_int (mask tiled over the batch)
            hit = (torch.rand(len(concepts), generator=gen) < rand_int) & mask
            hits = hit.expand(len(b), -1) if labelled is None else hit & labelled[b]
            task_logits, concept_logits = forward(params, spec, x[b], concepts, c[b], hits)
            loss = F.cross_entropy(task_logits, y[b])
            if labelled is not None:
                if labelled[b].any():
                    pairs = F.binary_cross_entropy_with_logits(
                        concept_logits, c[b], reduction="none"
                    )[labelled[b]]
                    loss = loss + concept_weight * pairs.mean()
            elif mask.any():
                bce = F.binary_cross_entropy_with_logits(concept_logits[:, mask], c[b][:, mask])
                loss = loss + concept_weight * bce
            if keep.any():
                with torch.no_grad():
                    _, teacher = forward(global_model, spec, x[b], concepts)
                target = torch.sigmoid(teacher[:, keep])
                kept = F.binary_cross_entropy_with_logits(concept_logits[:, keep], target)
                loss = loss + keep_lacked * kept
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach())
            steps += 1
    return {k: v.detach() for k, v in params.items()}, total / max(steps, 1)


def grew_recently(registry: list[dict[str, Any]], server_round: int, rounds: int) -> bool:
    """Whether a concept grown mid-run (registry ``first_round`` > 1) has its first round within
    the last ``rounds`` rounds, ``server_round`` included (the catch-up window of growth_epochs)."""
    return any(
        1 < int(e.get("first_round", 0)) <= server_round < int(e.get("first_round", 0)) + rounds
        for e in registry
    )


# -- metrics ------------------------------------------------------------------------------------
def concept_accuracy(
    params: Params, spec: ModelSpec, data: ConceptData
) -> tuple[float, dict[str, float]]:
    """Task accuracy and per-concept accuracy on ``data``. A concept the model has no module for
    is scored as a constant 'absent' prediction (all it can say)."""
    concepts = concepts_of(params)
    with torch.no_grad():
        task_logits, concept_logits = forward(params, spec, torch.from_numpy(data.x), concepts)
    task_acc = float((task_logits.argmax(1).numpy() == data.y).mean())
    per = {}
    for j, name in enumerate(data.concept_names):
        truth = data.c[:, j] > 0.5
        if name in concepts:
            pred = concept_logits[:, concepts.index(name)].numpy() > 0
            per[name] = float((pred == truth).mean())
        else:
            per[name] = float((~truth).mean())
    return task_acc, per


def intervention_curve(
    params: Params, spec: ModelSpec, data: ConceptData, orders: int = 5, seed: int = 0
) -> np.ndarray:
    """Task accuracy after replacing k = 0..K predicted concepts by the true ones (random
    per-sample subsets, averaged over ``orders`` draws); K = concepts the model has."""
    concepts = concepts_of(params)
    cols = [data.concept_names.index(n) for n in concepts]
    x, c = torch.from_numpy(data.x), torch.from_numpy(data.c[:, cols])
    k_max = len(concepts)
    gen = torch.Generator().manual_seed(seed)
    curve = np.zeros(k_max + 1)
    with torch.no_grad():
        for _ in range(orders):
            rank = torch.rand(len(x), k_max, generator=gen).argsort(1).argsort(1)
            for k in range(k_max + 1):
                logits, _ = forward(params, spec, x, concepts, c, rank < k)
                curve[k] += float((logits.argmax(1).numpy() == data.y).mean())
    return curve / orders


def intervention_auc(curve: np.ndarray) -> float:
    """Normalised area under the intervention curve (trapezoid over k/K in [0, 1])."""
    if len(curve) < 2:
        return float(curve[0])
    return float(((curve[1:] + curve[:-1]) / 2).mean())


def score(
    params: Params, spec: ModelSpec, data: ConceptData, held: tuple[str, ...], curve: bool = True
) -> dict[str, float]:
    """Task accuracy, concept accuracy split into held vs lacked concepts, intervention AUC (the
    curve is the costly part; ``curve=False`` skips it for intermediate rounds)."""
    task_acc, per = concept_accuracy(params, spec, data)
    lacked = [n for n in data.concept_names if n not in held]
    out = {"task_accuracy": task_acc, "concept_accuracy": float(np.mean(list(per.values())))}
    if curve:
        points = intervention_curve(params, spec, data)
        out["intervention_auc"] = intervention_auc(points)
        out["task_accuracy_all_intervened"] = float(points[-1])
    if held:
        out["concept_acc_held"] = float(np.mean([per[n] for n in held]))
    if lacked:
        out["concept_acc_lacked"] = float(np.mean([per[n] for n in lacked]))
    return out


def to_params(arrays: ArrayRecord) -> Params:
    return {k: torch.from_numpy(np.array(v.numpy(), dtype=np.float32)) for k, v in arrays.items()}


def to_arrays(params: Params, keys: list[str] | None = None) -> ArrayRecord:
    keys = sorted(params) if keys is None else keys
    return ArrayRecord({k: Array(params[k].detach().numpy().copy()) for k in keys})


# -- registration -------------------------------------------------------------------------------
ScenarioKind = choices("ScenarioKind", SCENARIOS)
ConceptModel = choices("ConceptModel", ("cem", "cbm"))
InitialConcepts = choices("InitialConcepts", ("round1", "all"))


@WORKLOADS.register("fcm", "F-CMs: concept-based model (CEM/CBM) with an evolving concept set")
class FCM(Workload):
    offers = frozenset({Capability.CONCEPT_REGISTRY})
    spec: ModelSpec  # the concept-registry contract (``ConceptRegistryOffer``), set in __init__

    @dataclass
    class Params:
        #: a registered task (xor | trig | dot | digits | ...)
        data: str = param("trig", check=task_problem)
        task: dict[str, Any] = param(
            factory=dict, check=formula_problem
        )  # a formula (overrides data)
        scenario: ScenarioKind = ScenarioKind("evolving")  # full|partial|evolving|central|schedule
        # scenario=schedule: {concept: {clients: [ids], round: r}} for every concept
        schedule: dict[str, Any] = param(factory=dict, check=schedule_problem)
        hold_fraction: float = param(0.5, ge=0, le=1)  # share of concepts each client labels
        central_clients: int = param(5, ge=1)  # 'central' / pooled: pool this many clients
        # pooled: one client with the data of central_clients clients, each example keeping the
        # labels (and arrival rounds) its own client has in the scenario; needs clients.num=1
        pooled: bool = False
        model: ConceptModel = ConceptModel("cem")  # cem | cbm
        hidden: int = param(32, ge=1)
        emb: int = param(8, ge=1)
        task_hidden: int = param(16, ge=1)
        n_train: int = param(300, ge=1)  # examples per client
        n_test: int = param(1000, ge=1)  # shared held-out test set
        lr: float = param(0.01, gt=0)
        batch_size: int = param(32, ge=1)
        local_epochs: int = param(1, ge=0)
        concept_weight: float = param(1.0, ge=0)
        rand_int: float = param(0.25, ge=0, le=1)
        # weight of the self-distillation of lacked concepts (``local_train``'s keep_lacked)
        keep_lacked: float = param(0.0, ge=0)
        # local epochs in the growth_rounds rounds from a grown concept's first round (0: off,
        # local_epochs throughout): catch-up, so the federation integrates a late concept in time
        growth_epochs: int = param(0, ge=0)
        growth_rounds: int = param(5, ge=1)
        # baselines
        train_lacked: bool = False  # True: FedAvg-style, lacked modules trained and sent
        initial_concepts: InitialConcepts = InitialConcepts(
            "round1"
        )  # round1 | all (oracle architecture)
        local_only: bool = False  # each client keeps its own model, never aggregated

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        p = self.params
        self.task = get_task(p.data, p.task)
        probe = make_dataset(self.task, 2, 0)
        self.spec = ModelSpec(
            probe.x.shape[1], p.hidden, p.emb, p.task_hidden, probe.n_classes, p.model
        )
        problem = self._pooled_problem() if p.pooled else None
        if problem:
            raise ConfigError(f"workload.params.pooled=true {problem}")
        num = p.central_clients if p.scenario == "central" or p.pooled else self.ctx.num_clients
        if p.scenario == "schedule":  # any other scenario ignores the schedule
            self.scenario: Scenario = schedule_scenario(p.schedule, probe.concept_names, num)
        else:
            self.scenario = make_scenario(
                p.scenario,
                probe.concept_names,
                num,
                self.ctx.rounds,
                self.ctx.seed,
                p.hold_fraction,
            )
        self.test = make_dataset(self.task, p.n_test, client_seed(self.ctx.seed, 10**6, 0), "test")

    def _pooled_problem(self) -> str | None:
        p = self.params
        if p.scenario == "central":
            return "needs a federated scenario (full|partial|evolving|schedule); central is pooled"
        if p.local_only:
            return "and local_only=true exclude each other (pooled is one centralised client)"
        if self.ctx.num_clients != 1:
            return f"runs one client holding the pool: clients.num must be 1 (got {self.ctx.num_clients})"
        return None

    def initial_concepts(self) -> tuple[str, ...]:
        if self.params.initial_concepts == "all":
            return self.scenario.concept_names
        return self.scenario.initial_concepts()

    def load_partition(self, partition_id: int, num_partitions: int) -> ConceptData:
        p, seed = self.params, self.ctx.seed
        if p.scenario != "central" and not p.pooled:
            return make_dataset(self.task, p.n_train, client_seed(seed, partition_id, 0), "train")
        parts = [
            make_dataset(self.task, p.n_train, client_seed(seed, i, 0), "train")
            for i in range(p.central_clients)
        ]
        x, c, y = (np.concatenate([getattr(d, f) for d in parts]) for f in ("x", "c", "y"))
        return ConceptData(x, c, y, parts[0].concept_names, parts[0].n_classes)

    def init_arrays(self) -> ArrayRecord:
        return to_arrays(init_params(self.spec, self.initial_concepts(), self.ctx.seed))

    def held(self, partition_id: int, server_round: int) -> tuple[str, ...]:
        """Concepts this client has labels for now (central: every one; pooled: those any pooled
        client has)."""
        if self.params.scenario == "central":
            return self.scenario.concept_names
        if self.params.pooled:
            owners = range(self.params.central_clients)
            have = {n for k in owners for n in self.scenario.available(k, server_round)}
            return tuple(n for n in self.scenario.concept_names if n in have)
        return self.scenario.available(partition_id, server_round)

    def label_mask(self, server_round: int) -> np.ndarray | None:
        """Pooled: [pool examples, concepts] — example ``i`` of client ``k``'s block is labelled
        for the concepts client ``k`` holds at ``server_round`` (federated label availability).
        ``None`` otherwise (every example labels every held concept)."""
        p = self.params
        if not p.pooled:
            return None
        names = self.scenario.concept_names
        rows = [
            [n in self.scenario.available(k, server_round) for n in names]
            for k in range(p.central_clients)
        ]
        return np.repeat(np.asarray(rows, dtype=bool).reshape(-1, len(names)), p.n_train, axis=0)

    def fit(
        self, arrays: ArrayRecord, data: ConceptData, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        pid, rnd = int(config["partition-id"]), int(config["server-round"])
        p = self.params
        if p.local_only and LOCAL_STATE_KEY in state.array_records:
            arrays = state.array_records[LOCAL_STATE_KEY]
        params = to_params(arrays)
        available = self.held(pid, rnd)
        held = tuple(n for n in available if n in concepts_of(params))
        registry = json.loads(str(config.get(REGISTRY_KEY, "{}"))).get("concepts", [])
        frozen = tuple(e["name"] for e in registry if e.get("task_from", 0) > rnd)
        fresh = tuple(e["name"] for e in registry if e.get("first_round", 0) >= rnd)
        mask = self.label_mask(rnd)
        cols = [self.scenario.concept_names.index(n) for n in held]
        if mask is not None and mask[:, cols].all():  # every pooled example labels every held
            mask = None  # concept: the plain loss (so all labels reproduce 'central' bit for bit)
        catch_up = p.growth_epochs and grew_recently(registry, rnd, p.growth_rounds)
        trained, loss = local_train(
            params, self.spec, data, held,
            train_lacked=p.train_lacked, epochs=p.growth_epochs if catch_up else p.local_epochs, lr=p.lr,
            batch_size=p.batch_size, concept_weight=p.concept_weight, rand_int=p.rand_int,
            seed=client_seed(self.ctx.seed, pid, rnd), frozen=frozen, label_mask=mask,
            keep_lacked=p.keep_lacked, fresh=fresh,
        )  # fmt: skip
        local_scores = {}
        if p.local_only:  # the evaluate hook gets no client state, so score the local model here
            state[LOCAL_STATE_KEY] = to_arrays(trained)
            final = rnd >= self.ctx.rounds
            local_scores = score(trained, self.spec, self.test, available, curve=final)
        send = [
            k for k in sorted(trained)
            if not k.startswith("concept.") or p.train_lacked or k.split(".")[1] in held
        ]  # fmt: skip
        n = len(data.y)
        names = self.scenario.concept_names
        full = self.label_mask(rnd)
        labels = {m: n if full is None else int(full[:, names.index(m)].sum()) for m in available}
        metrics: dict[str, float] = {"num-examples": n, "num-task-labels": n, "train-loss": loss}
        for name in available:  # announcements: also concepts the model does not have yet
            metrics[f"nc.{name}"] = labels[name]
        metrics["nc-total"] = sum(labels[m] for m in held)
        metrics.update({f"local-{k}": v for k, v in local_scores.items()})
        return to_arrays(trained, send), metrics

    def evaluate(
        self, arrays: ArrayRecord, data: ConceptData, config: RoundConfig
    ) -> dict[str, float]:
        pid, rnd = int(config["partition-id"]), int(config.get("server-round", 0))
        final = rnd >= self.ctx.rounds
        metrics = score(to_params(arrays), self.spec, self.test, self.held(pid, rnd), curve=final)
        metrics["num-examples"] = len(self.test.y)
        return metrics

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        if self.params.local_only:
            return None
        params = to_params(arrays)
        final = server_round >= self.ctx.rounds
        out = score(params, self.spec, self.test, self.scenario.concept_names, curve=final)
        out.pop("concept_acc_held", None)
        out["n_concepts"] = float(len(concepts_of(params)))
        return out
