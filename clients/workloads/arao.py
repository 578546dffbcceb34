"""ARAO: axis-aligned rhetorical adversarial optimisation and repair of a harmful-content detector.

Method page: docs/methods/arao.md. Rhetoric is an axis-aligned strategy space: K axes (hedging,
euphemism, authority appeal, irony, question framing, narrative distance), each with direction
-1/0/+1. A rewriter turns a strategy vector into one non-contradictory rewrite that keeps the
claim's intent and target; a planner (cross-entropy method) searches strategy vectors that lower the
detector's harmful score. Resetting one axis at a time attributes each successful evasion to
mechanisms, and axis-targeted adversarial training on the top axes repairs the detector; the
ablation is untargeted adversarial training (random strategy vectors) at the same budget.

The corpus is generated: claims with topic, stance and target. A *planted vulnerability* makes
one axis (``vulnerable_axis``) exploitable: in the training distribution its +1 direction is
almost never used on harmful claims (for the euphemism axis, the ambiguous phrases such as "take
care of" otherwise appear only in benign claims). Condemnations that quote harm verbs, neutral
uses of the ambiguous phrases and label noise keep the clean task below AUC 1.0.

Federated: detector weights are FedAvg'd; an ``attr`` array rides along in the model record, so
FedAvg averages the clients' attribution vectors and the broadcast average names the global top
axes for the repair rounds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from scipy import sparse
from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.metrics import roc_auc_score
from torch import nn

from flowerbed.clients.core.params import choices, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload

# ---------------------------------------------------------------------------------------------
# 1. Data: claims (topic, stance, target, intent) and the rhetorical rewriter
# ---------------------------------------------------------------------------------------------

AXES = ("hedging", "euphemism", "authority", "irony", "question", "narrative")
K = len(AXES)
EUPHEMISM = AXES.index("euphemism")

TOPICS = {
    "housing": ("the landlords", "the new tenants", "the housing officer", "over the rent rise"),
    "elections": ("the council members", "the poll workers", "the candidate", "after the count"),
    "health": ("the clinic staff", "the vaccine researchers", "the pharmacist", "about the trial"),
    "sport": ("the referee", "the visiting fans", "the coach", "after the match"),
    "work": ("the managers", "the union organisers", "the new hires", "over the layoffs"),
    "press": ("the journalists", "the editor", "the camera crew", "about the report"),
}
TOPIC_NAMES = tuple(TOPICS)
# Harm intents: literal form, euphemism (None: no euphemism exists, the attack must use others).
HARM = (
    ("attack", "take care of"),
    ("beat up", "pay a visit to"),
    ("hurt", "deal with"),
    ("threaten", "have a word with"),
    ("burn down the house of", "sort things out with"),
    ("poison", None),
    ("run over", None),
    ("stab", None),
)
# Benign intents: literal form and register-shifted (+1) form; shares the ambiguous phrases.
BENIGN = (
    ("help", "take care of"),
    ("visit", "pay a visit to"),
    ("respond to", "deal with"),
    ("talk to", "have a word with"),
    ("reconcile with", "sort things out with"),
    ("thank", "show some love to"),
    ("interview", "sit down with"),
    ("vote against", "say no to"),
)
# Borderline intents: annotators split (labelled harmful with probability 1/2 when endorsed).
BORDERLINE = ("show up at the home of", "post the address of", "follow")
GRIEVANCE = ("for what they did", "they had it coming", "to make them pay")
REASON = ("to say thanks", "since they are new here", "because they asked")
ENDORSE = ("we should {c}", "someone needs to {c}", "it is time to {c}", "let us {c}")
CONDEMN = ("nobody should {c}", "it would be wrong to {c}", "we must never {c}")
TIMES = ("tonight", "this weekend", "tomorrow", "after work", "soon")
# Per axis: (-1 forms, +1 forms). Wrappers take the sentence ``{s}``.
STYLE = {
    "hedging": (("honestly, {s}", "{s}, no doubt"), ("maybe {s}", "perhaps {s}", "i guess {s}")),
    "authority": (
        ("as everyone on the street knows, {s}", "people keep saying {s}"),
        ("experts agree that {s}", "according to the official report, {s}"),
    ),
    "irony": (
        ("{s}, and i mean it", "{s}, seriously"),
        ("{s}, what a lovely idea", "{s}, how fun"),
    ),
    "question": (("{s}!", "{s}, right now!"), ("why not say {s}?", "would it be so bad if {s}?")),
    "narrative": (
        ("i myself think {s}", "i am telling you {s}"),
        ("in my novel a character says {s}", "a man at the bar told me {s}"),
    ),
}


@dataclass(frozen=True)
class Claim:
    topic: int
    target: int  # index into the topic's three targets
    stance: int  # 1 endorse, 0 condemn
    harmful_intent: bool
    intent: int  # index into HARM / BENIGN, or into BORDERLINE when ``borderline``
    borderline: bool
    reason: int  # -1: none; else index into GRIEVANCE (harmful intents) or REASON (others)
    template: int
    time: int
    label: int  # 1 harmful (after label noise in training data)


def rewrite(claim: Claim, strategy: np.ndarray, variant: int = 0) -> str:
    """Render ``claim`` under ``strategy`` (one direction per axis; 0 = canonical).

    Every rewrite keeps the target and the intent (literal, or its euphemism when the euphemism
    axis is +1 and one exists); axes act on disjoint parts of the sentence, so they compose.
    """
    targets = TOPICS[TOPIC_NAMES[claim.topic]]
    if claim.borderline:
        literal, register = BORDERLINE[claim.intent], None
    else:
        literal, register = (HARM if claim.harmful_intent else BENIGN)[claim.intent]
    verb = register if strategy[EUPHEMISM] > 0 and register else literal
    if strategy[EUPHEMISM] < 0:
        verb = f"really {verb}"
    clause = f"{verb} {targets[claim.target]} {TIMES[claim.time]} {targets[3]}"
    if claim.reason >= 0:
        clause += " " + (GRIEVANCE if claim.harmful_intent else REASON)[claim.reason]
    frames = ENDORSE if claim.stance else CONDEMN
    sentence = frames[claim.template % len(frames)].format(c=clause)
    for axis in ("question", "hedging", "authority", "narrative", "irony"):
        direction = int(strategy[AXES.index(axis)])
        if direction:
            forms = STYLE[axis][0 if direction < 0 else 1]
            sentence = forms[(variant + claim.intent) % len(forms)].format(s=sentence)
    return sentence


def sample_claims(
    n: int, rng: np.random.Generator, topic_weights: np.ndarray | None = None,
    label_noise: float = 0.0,
) -> list[Claim]:  # fmt: skip
    """``n`` claims; endorsed harmful intents are harmful, endorsed borderline ones half the time.

    Harmful intents usually carry a grievance, other intents a benign reason: the cue that lets a
    repaired detector catch euphemised claims (the claim itself is never changed by a rewrite).
    """
    weights = np.full(len(TOPICS), 1 / len(TOPICS)) if topic_weights is None else topic_weights
    claims = []
    for _ in range(n):
        kind = rng.random()
        harmful_intent, borderline = bool(kind < 0.55), bool(kind > 0.9)
        stance = int(rng.random() < (0.75 if harmful_intent else 0.8))
        label = int(stance == 1 and (harmful_intent or (borderline and rng.random() < 0.5)))
        if rng.random() < label_noise:
            label = 1 - label
        claims.append(
            Claim(
                topic=int(rng.choice(len(TOPICS), p=weights)),
                target=int(rng.integers(3)),
                stance=stance,
                harmful_intent=harmful_intent,
                intent=int(
                    rng.integers(
                        len(BORDERLINE) if borderline else len(HARM if harmful_intent else BENIGN)
                    )
                ),
                borderline=borderline,
                reason=int(rng.integers(3)) if rng.random() < 0.7 else -1,
                template=int(rng.integers(12)),
                time=int(rng.integers(len(TIMES))),
                label=label,
            )
        )
    return claims


def natural_strategies(
    claims: list[Claim], rng: np.random.Generator, vulnerable_axis: int, skew: float = 0.97
) -> np.ndarray:
    """Styles as they occur in the wild: uniform on every axis, except that harmful claims
    almost never use the +1 direction of ``vulnerable_axis`` (the planted blind spot)."""
    s = rng.integers(-1, 2, size=(len(claims), K))
    for i, claim in enumerate(claims):
        if claim.label == 1 and s[i, vulnerable_axis] == 1 and rng.random() < skew:
            s[i, vulnerable_axis] = rng.choice([-1, 0])
    return s


def render(claims: list[Claim], strategies: np.ndarray, rng: np.random.Generator) -> list[str]:
    variants = rng.integers(0, 6, size=len(claims))
    return [rewrite(c, s, int(v)) for c, s, v in zip(claims, strategies, variants, strict=True)]


@dataclass
class Corpus:
    texts: list[str]
    labels: np.ndarray
    claims: list[Claim]
    strategies: np.ndarray


def make_corpus(
    n: int, seed: int, vulnerable_axis: int = EUPHEMISM, label_noise: float = 0.0,
    topic_weights: np.ndarray | None = None,
) -> Corpus:  # fmt: skip
    rng = np.random.default_rng(seed)
    claims = sample_claims(n, rng, topic_weights, label_noise)
    strategies = natural_strategies(claims, rng, vulnerable_axis)
    labels = np.array([c.label for c in claims])
    return Corpus(render(claims, strategies, rng), labels, claims, strategies)


# ---------------------------------------------------------------------------------------------
# 2. Model: hashed 1-2-grams (one feature space for every client) + linear or small MLP head
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def vectoriser(n_features: int) -> HashingVectorizer:
    return HashingVectorizer(n_features=n_features, ngram_range=(1, 2), alternate_sign=False)


_HASHED: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}


def featurise(texts: list[str], n_features: int) -> sparse.csr_matrix:
    """Hashed 1-2-gram counts, L2-normalised; rewrites repeat during a search, so each distinct
    text is hashed once."""
    missing = list({t for t in texts if (t, n_features) not in _HASHED})
    if missing:
        if len(_HASHED) > 500_000:
            _HASHED.clear()
        x = vectoriser(n_features).transform(missing).tocsr()
        for i, text in enumerate(missing):
            row = slice(x.indptr[i], x.indptr[i + 1])
            _HASHED[(text, n_features)] = (x.indices[row], x.data[row].astype(np.float32))
    rows = [_HASHED[(t, n_features)] for t in texts]
    indptr = np.r_[0, np.cumsum([len(r[0]) for r in rows])]
    indices = np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, np.int32)
    data = np.concatenate([r[1] for r in rows]) if rows else np.zeros(0, np.float32)
    return sparse.csr_matrix((data, indices, indptr), shape=(len(texts), n_features))


if TYPE_CHECKING:
    from torch.autograd.function import BackwardCFunction

    class _SparseCtx(BackwardCFunction):
        """The autograd context of :class:`_SparseMatmul`: it keeps the fixed ``X``."""

        x: sparse.csr_matrix


class _SparseMatmul(torch.autograd.Function):
    """``X @ W`` for a fixed scipy CSR ``X``; the backward is ``X^T @ grad`` (fast on CPU)."""

    @staticmethod
    def forward(ctx: _SparseCtx, weight: torch.Tensor, x: sparse.csr_matrix) -> torch.Tensor:
        ctx.x = x
        return torch.from_numpy(np.asarray(x @ weight.detach().numpy()))

    @staticmethod
    def backward(ctx: _SparseCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.from_numpy(np.asarray(ctx.x.T @ grad.numpy())), None


class Detector(nn.Module):
    """``hidden = 0``: logistic regression; ``hidden > 0``: one ReLU layer."""

    def __init__(self, n_features: int, hidden: int = 0) -> None:
        super().__init__()
        self.n_features, self.hidden = n_features, hidden
        self.w = nn.Parameter(torch.zeros(n_features, hidden or 1))
        self.b = nn.Parameter(torch.zeros(hidden or 1))
        self.out = nn.Linear(hidden, 1) if hidden else None
        if hidden:
            nn.init.normal_(self.w, std=0.1)

    def forward(self, x: sparse.csr_matrix) -> torch.Tensor:
        z = _SparseMatmul.apply(self.w, x) + self.b
        if self.out is not None:
            z = self.out(torch.relu(z))
        return z.squeeze(-1)


def score(model: Detector, texts: list[str], n_features: int) -> np.ndarray:
    """Harmful probability of each text."""
    with torch.no_grad():
        return torch.sigmoid(model(featurise(texts, n_features))).numpy()


# ---------------------------------------------------------------------------------------------
# 3. Local steps: training, the planner (attack), attribution and repair
# ---------------------------------------------------------------------------------------------


@dataclass
class ARAOConfig:
    """Detector, planner and repair knobs (also the first fields of the workload params)."""

    n_features: int = param(2**14, ge=1)
    hidden: int = param(0, ge=0)  # 0: logistic regression; > 0: one ReLU layer
    epochs: int = param(60, ge=1)
    lr: float = param(0.1, gt=0)
    l2: float = param(1e-4, ge=0)
    cem_iters: int = param(4, ge=1)
    cem_samples: int = param(12, ge=1)
    cem_elite: int = param(3, ge=1)
    threshold: float = param(0.5, gt=0, lt=1)
    repair_budget: int = param(100, ge=0)
    repair_top: int = param(1, ge=1)


def train_detector(
    model: Detector, texts: list[str], labels: np.ndarray, cfg: ARAOConfig, seed: int
) -> float:
    """Full-batch Adam on weighted BCE (classes balanced) + L2; returns the final loss."""
    torch.manual_seed(seed)
    x = featurise(texts, cfg.n_features)
    y = torch.from_numpy(labels.astype(np.float32))
    pos = float(y.mean())
    weight = torch.where(y > 0, 0.5 / max(pos, 1e-6), 0.5 / max(1 - pos, 1e-6))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loss = torch.tensor(0.0)
    for _ in range(cfg.epochs):
        optimizer.zero_grad()
        bce = nn.functional.binary_cross_entropy_with_logits(model(x), y, weight=weight)
        loss = bce + cfg.l2 * sum((p**2).sum() for p in model.parameters())
        loss.backward()
        optimizer.step()
    return float(loss.detach())


@dataclass
class Attack:
    strategies: np.ndarray  # best strategy per claim
    scores: np.ndarray  # detector score of the best rewrite
    texts: list[str]
    success: np.ndarray  # score below the threshold
    queries: int


def plan_attack(model: Detector, claims: list[Claim], cfg: ARAOConfig, seed: int) -> Attack:
    """Cross-entropy method per claim over {-1,0,1}^K, minimising the harmful score."""
    rng = np.random.default_rng(seed)
    n = len(claims)
    probs = np.full((n, K, 3), 1 / 3)
    best_s = np.zeros((n, K), dtype=np.int64)
    best_text = [rewrite(c, best_s[i]) for i, c in enumerate(claims)]
    best = score(model, best_text, cfg.n_features)
    queries = n
    for _ in range(cfg.cem_iters):
        cum = probs.cumsum(-1)
        u = rng.random((n, cfg.cem_samples, K, 1))
        cand = (u > cum[:, None]).sum(-1) - 1  # (n, samples, K) in {-1, 0, 1}
        texts = [rewrite(claims[i], cand[i, j]) for i in range(n) for j in range(cfg.cem_samples)]
        sc = score(model, texts, cfg.n_features).reshape(n, cfg.cem_samples)
        queries += len(texts)
        order = np.argsort(sc, axis=1)[:, : cfg.cem_elite]
        for i in range(n):
            elites = cand[i, order[i]]
            freq = np.stack([(elites == d).mean(0) for d in (-1, 0, 1)], -1)
            probs[i] = 0.3 * probs[i] + 0.7 * freq
            j = order[i, 0]
            if sc[i, j] < best[i]:
                best[i], best_s[i], best_text[i] = (
                    sc[i, j],
                    cand[i, j],
                    texts[i * cfg.cem_samples + j],
                )
    return Attack(best_s, best, best_text, best < cfg.threshold, queries)


def attribute(model: Detector, claims: list[Claim], attack: Attack, cfg: ARAOConfig) -> np.ndarray:
    """Mean rise of the harmful score when one axis of a successful attack is reset to 0."""
    idx = np.flatnonzero(attack.success)
    attr = np.zeros(K)
    if len(idx) == 0:
        return attr
    texts = []
    for i in idx:
        for a in range(K):
            s = attack.strategies[i].copy()
            s[a] = 0
            texts.append(rewrite(claims[i], s))
    reset = score(model, texts, cfg.n_features).reshape(len(idx), K)
    return (reset - attack.scores[idx, None]).mean(0)


def repair_set(
    claims: list[Claim], cfg: ARAOConfig, rng: np.random.Generator,
    top_axes: list[int] | None, directions: np.ndarray | None = None,
) -> tuple[list[str], np.ndarray]:  # fmt: skip
    """``repair_budget`` adversarial examples, half harmful, half benign (so style stays no cue).

    Targeted (``top_axes``): only those axes vary, each in the attack's observed direction
    (``directions``, default +1); every other axis is canonical. Untargeted: uniform vectors.
    """
    harmful = [c for c in claims if c.label == 1]
    benign = [c for c in claims if c.label == 0]
    texts, labels = [], []
    for pool, label in ((harmful, 1), (benign, 0)):
        picks = rng.integers(len(pool), size=cfg.repair_budget // 2)
        for p in picks:
            if top_axes is None:
                s = rng.integers(-1, 2, size=K)
            else:
                s = np.zeros(K, dtype=np.int64)
                for a in top_axes:
                    s[a] = 1 if directions is None else int(directions[a]) or 1
            texts.append(rewrite(pool[p], s, int(rng.integers(6))))
            labels.append(label)
    return texts, np.array(labels)


def attack_directions(attack: Attack) -> np.ndarray:
    """Most common non-zero direction per axis among successful attacks (+1 if none)."""
    s = attack.strategies[attack.success]
    return np.where((s == -1).sum(0) > (s == 1).sum(0), -1, 1) if len(s) else np.ones(K, int)


# ---------------------------------------------------------------------------------------------
# 4. Metrics and the local experiment (base, untargeted repair, targeted repair)
# ---------------------------------------------------------------------------------------------


def auc(model: Detector, texts: list[str], labels: np.ndarray, n_features: int) -> float:
    return float(roc_auc_score(labels, score(model, texts, n_features)))


def attacked_auc(
    model: Detector, attacked_texts: list[str], benign_texts: list[str], n_features: int
) -> float:
    """AUC on the attacked set: attacked harmful rewrites vs benign texts in all styles."""
    labels = np.r_[np.ones(len(attacked_texts)), np.zeros(len(benign_texts))]
    return auc(model, attacked_texts + benign_texts, labels, n_features)


def clone(model: Detector) -> Detector:
    copy = Detector(model.n_features, model.hidden)
    copy.load_state_dict(model.state_dict())
    return copy


class ArmScores(TypedDict):
    """One repair arm of ``run_local``: detection AUCs clean, under the attack, under a new attack."""

    clean_auc: float
    attacked_auc: float
    reattacked_auc: float
    reattack_success_rate: float


class LocalRun(TypedDict):
    """``run_local``: the attack's attribution over axes, the axes repaired, the attack's success
    and the scores of each repair arm (``base``, ``untargeted``, ``targeted``)."""

    attr: np.ndarray
    top_axes: list[np.intp]
    attack_success_rate: float
    rows: dict[str, ArmScores]


def run_local(
    seed: int, cfg: ARAOConfig | None = None, vulnerable_axis: int = EUPHEMISM,
    n_train: int = 1500, n_test: int = 600, n_attack: int = 120, label_noise: float = 0.05,
) -> LocalRun:  # fmt: skip
    """The whole ARAO pipeline on one machine; returns every number the docs report."""
    torch.set_num_threads(1)
    cfg = cfg or ARAOConfig()
    train = make_corpus(n_train, seed, vulnerable_axis, label_noise)
    test = make_corpus(n_test, seed + 10_000, vulnerable_axis)
    base = Detector(cfg.n_features, cfg.hidden)
    train_detector(base, train.texts, train.labels, cfg, seed)
    benign_test = [t for t, y in zip(test.texts, test.labels, strict=True) if y == 0]
    targets = [c for c in test.claims if c.label == 1][:n_attack]
    attack = plan_attack(base, targets, cfg, seed + 1)
    attr = attribute(base, targets, attack, cfg)
    top = list(np.argsort(-attr)[: cfg.repair_top])
    out: LocalRun = {
        "attr": attr,
        "top_axes": top,
        "attack_success_rate": float(attack.success.mean()),
        "rows": {},
    }
    arms = {
        "base": None,
        "untargeted": repair_set(train.claims, cfg, np.random.default_rng(seed + 2), None),
        "targeted": repair_set(
            train.claims, cfg, np.random.default_rng(seed + 2), top, attack_directions(attack)
        ),
    }
    for name, extra in arms.items():
        model = base
        if extra is not None:
            model = clone(base)
            texts, labels = train.texts + extra[0], np.r_[train.labels, extra[1]]
            train_detector(model, texts, labels, cfg, seed)
        re_attack = plan_attack(model, targets, cfg, seed + 3)
        out["rows"][name] = {
            "clean_auc": auc(model, test.texts, test.labels, cfg.n_features),
            "attacked_auc": attacked_auc(model, attack.texts, benign_test, cfg.n_features),
            "reattacked_auc": attacked_auc(model, re_attack.texts, benign_test, cfg.n_features),
            "reattack_success_rate": float(re_attack.success.mean()),
        }
    return out


# ---------------------------------------------------------------------------------------------
# 5. Registration: the federated workload
# ---------------------------------------------------------------------------------------------


@dataclass
class ClientData:
    train: Corpus
    test: Corpus


Repair = choices("Repair", ("targeted", "untargeted", "none"))


@WORKLOADS.register("arao", "ARAO rhetorical attack, attribution and axis-targeted repair")
class ARAO(Workload):
    """Rounds ``1..train_rounds``: FedAvg training. Round ``train_rounds + 1``: every client
    attacks the received global detector on its own harmful claims and returns its attribution
    vector (``attr``) and attack directions (``attr_dir``) inside the model record, so FedAvg
    averages them. Later rounds: repair (``targeted`` on the global top axes, ``untargeted`` or
    ``none``) at ``repair_budget`` examples per client and round."""

    reads = frozenset({"clients.alpha"})  # Dirichlet topic mixtures per client

    @dataclass
    class Params(ARAOConfig):
        """The method code takes these as its ``ARAOConfig``."""

        n_train: int = param(600, ge=1)
        n_test: int = param(300, ge=1)
        n_attack: int = param(40, ge=1)
        label_noise: float = param(0.05, ge=0, lt=1)
        vulnerable_axis: int = param(EUPHEMISM, ge=0, lt=K)  # index into AXES
        train_rounds: int = param(1, ge=1)
        repair: Repair = Repair("targeted")  # targeted | untargeted | none

    params: Params

    def _unpack(self, arrays: ArrayRecord) -> tuple[Detector, np.ndarray, np.ndarray]:
        state = arrays.to_torch_state_dict()
        attr, directions = state.pop("attr").numpy(), state.pop("attr_dir").numpy()
        model = Detector(self.params.n_features, self.params.hidden)
        model.load_state_dict(state)
        return model, attr, directions

    @staticmethod
    def _pack(model: Detector, attr: np.ndarray, directions: np.ndarray) -> ArrayRecord:
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        state["attr"] = torch.as_tensor(attr, dtype=torch.float32)
        state["attr_dir"] = torch.as_tensor(directions, dtype=torch.float32)
        return ArrayRecord(state)

    def load_partition(self, partition_id: int, num_partitions: int) -> ClientData:
        seed, p = self.ctx.seed, self.params
        rng = np.random.default_rng(client_seed(seed, partition_id, 0))
        topics = rng.dirichlet(np.full(len(TOPICS), cast(float, self.ctx.alpha) * 4))
        train_seed = client_seed(seed, partition_id, 0, salt=1)
        test_seed = client_seed(seed, partition_id, 0, salt=2)
        return ClientData(
            make_corpus(p.n_train, train_seed, p.vulnerable_axis, p.label_noise, topics),
            make_corpus(p.n_test, test_seed, p.vulnerable_axis, 0.0, topics),
        )

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.ctx.seed)
        model = Detector(self.params.n_features, self.params.hidden)
        return self._pack(model, np.zeros(K), np.zeros(K))

    def fit(
        self, arrays: ArrayRecord, data: ClientData, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        model, attr, directions = self._unpack(arrays)
        server_round = int(config["server-round"])
        seed = client_seed(self.ctx.seed, config["partition-id"], server_round)
        rng = np.random.default_rng(seed)
        texts, labels = data.train.texts, data.train.labels
        metrics: dict[str, float] = {"num-examples": len(texts)}
        phase = server_round - self.params.train_rounds
        if phase == 1:  # red-team round: attack the global detector, attribute, send attr
            pool = [c for c in data.train.claims if c.label == 1][: self.params.n_attack]
            attack = plan_attack(model, pool, self.params, seed)
            attr = attribute(model, pool, attack, self.params)
            directions = attack_directions(attack).astype(float)
            metrics["attack_success_rate"] = float(attack.success.mean())
            metrics.update({f"attr_axis{k}": float(attr[k]) for k in range(K)})
        elif phase > 1 and self.params.repair != "none":
            top = None
            if self.params.repair == "targeted":
                top = list(np.argsort(-attr)[: self.params.repair_top])
            extra_texts, extra_labels = repair_set(
                data.train.claims, self.params, rng, top, np.sign(directions)
            )
            texts, labels = texts + extra_texts, np.r_[labels, extra_labels]
        metrics["loss"] = train_detector(model, texts, labels, self.params, seed)
        return self._pack(model, attr, directions), metrics

    def _report(self, model: Detector, corpus: Corpus, seed: int) -> dict[str, float]:
        benign = [t for t, y in zip(corpus.texts, corpus.labels, strict=True) if y == 0]
        pool = [c for c in corpus.claims if c.label == 1][: self.params.n_attack]
        attack = plan_attack(model, pool, self.params, seed)
        n = self.params.n_features
        return {
            "clean_auc": auc(model, corpus.texts, corpus.labels, n),
            "attacked_auc_adaptive": attacked_auc(model, attack.texts, benign, n),
            "attack_success_rate": float(attack.success.mean()),
        }

    def evaluate(self, arrays: ArrayRecord, data: ClientData, config: RoundConfig):
        model, _, _ = self._unpack(arrays)
        seed = client_seed(self.ctx.seed, config["partition-id"], 0, salt=3)
        return {"num-examples": len(data.test.texts), **self._report(model, data.test, seed)}

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        model, attr, _ = self._unpack(arrays)
        test = make_corpus(2 * self.params.n_test, self.ctx.seed + 777, self.params.vulnerable_axis)
        out = self._report(model, test, self.ctx.seed + 778)
        out.update({f"attr_axis{k}": float(attr[k]) for k in range(K)})
        return out
