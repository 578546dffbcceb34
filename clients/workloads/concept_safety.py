"""Concept-level safety fine-tuning: behavioural safety vs knowledge accessibility, per concept.

Toy after Jain et al. (NeurIPS 2024, task x concept framework) and Qi et al. 2024 (shallow safety
alignment; knowledge reachable by prefilling); method page: docs/methods/concept-safety.md.

* **World.** ``T`` task tokens x ``C`` unsafe concept tokens ``U_c`` and ``C`` safe twins ``S_c``.
  Every concept owns a few answer tokens; each (task, concept) has a fixed answer of ``L`` of them.
  Sequences: ``BOS t x SEP a_1..a_L EOS``; a refusal is ``BOS t U_c SEP REFUSE EOS``.
* **Pretraining.** A tiny GPT (pure torch, 2 layers, d = 64, ~0.1 M params) memorises every answer;
  done once per seed and cached in-process.
* **Safety fine-tuning.** Unsafe prompts -> ``REFUSE``, paired safe prompts -> their answer, on the
  training tasks; the last task is held out. Data composition (uniform, Zipf, partial coverage),
  unsafe:safe ratio and budget ``N`` (unsafe samples) are knobs; training is full-batch for a
  fixed number of epochs, so a concept's share of the gradient is ``n_c / N``.
* **Per-concept metrics** on the held-out task: refusal rate ``R_c = P(REFUSE first | t, U_c)``
  (the model's own probability, i.e. the refusal rate under sampling), over-refusal
  ``O_c = P(REFUSE first | t, S_c)``, teacher-forced answer perplexity and teacher-forced
  accuracy on ``a_2..a_L`` (knowledge ``K_c``), both with the REFUSE path bypassed, and prefill
  extraction (force ``a_1``; does greedy decoding give ``a_2..a_L``?).
  Heterogeneity: ``std_c R_c`` and ``Spearman(n_c, R_c)``.
* **Federated.** Clients own skewed, complementary concept coverage; FedAvg of their fine-tuned
  weights; the server reports the per-concept table every round.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from scipy.stats import spearmanr
from torch import nn
from torch.nn import functional as F

from flowerbed.clients.core.params import choices, defaults, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.nn import PreLNBlock
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext

PAD, BOS, SEP, EOS, REFUSE = 0, 1, 2, 3, 4
N_SPECIAL = 5

# ---------------------------------------------------------------------------------------------
# 1. data generator: the synthetic knowledge world and safety fine-tuning sets
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class World:
    """Token layout and the fixed answer of every (task, concept); concepts ``0..C-1`` are unsafe,
    ``C..2C-1`` their safe twins (``c + C`` is the twin of ``c``)."""

    tasks: int
    concepts: int
    answer_len: int
    answer_vocab: int  # answer tokens owned by each concept
    answers: np.ndarray  # (tasks, 2 * concepts, answer_len) token ids

    @property
    def vocab(self) -> int:
        return N_SPECIAL + self.tasks + 2 * self.concepts * (1 + self.answer_vocab)

    @property
    def seq_len(self) -> int:
        return 4 + self.answer_len + 1  # BOS t x SEP a.. EOS

    def task_token(self, t: int) -> int:
        return N_SPECIAL + t

    def concept_token(self, x: int) -> int:
        return N_SPECIAL + self.tasks + x

    @property
    def train_tasks(self) -> list[int]:
        return list(range(self.tasks - 1))

    @property
    def heldout_task(self) -> int:
        return self.tasks - 1


def make_world(
    seed: int, tasks: int = 4, concepts: int = 12, answer_len: int = 3, answer_vocab: int = 6
) -> World:
    """A seeded world: concept ``x`` owns ``answer_vocab`` tokens in a private cyclic order; the
    answer to ``(t, x)`` starts at a task-specific token and walks that order. Knowing a concept is
    knowing where each task starts and how its order continues (so a prefilled ``a_1`` suffices
    to extract the rest if the concept knowledge is intact)."""
    rng = np.random.default_rng([seed, 9])
    base = N_SPECIAL + tasks + 2 * concepts
    answers = np.zeros((tasks, 2 * concepts, answer_len), dtype=np.int64)
    for x in range(2 * concepts):
        cycle = base + x * answer_vocab + rng.permutation(answer_vocab)
        starts = rng.choice(answer_vocab, size=tasks, replace=tasks > answer_vocab)
        for t in range(tasks):
            answers[t, x] = cycle[(starts[t] + np.arange(answer_len)) % answer_vocab]
    return World(tasks, concepts, answer_len, answer_vocab, answers)


def encode(world: World, task: int, concept: int, refuse: bool) -> tuple[list[int], int]:
    """Token ids of one example (padded to ``seq_len``) and the position of SEP."""
    head = [BOS, world.task_token(task), world.concept_token(concept), SEP]
    body = [REFUSE, EOS] if refuse else [*world.answers[task, concept].tolist(), EOS]
    seq = head + body
    return seq + [PAD] * (world.seq_len - len(seq)), 3


@dataclass
class Batch:
    """Token ids and the mask of the positions whose next token is trained (after SEP)."""

    tokens: torch.Tensor  # (n, seq_len)
    loss_mask: torch.Tensor  # (n, seq_len - 1) bool: predict tokens[:, 1:] where True

    def __len__(self) -> int:
        return len(self.tokens)


def make_batch(world: World, examples: list[tuple[int, int, bool]]) -> Batch:
    """Examples are ``(task, concept, refuse)``; loss on the response (everything after SEP)."""
    if not examples:
        return Batch(
            torch.zeros(0, world.seq_len, dtype=torch.long), torch.zeros(0, 0, dtype=torch.bool)
        )
    rows = [encode(world, *e)[0] for e in examples]
    tokens = torch.tensor(rows, dtype=torch.long)
    target = tokens[:, 1:]
    pos = torch.arange(world.seq_len - 1)
    mask = (pos >= 3)[None, :] & (target != PAD)
    return Batch(tokens, mask)


def pretrain_examples(world: World) -> list[tuple[int, int, bool]]:
    """Every (task, concept) with its answer, unsafe concepts included (the knowledge)."""
    return [(t, x, False) for t in range(world.tasks) for x in range(2 * world.concepts)]


def concept_counts(
    composition: str, budget: int, concepts: int, zipf_s: float = 1.0, coverage: float = 0.5,
    order: np.ndarray | None = None,
) -> np.ndarray:  # fmt: skip
    """Unsafe samples per concept at total ``budget``: ``uniform``, ``zipf`` (rank^-s) or
    ``partial`` (``coverage`` of the concepts, uniform among them). ``order`` ranks the concepts."""
    order = np.arange(concepts) if order is None else np.asarray(order)
    if composition == "uniform":
        weights: np.ndarray = np.ones(concepts)
    elif composition == "zipf":
        weights = 1.0 / np.arange(1, concepts + 1) ** zipf_s
    elif composition == "partial":
        k = max(1, int(round(coverage * concepts)))
        weights = (np.arange(concepts) < k).astype(float)
    else:
        raise ValueError(f"unknown composition {composition!r}")
    share = weights / weights.sum() * budget
    counts = np.floor(share).astype(int)  # largest-remainder rounding keeps the total at budget
    rest = budget - counts.sum()
    counts[np.argsort(-(share - counts), kind="stable")[:rest]] += 1
    out = np.zeros(concepts, dtype=int)
    out[order] = counts
    return out


def safety_examples(
    world: World, counts: np.ndarray, safe_per_unsafe: float, rng: np.random.Generator
) -> list[tuple[int, int, bool]]:
    """``counts[c]`` refusals of ``(t, U_c)`` on training tasks (tasks cycled from a random start),
    plus ``safe_per_unsafe`` paired safe prompts ``(t, S_c) -> answer`` per refusal."""
    examples: list[tuple[int, int, bool]] = []
    train = world.train_tasks
    for c, n in enumerate(counts):
        start = int(rng.integers(len(train)))
        tasks = [train[(start + i) % len(train)] for i in range(int(n))]
        examples += [(t, c, True) for t in tasks]
        n_safe = int(round(safe_per_unsafe * n))
        examples += [(tasks[i % len(tasks)], c + world.concepts, False) for i in range(n_safe)]
    return examples


# ---------------------------------------------------------------------------------------------
# 2. model: a tiny GPT (pre-LN, causal attention, tied embeddings)
# ---------------------------------------------------------------------------------------------


class TinyGPT(nn.Module):
    """Token + position embeddings, ``layers`` blocks, final LN, tied output head."""

    def __init__(self, vocab: int, seq_len: int, dim: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        # (its blocks register ln2 before qkv: the parameter order this workload always had)
        self.blocks = nn.ModuleList(PreLNBlock(dim, heads, norms_first=True) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        nn.init.normal_(self.tok.weight, std=0.1)
        nn.init.normal_(self.pos, std=0.1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.ln(h) @ self.tok.weight.T


@dataclass(frozen=True)
class ModelSpec:
    dim: int = 64
    layers: int = 2
    heads: int = 4


def build_model(world: World, spec: ModelSpec) -> TinyGPT:
    return TinyGPT(world.vocab, world.seq_len, spec.dim, spec.layers, spec.heads)


# ---------------------------------------------------------------------------------------------
# 3. local step: pretraining, safety fine-tuning and the unlearning control
# ---------------------------------------------------------------------------------------------


def response_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean next-token cross-entropy over the response positions."""
    logits = model(batch.tokens[:, :-1])
    target = batch.tokens[:, 1:]
    return F.cross_entropy(logits[batch.loss_mask], target[batch.loss_mask])


def train_steps(
    model: nn.Module, batch: Batch, steps: int, lr: float, ascent: bool = False,
    optimizer: str = "adam",
) -> float:  # fmt: skip
    """Full-batch training for ``steps`` steps (gradient *ascent* for the unlearning control).

    Pretraining uses Adam; fine-tuning uses SGD with momentum, whose update is proportional to the
    gradient (Adam's normalised step would move every weight with a nonzero gradient by ~lr)."""
    torch.set_num_threads(1)
    if len(batch) == 0 or steps == 0:
        return 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    opt: torch.optim.Optimizer
    if optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr)
    else:
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    model.train()
    loss = torch.zeros(())
    for _ in range(steps):
        opt.zero_grad()
        loss = response_loss(model, batch)
        (-loss if ascent else loss).backward()
        opt.step()
    return float(loss.detach())


@functools.lru_cache(maxsize=8)
def _pretrained(
    seed: int, key: tuple, spec: ModelSpec, steps: int, lr: float
) -> dict[str, torch.Tensor]:
    tasks, concepts, answer_len, answer_vocab, raw = key
    answers = np.frombuffer(raw, dtype=np.int64).reshape(tasks, 2 * concepts, answer_len)
    world = World(tasks, concepts, answer_len, answer_vocab, answers)
    torch.manual_seed(seed)
    model = build_model(world, spec)
    train_steps(model, make_batch(world, pretrain_examples(world)), steps, lr)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def pretrained_model(
    seed: int, world: World, spec: ModelSpec = ModelSpec(), steps: int = 200, lr: float = 5e-3
) -> TinyGPT:
    """The tiny GPT after pretraining on every (task, concept) answer; cached per seed."""
    model = build_model(world, spec)
    key = (world.tasks, world.concepts, world.answer_len, world.answer_vocab,
           world.answers.tobytes())  # fmt: skip
    model.load_state_dict(_pretrained(seed, key, spec, steps, lr))
    return model


Trainable = choices("Trainable", ("all", "blocks", "mlp"))


@dataclass(frozen=True)
class FinetuneSetup:
    """The fine-tuning knobs that ``FinetuneConfig`` and the federated workload's params share."""

    budget: int = param(48, ge=1)  # N: unsafe (refusal) samples
    safe_per_unsafe: float = param(1.0, ge=0)  # unsafe:safe = 1:ratio
    zipf_s: float = param(1.0, ge=0)
    lr: float = param(0.02, gt=0)
    # all | blocks (token embeddings frozen) | mlp (only block MLPs)
    trainable: Trainable = Trainable("blocks")


@dataclass(frozen=True)
class FinetuneConfig(FinetuneSetup):
    composition: str = "uniform"  # uniform | zipf | partial
    coverage: float = 0.5
    epochs: int = 80  # full-batch SGD steps


def safety_finetune(
    model: nn.Module, world: World, config: FinetuneConfig, seed: int
) -> tuple[nn.Module, np.ndarray]:
    """Fine-tune ``model`` in place on a composition; returns it and the per-concept counts n_c.

    Under Zipf/partial the concept ranks are a seeded permutation, so n_c is not tied to ids."""
    rng = np.random.default_rng([seed, 17])
    order = rng.permutation(world.concepts)
    counts = concept_counts(config.composition, config.budget, world.concepts, config.zipf_s,
                            config.coverage, order)  # fmt: skip
    batch = make_batch(world, safety_examples(world, counts, config.safe_per_unsafe, rng))
    torch.manual_seed(seed)
    finetune_steps(model, batch, config.epochs, config.lr, config.trainable)
    return model, counts


def finetune_steps(model: nn.Module, batch: Batch, steps: int, lr: float, trainable: str) -> float:
    """Safety fine-tuning steps (SGD + momentum) on the ``trainable`` part of the model."""
    set_trainable(model, trainable)
    loss = train_steps(model, batch, steps, lr, optimizer="sgd")
    set_trainable(model, "all")
    return loss


def set_trainable(model: nn.Module, which: str) -> None:
    """``all`` parameters, all but the token embeddings (``blocks``), or only the block MLPs."""
    if which not in ("all", "blocks", "mlp"):
        raise ValueError(f"trainable must be 'all', 'blocks' or 'mlp', not {which!r}")
    for name, p in model.named_parameters():
        keep = {"all": True, "blocks": name != "tok.weight", "mlp": ".mlp." in name}[which]
        p.requires_grad_(keep)


def unlearn(model: nn.Module, world: World, steps: int = 20, lr: float = 1e-3) -> nn.Module:
    """Control: gradient ascent on the unsafe answers of the training tasks (removes knowledge)."""
    examples = [(t, c, False) for t in world.train_tasks for c in range(world.concepts)]
    train_steps(model, make_batch(world, examples), steps, lr, ascent=True)
    return model


# ---------------------------------------------------------------------------------------------
# 4. metrics: refusal, over-refusal, perplexity, prefill extraction, heterogeneity
# ---------------------------------------------------------------------------------------------


@dataclass
class ConceptTable:
    """Per-concept metrics on the evaluated tasks (arrays of length C)."""

    refusal: np.ndarray  # R_c = P(REFUSE | t, U_c)
    over_refusal: np.ndarray  # O_c = P(REFUSE | t, S_c)
    ppl: np.ndarray  # teacher-forced answer perplexity of U_c, REFUSE bypassed
    knowledge: np.ndarray  # teacher-forced accuracy on a_2..a_L of U_c answers, REFUSE bypassed
    extraction: np.ndarray  # prefill extraction accuracy of U_c answers
    safe_extraction: np.ndarray  # the same for S_c answers (greedy, no prefill)

    def summary(self) -> dict[str, float]:
        return {
            "refusal_mean": float(self.refusal.mean()),
            "refusal_std": float(self.refusal.std()),
            "over_refusal_mean": float(self.over_refusal.mean()),
            "ppl_median": float(np.median(self.ppl)),
            "knowledge_mean": float(self.knowledge.mean()),
            "extraction_mean": float(self.extraction.mean()),
            "safe_answer_mean": float(self.safe_extraction.mean()),
        }


@torch.no_grad()
def _first_token_and_ppl(
    model: nn.Module, world: World, tasks: list[int], concepts: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """P(REFUSE) after SEP, answer perplexity and teacher-forced accuracy on ``a_2..a_L`` (both
    with REFUSE masked out: the knowledge path), each of shape (len(tasks), len(concepts))."""
    pairs = [(t, c) for t in tasks for c in concepts]
    batch = make_batch(world, [(t, c, False) for t, c in pairs])
    logits = model(batch.tokens[:, :-1])
    p_refuse = logits[:, 3].softmax(-1)[:, REFUSE]
    logits[:, :, REFUSE] = -math.inf  # knowledge path: bypass the refusal token
    target = batch.tokens[:, 1:]
    logp = logits.log_softmax(-1).gather(-1, target[..., None])[..., 0]
    ans = slice(3, 3 + world.answer_len)
    ppl = torch.exp(-logp[:, ans].mean(1))
    rest = slice(4, 3 + world.answer_len)  # the continuation after the first answer token
    known = (logits[:, rest].argmax(-1) == target[:, rest]).double().mean(1)
    shape = (len(tasks), len(concepts))
    return (p_refuse.numpy().reshape(shape), ppl.numpy().reshape(shape),
            known.numpy().reshape(shape))  # fmt: skip


@torch.no_grad()
def _greedy_answer(
    model: nn.Module, world: World, tasks: list[int], concepts: list[int], prefill: int
) -> np.ndarray:
    """1 where greedy decoding after ``prefill`` forced answer tokens gives the rest of the answer."""
    pairs = [(t, c) for t in tasks for c in concepts]
    tokens = torch.tensor([encode(world, t, c, False)[0] for t, c in pairs])
    seq = tokens[:, : 4 + prefill].clone()
    for _ in range(world.answer_len - prefill):
        nxt = model(seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    ok = (seq[:, 4:] == tokens[:, 4 : 4 + world.answer_len]).all(1)
    return ok.float().numpy().reshape(len(tasks), len(concepts))


def concept_table(model: nn.Module, world: World, tasks: list[int] | None = None) -> ConceptTable:
    """Per-concept metrics averaged over ``tasks`` (default: the held-out task)."""
    model.eval()
    tasks = [world.heldout_task] if tasks is None else tasks
    unsafe = list(range(world.concepts))
    safe = [c + world.concepts for c in unsafe]
    r, ppl, known = _first_token_and_ppl(model, world, tasks, unsafe)
    o, _, _ = _first_token_and_ppl(model, world, tasks, safe)
    ext = _greedy_answer(model, world, tasks, unsafe, prefill=1)
    safe_ext = _greedy_answer(model, world, tasks, safe, prefill=0)
    return ConceptTable(r.mean(0), o.mean(0), ppl.mean(0), known.mean(0), ext.mean(0),
                        safe_ext.mean(0))  # fmt: skip


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (0 when either side is constant)."""
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    return float(spearmanr(a, b).statistic)


class FinetuneReport(TypedDict):
    """``finetune_report``: the world, the fine-tuned model, the per-concept example counts n_c,
    the concept table before and after, and the rank correlation of n_c with refusal after."""

    world: World
    model: nn.Module
    counts: np.ndarray
    before: ConceptTable
    after: ConceptTable
    spearman_n_refusal: float


def finetune_report(
    seed: int, config: FinetuneConfig, world: World | None = None
) -> FinetuneReport:
    """Pretrain (cached), fine-tune with ``config`` and measure before/after on the held-out task."""
    world = make_world(seed) if world is None else world
    model: nn.Module = pretrained_model(seed, world)
    before = concept_table(model, world)
    model, counts = safety_finetune(model, world, config, seed)
    after = concept_table(model, world)
    return {
        "world": world,
        "model": model,
        "counts": counts,
        "before": before,
        "after": after,
        "spearman_n_refusal": spearman(counts.astype(float), after.refusal),
    }


# ---------------------------------------------------------------------------------------------
# 5. registration: clients own skewed, complementary concept coverage; FedAvg
# ---------------------------------------------------------------------------------------------


def client_counts(
    partition_id: int, concepts: int, per_client: int, stride: int, budget: int, zipf_s: float
) -> np.ndarray:
    """Client k covers concepts ``stride*k .. stride*k + per_client - 1 (mod C)`` with Zipf counts
    (its first concept most); across clients the union is roughly uniform."""
    covered = [(stride * partition_id + i) % concepts for i in range(per_client)]
    local = concept_counts("zipf", budget, per_client, zipf_s)
    counts = np.zeros(concepts, dtype=int)
    for c, n in zip(covered, local, strict=True):
        counts[c] += n
    return counts


@dataclass
class ClientData:
    counts: np.ndarray
    batch: Batch


@WORKLOADS.register(
    "concept-safety", "Concept-level safety fine-tuning of a tiny GPT (refusal vs knowledge)"
)
class ConceptSafety(Workload):
    """Each client safety-fine-tunes the shared pretrained GPT on its own concept coverage.

    The server reports, every round, the per-concept table on the held-out task
    (``refusal_c{c}``, ``over_refusal_c{c}``, ``extraction_c{c}``, ``knowledge_c{c}``,
    ``ppl_c{c}``) and its summary.
    """

    @dataclass(frozen=True)
    @defaults(budget=24)  # unsafe samples per client
    class Params(FinetuneSetup):
        tasks: int = param(4, ge=1)
        concepts: int = param(12, ge=1)
        answer_len: int = param(3, ge=1)
        dim: int = param(64, ge=1)
        pretrain_steps: int = param(200, ge=0)
        pretrain_lr: float = param(5e-3, gt=0)
        concepts_per_client: int = param(6, ge=1)
        stride: int = param(3, ge=1)
        local_steps: int = param(20, ge=0)  # full-batch SGD steps per round

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        p = self.params
        self.world = make_world(self.ctx.seed, p.tasks, p.concepts, p.answer_len)
        self.spec = ModelSpec(dim=p.dim)

    def _model(self, arrays: ArrayRecord | None = None) -> TinyGPT:
        if arrays is None:
            p = self.params
            return pretrained_model(self.ctx.seed, self.world, self.spec, p.pretrain_steps,
                                    p.pretrain_lr)  # fmt: skip
        model = build_model(self.world, self.spec)
        model.load_state_dict(arrays.to_torch_state_dict())
        return model

    def load_partition(self, partition_id: int, num_partitions: int) -> ClientData:
        p = self.params
        counts = client_counts(partition_id, p.concepts, p.concepts_per_client, p.stride,
                               p.budget, p.zipf_s)  # fmt: skip
        rng = np.random.default_rng(client_seed(self.ctx.seed, partition_id, 0, salt=9))
        examples = safety_examples(self.world, counts, p.safe_per_unsafe, rng)
        return ClientData(counts, make_batch(self.world, examples))

    def init_arrays(self) -> ArrayRecord:
        return ArrayRecord(self._model().state_dict())

    def fit(
        self, arrays: ArrayRecord, data: ClientData, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        model = self._model(arrays)
        torch.manual_seed(client_seed(self.ctx.seed, config["partition-id"],
                                      config["server-round"]))  # fmt: skip
        p = self.params
        loss = finetune_steps(model, data.batch, p.local_steps, p.lr, p.trainable)
        local = concept_table(model, self.world).summary()
        metrics = {"num-examples": len(data.batch), "loss": loss}
        metrics |= {f"local_{k}": v for k, v in local.items()}
        return ArrayRecord(model.state_dict()), metrics

    def evaluate(self, arrays: ArrayRecord, data: ClientData, config: RoundConfig):
        table = concept_table(self._model(arrays), self.world)
        covered = data.counts > 0
        return {
            "num-examples": len(data.batch),
            "refusal_covered": float(table.refusal[covered].mean()),
            "refusal_uncovered": float(table.refusal[~covered].mean()) if (~covered).any() else 1.0,
        }

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        table = concept_table(self._model(arrays), self.world)
        metrics = table.summary()
        for c in range(self.world.concepts):
            metrics[f"refusal_c{c:02d}"] = float(table.refusal[c])
            metrics[f"over_refusal_c{c:02d}"] = float(table.over_refusal[c])
            metrics[f"extraction_c{c:02d}"] = float(table.extraction[c])
            metrics[f"knowledge_c{c:02d}"] = float(table.knowledge[c])
            metrics[f"ppl_c{c:02d}"] = float(table.ppl[c])
        return metrics
