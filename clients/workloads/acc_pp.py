"""ACC++: prompt-specific circuits traced from one cached forward pass (Franco et al., 2602.13483).

A tiny attention-only transformer (no LayerNorm, no biases, so the residual stream is exactly
linear in its components) is trained on a synthetic IOI-like task written in four "languages"
with designed relatedness. ACC++ decomposes one attention score ``a_ds`` of a head into terms per
upstream component (embedding or upstream head), source position and singular direction of
``Omega = W_Q W_K^T``, on the destination and on the source side; orders the terms by
Integrated Gradients of the softmax weight; greedily removes terms until the weight falls below
a threshold; and recurses into the upstream heads it selected. The selected (component, k)
pairs are the "signals". Federated: each client is a language community, FedAvg trains the
shared model, and each client reports only circuit summaries (head and signal frequencies);
:func:`client_circuits` / :func:`circuit_distances` are the server-side analysis.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypedDict

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from flowerbed.clients.core.params import param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload

# ---------------------------------------------------------------------------------------------
# 1. Data: IOI-like prompts in four languages
# ---------------------------------------------------------------------------------------------

NUM_NAMES = 12
BOS, AND, END = 0, 1, 2
NAME0 = 3  # names are tokens NAME0 .. NAME0 + NUM_NAMES - 1
TEMPLATE0 = NAME0 + NUM_NAMES
SLOTS = 4  # template slots per prompt, two alternative tokens per slot
POOL = 2 * SLOTS
SEQ_LEN = 10
# Word orders: "A"/"B" are the first/second name of the pair, "R" the repeated (subject) name.
ORDER_SVO = ["BOS", "t0", "A", "AND", "B", "t1", "t2", "R", "t3", "END"]
ORDER_OTHER = ["BOS", "t0", "R", "t1", "A", "AND", "B", "t2", "t3", "END"]
LANGUAGES = 4


def _language_pools() -> list[list[int]]:
    """Template token pools: L2 shares 75 % of L1's, L3 25 %, L4 none (and has another order)."""
    next_token = TEMPLATE0 + POOL
    pools = [list(range(TEMPLATE0, TEMPLATE0 + POOL))]
    for shared in (6, 2, 0):
        own = list(range(next_token, next_token + POOL - shared))
        next_token += POOL - shared
        pools.append(pools[0][:shared] + own)
    return pools


POOLS = _language_pools()
VOCAB = TEMPLATE0 + POOL + sum(POOL - s for s in (6, 2, 0))


def language_order(language: int) -> list[str]:
    return ORDER_OTHER if language == 3 else ORDER_SVO


@dataclass
class Prompts:
    tokens: torch.Tensor  # (n, SEQ_LEN)
    io: torch.Tensor  # (n,) indirect-object name token
    s: torch.Tensor  # (n,) subject name token
    io_pos: torch.Tensor  # (n,) position of the IO name
    s_pos: torch.Tensor  # (n,) position of the first subject name
    language: torch.Tensor  # (n,)
    abba: torch.Tensor  # (n,) True: IO first (ABBA), False: BABA


def make_prompts(language: int, n: int, seed: int) -> Prompts:
    """``n`` random prompts of one language; the answer at END is the non-repeated name."""
    rng = np.random.default_rng(seed)
    order = language_order(language)
    pool = POOLS[language]
    rows, ios, ss, io_pos, s_pos, abba = [], [], [], [], [], []
    for _ in range(n):
        io, s = (NAME0 + rng.choice(NUM_NAMES, 2, replace=False)).tolist()
        first_is_io = bool(rng.random() < 0.5)
        pair = {"A": io if first_is_io else s, "B": s if first_is_io else io}
        row = []
        for slot in order:
            if slot == "BOS":
                row.append(BOS)
            elif slot == "AND":
                row.append(AND)
            elif slot == "END":
                row.append(END)
            elif slot == "R":
                row.append(s)
            elif slot in pair:
                row.append(pair[slot])
            else:
                t = int(slot[1])
                row.append(pool[2 * t + int(rng.integers(2))])
        rows.append(row)
        ios.append(io)
        ss.append(s)
        io_pos.append(order.index("A" if first_is_io else "B"))
        s_pos.append(order.index("B" if first_is_io else "A"))
        abba.append(first_is_io)
    as_tensor = torch.tensor
    return Prompts(as_tensor(rows), as_tensor(ios), as_tensor(ss), as_tensor(io_pos), as_tensor(s_pos),
                   torch.full((n,), language), as_tensor(abba))  # fmt: skip


def concat(prompts: list[Prompts]) -> Prompts:
    return Prompts(*(torch.cat([getattr(p, f) for p in prompts]) for f in Prompts.__annotations__))


# ---------------------------------------------------------------------------------------------
# 2. Model: attention-only transformer with an exactly linear residual stream
# ---------------------------------------------------------------------------------------------

#: ``edit(layer, x_q, x_k) -> (x_q, x_k)`` changes the per-head query/key inputs (B, H, T, D)
Edit = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class AttnOnly(nn.Module):
    """Token + learned position embeddings, ``layers`` attention-only layers, linear unembedding."""

    def __init__(self, vocab: int = VOCAB, d_model: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.d_head = d_model // heads
        self.tok = nn.Parameter(torch.randn(vocab, d_model) * 0.5)
        self.pos = nn.Parameter(torch.randn(SEQ_LEN, d_model) * 0.5)
        shape = (layers, heads, d_model, self.d_head)
        scale = d_model**-0.5
        self.w_q = nn.Parameter(torch.randn(shape) * scale)
        self.w_k = nn.Parameter(torch.randn(shape) * scale)
        self.w_v = nn.Parameter(torch.randn(shape) * scale)
        self.w_o = nn.Parameter(
            torch.randn(layers, heads, self.d_head, d_model) * self.d_head**-0.5
        )
        self.w_u = nn.Parameter(torch.randn(d_model, vocab) * scale)

    @property
    def layers(self) -> int:
        return self.w_q.shape[0]

    @property
    def heads(self) -> int:
        return self.w_q.shape[1]

    def forward(
        self, tokens: torch.Tensor, edit: Edit | None = None, cache: dict | None = None
    ) -> torch.Tensor:
        """Logits (B, T, V). ``cache`` (a dict) receives embeddings, scores, patterns, values."""
        t = tokens.shape[1]
        x = self.tok[tokens] + self.pos[:t]
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        if cache is not None:
            cache["embed"] = x
        for layer in range(self.layers):
            x_q = x_k = x.unsqueeze(1).expand(-1, self.heads, -1, -1)
            if edit is not None:
                x_q, x_k = edit(layer, x_q, x_k)
            q = torch.einsum("bhtd,hde->bhte", x_q, self.w_q[layer])
            k = torch.einsum("bhtd,hde->bhte", x_k, self.w_k[layer])
            v = torch.einsum("btd,hde->bhte", x, self.w_v[layer])
            scores = (q @ k.transpose(-1, -2) / math.sqrt(self.d_head)).masked_fill(~mask, -1e30)
            pattern = scores.softmax(-1)
            if cache is not None:
                cache[f"scores{layer}"], cache[f"pattern{layer}"] = scores, pattern
                cache[f"v{layer}"] = v
            x = x + torch.einsum("bhte,hed->btd", pattern @ v, self.w_o[layer])
        return x @ self.w_u


# ---------------------------------------------------------------------------------------------
# 3. Local step: cross-entropy on the answer at END
# ---------------------------------------------------------------------------------------------


def train(
    model: AttnOnly, data: Prompts, steps: int, seed: int, lr: float = 3e-3, batch: int = 64
) -> float:
    """``steps`` Adam steps on random batches of ``data``; returns the mean loss."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    total = 0.0
    for _ in range(steps):
        idx = torch.randint(len(data.io), (min(batch, len(data.io)),), generator=generator)
        loss = F.cross_entropy(model(data.tokens[idx])[:, -1], data.io[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += float(loss.detach())
    return total / max(steps, 1)


@functools.lru_cache(maxsize=4)
def trained_model(seed: int = 0, steps: int = 400, lr: float = 3e-3) -> AttnOnly:
    """The centrally trained multilingual model of ``seed`` (cached: tests train once).

    Trained in float64 at a moderate learning rate: at ``lr = 1e-2`` training was chaotic (the
    last bits of a CPU's matmul kernels grew into different models, with attention scores in the
    thousands), so the same seed gave a different model, and different test results, per CPU.
    """
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = AttnOnly().double()
    data = concat([make_prompts(lang, 1000, seed * 10 + lang) for lang in range(LANGUAGES)])
    train(model, data, steps, seed, lr)
    return model.eval().requires_grad_(False)


def logit_diff(model: AttnOnly, p: Prompts, edit: Edit | None = None) -> torch.Tensor:
    """IO minus S logit at END, per prompt."""
    with torch.no_grad():
        logits = model(p.tokens, edit)[:, -1]
    rows = torch.arange(len(p.io))
    return logits[rows, p.io] - logits[rows, p.s]


def accuracy(model: AttnOnly, p: Prompts) -> float:
    with torch.no_grad():
        return float((model(p.tokens)[:, -1].argmax(-1) == p.io).double().mean())


# ---------------------------------------------------------------------------------------------
# 4. Metrics: ACC++ tracing (decomposition, IG ordering, greedy selection, recursion)
# ---------------------------------------------------------------------------------------------


def omega_svd(model: AttnOnly, layer: int, head: int) -> tuple[torch.Tensor, ...]:
    """``W_Q W_K^T = U diag(sigma) V^T`` truncated to rank ``d_head`` (exact)."""
    omega = model.w_q[layer, head] @ model.w_k[layer, head].T
    u, sigma, vt = torch.linalg.svd(omega)
    r = model.d_head
    return u[:, :r], sigma[:r], vt[:r].T


def components(model: AttnOnly, cache: dict, layer: int, b: int = 0) -> torch.Tensor:
    """Residual input of ``layer`` split as (C, T_dest, T_src, D): embedding (source = itself) and
    each upstream head firing from each source position; ``sum(0, 2)`` is the residual stream."""
    embed = cache["embed"][b]
    t, d = embed.shape
    parts = [torch.diag_embed(embed.T).permute(1, 2, 0)]  # (T, T, D), nonzero only at j = p
    for lower in range(layer):
        a = cache[f"pattern{lower}"][b]  # (H, T, T)
        out = torch.einsum("hje,hed->hjd", cache[f"v{lower}"][b], model.w_o[lower])
        parts.extend(a[:, :, :, None] * out[:, None])  # per head (T, T, D)
    return torch.stack(parts)


def component_names(model: AttnOnly, layer: int) -> list[str]:
    return ["embed"] + [f"L{lo}H{h}" for lo in range(layer) for h in range(model.heads)]


@dataclass
class Terms:
    dest: torch.Tensor  # (C, T_src_of_upstream, K, n_keys): destination-side terms, every key
    source: torch.Tensor  # (C, T_src_of_upstream, K): source-side terms of the key at s
    score: float  # cached a_ds


def decompose(
    model: AttnOnly, cache: dict, layer: int, head: int, d: int, s: int, b: int = 0
) -> Terms:
    """Exact term decomposition of the score of (d, s) in head (layer, head)."""
    u, sigma, v = omega_svd(model, layer, head)
    comp = components(model, cache, layer, b)
    x = comp.sum((0, 2))  # (T, D) residual stream
    scale = math.sqrt(model.d_head)
    key_side = (x[: d + 1] @ v) * sigma  # (n_keys, K): sigma_k v_k^T x_s'
    dest = torch.einsum("cjd,dk,sk->cjks", comp[:, d], u, key_side) / scale
    query_side = (x[d] @ u) * sigma  # (K,)
    source = torch.einsum("cjd,dk,k->cjk", comp[:, s], v, query_side) / scale
    return Terms(dest, source, float(cache[f"scores{layer}"][b, head, d, s]))


def integrated_gradients(
    x: torch.Tensor, s: int, steps: int = 256, base: torch.Tensor | None = None,
    tol: float = 1e-9, max_steps: int = 1 << 16,
) -> torch.Tensor:  # fmt: skip
    """IG of ``softmax(base + sum_i X_i)_s`` per row of ``X`` (N, n), path ``base + alpha S``.

    ``grad_S p_s = p_s (e_s - p)``, so ``IG_i = int_0^1 p_s (X_is - X_i . p) d alpha`` (Simpson);
    the IGs sum to ``p_s(base + S) - p_s(base)``. A sharp softmax (large logit range) needs more
    nodes, so the grid is halved (new midpoints only) from ``steps`` until two successive rules
    agree to ``tol`` (or ``max_steps``).
    """
    base = torch.zeros(x.shape[1], dtype=x.dtype) if base is None else base
    total = x.sum(0)

    def integrand(alphas: torch.Tensor) -> torch.Tensor:  # (len(alphas), N)
        p = torch.softmax(base[None] + alphas[:, None] * total[None], -1)
        return p[:, s, None] * (x[:, s][None] - p @ x.T)

    grads = integrand(torch.linspace(0, 1, steps + 1, dtype=x.dtype))
    ig = _quadrature(steps, x.dtype) @ grads
    while steps < max_steps:
        mid = integrand((torch.arange(steps, dtype=x.dtype) + 0.5) / steps)
        finer = torch.empty(2 * steps + 1, grads.shape[1], dtype=x.dtype)
        finer[0::2], finer[1::2] = grads, mid
        grads, steps = finer, 2 * steps
        previous, ig = ig, _quadrature(steps, x.dtype) @ grads
        if float((ig - previous).abs().max()) <= tol:
            break
    return ig


def _quadrature(steps: int, dtype: torch.dtype) -> torch.Tensor:
    """Composite Simpson weights on ``steps + 1`` points (trapezoid if ``steps`` is odd)."""
    if steps % 2:
        weights = torch.full((steps + 1,), 1.0 / steps, dtype=dtype)
        weights[[0, -1]] /= 2
        return weights
    weights = torch.ones(steps + 1, dtype=dtype)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return weights / (3 * steps)


def greedy_select(
    x: torch.Tensor, s: int, thresh: float, ig_steps: int = 256, base: torch.Tensor | None = None
) -> tuple[list[int], torch.Tensor, float]:
    """Remove rows of ``x`` in IG order until ``softmax(base + sum)_s < thresh``.

    Returns (removed rows, IG of every row, final weight on s).
    """
    ig = integrated_gradients(x, s, ig_steps, base)
    remaining = x.sum(0) + (0 if base is None else base)
    chosen: list[int] = []
    for i in torch.argsort(ig, descending=True).tolist():
        if torch.softmax(remaining, -1)[s] < thresh:
            break
        remaining = remaining - x[i]
        chosen.append(i)
    return chosen, ig, float(torch.softmax(remaining, -1)[s])


@dataclass
class Circuit:
    """Traced circuit of one prompt: heads, edges (with weights) and signals."""

    nodes: set = field(default_factory=set)  # (layer, head)
    edges: dict = field(default_factory=dict)  # (upstream, (layer, head), side) -> weight
    signals: dict = field(default_factory=dict)  # (upstream, (layer, head), side) -> set of k
    traced: list = field(default_factory=list)  # (layer, head, d, s) of every traced edge


def trace_edge(
    model: AttnOnly, cache: dict, layer: int, head: int, d: int, s: int, circuit: Circuit,
    thresh: float = 0.1, ig_steps: int = 256, b: int = 0,
) -> None:  # fmt: skip
    """ACC++ on the attention of (layer, head) from d to s; recurses into selected upstream heads."""
    node = (layer, head)
    circuit.nodes.add(node)
    if float(cache[f"pattern{layer}"][b, head, d, s]) < 2 * thresh:
        return
    circuit.traced.append((layer, head, d, s))
    terms = decompose(model, cache, layer, head, d, s, b)
    names = component_names(model, layer)
    n_c, _, n_k = terms.source.shape
    for side, pos in (("dest", d), ("source", s)):
        if side == "dest":
            grouped = terms.dest.sum(1).reshape(n_c * n_k, -1)  # (C*K, n_keys)
            base = None
        else:  # a source-side term only moves the score of key s; other keys are constants
            grouped = torch.zeros(n_c * n_k, d + 1, dtype=terms.source.dtype)
            grouped[:, s] = terms.source.sum(1).reshape(-1)
            base = cache[f"scores{layer}"][b, head, d, : d + 1].clone()
            base[s] = 0.0
        chosen, ig, _ = greedy_select(grouped, s, thresh, ig_steps, base)
        per_comp: dict[int, list[int]] = {}
        for i in chosen:
            c, k = divmod(i, n_k)
            key = (names[c], node, side)
            circuit.signals.setdefault(key, set()).add(k)
            circuit.edges[key] = circuit.edges.get(key, 0.0) + float(ig[i])
            per_comp.setdefault(c, []).append(k)
        for c, ks in per_comp.items():
            if c == 0:
                continue  # the embedding has no upstream
            lower, h = divmod(c - 1, model.heads)
            if side == "dest":
                carried = terms.dest[c, :, ks, s].sum(-1)
            else:
                carried = terms.source[c, :, ks].sum(-1)
            j = int(torch.argmax(carried))  # the upstream head's firing that carries the signal
            trace_edge(model, cache, lower, h, pos, j, circuit, thresh, ig_steps, b)


def root_heads(
    model: AttnOnly, cache: dict, io: int, s: int, b: int = 0, frac: float = 0.2
) -> list[tuple[int, int]]:
    """Heads whose direct (IO - S) logit contribution at END is >= ``frac`` of the largest."""
    direction = model.w_u[:, io] - model.w_u[:, s]
    contrib = {}
    for layer in range(model.layers):
        z = torch.einsum("ht,hte->he", cache[f"pattern{layer}"][b, :, -1], cache[f"v{layer}"][b])
        out = torch.einsum("he,hed->hd", z, model.w_o[layer]) @ direction
        for h in range(model.heads):
            contrib[(layer, h)] = float(out[h])
    top = max(contrib.values())
    return [node for node, c in contrib.items() if c >= frac * top and c > 0]


def trace_prompt(
    model: AttnOnly, p: Prompts, b: int = 0, thresh: float = 0.1, ig_steps: int = 256
) -> Circuit:
    """ACC++ circuit of prompt ``b``: root heads at END, traced to the IO position, recursively."""
    cache: dict = {}
    with torch.no_grad():
        model(p.tokens[b : b + 1], cache=cache)
        circuit = Circuit()
        end, io = SEQ_LEN - 1, int(p.io_pos[b])
        for layer, head in root_heads(model, cache, int(p.io[b]), int(p.s[b])):
            trace_edge(model, cache, layer, head, end, io, circuit, thresh, ig_steps)
    return circuit


def signal_edit(
    model: AttnOnly, cache: dict, layer: int, head: int, d: int, s: int,
    signals: dict[tuple[str, str], set[int]], b: int = 0,
) -> Edit:  # fmt: skip
    """Hook that projects each upstream output off the selected singular directions, in the query
    input of (layer, head) at d (``u_k``) and its key input at s (``v_k``); other heads untouched.

    ``signals`` maps (component name, side) to the removed k's.
    """
    u, _, v = omega_svd(model, layer, head)
    comp = components(model, cache, layer, b).sum(2)  # (C, T, D) output of each component
    names = component_names(model, layer)
    delta_q = torch.zeros(comp.shape[-1], dtype=comp.dtype)
    delta_k = torch.zeros_like(delta_q)
    for (name, side), ks in signals.items():
        basis, pos = (u, d) if side == "dest" else (v, s)
        sub = basis[:, sorted(ks)]
        removed = sub @ (sub.T @ comp[names.index(name), pos])
        if side == "dest":
            delta_q += removed
        else:
            delta_k += removed

    def edit(at: int, x_q: torch.Tensor, x_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if at != layer:
            return x_q, x_k
        x_q, x_k = x_q.clone(), x_k.clone()
        x_q[:, head, d] -= delta_q
        x_k[:, head, s] -= delta_k
        return x_q, x_k

    return edit


def random_signals(
    model: AttnOnly, layer: int, like: dict[tuple[str, str], set[int]], seed: int
) -> dict[tuple[str, str], set[int]]:
    """As many random (component, k) pairs per side as ``like`` holds."""
    rng = np.random.default_rng(seed)
    names = component_names(model, layer)
    pairs = list(itertools.product(range(len(names)), range(model.d_head)))
    out: dict[tuple[str, str], set[int]] = {}
    for side in ("dest", "source"):
        count = sum(len(ks) for (_, sd), ks in like.items() if sd == side)
        for idx in rng.choice(len(pairs), count, replace=False):
            c, k = pairs[idx]
            out.setdefault((names[c], side), set()).add(k)
    return out


def edge_signals(circuit: Circuit, layer: int, head: int) -> dict[tuple[str, str], set[int]]:
    """Signals selected for the edges into (layer, head), keyed by (component, side)."""
    return {
        (name, side): ks for (name, node, side), ks in circuit.signals.items()
        if node == (layer, head)
    }  # fmt: skip


def activation_patching(model: AttnOnly, p: Prompts, corrupt: Prompts, edges: list, b: int = 0):
    """Baseline: for each edge, patch every (component, source position) into the query at d and
    the key at s from the corrupted prompt, one forward pass each; returns the weight changes."""
    clean: dict[str, torch.Tensor] = {}
    dirty: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        model(p.tokens[b : b + 1], cache=clean)
        model(corrupt.tokens[b : b + 1], cache=dirty)
        effects = []
        for layer, head, d, s in edges:
            diff = components(model, dirty, layer) - components(model, clean, layer)
            for c, j, side in itertools.product(
                range(diff.shape[0]), range(diff.shape[2]), ("dest", "source")
            ):
                pos = d if side == "dest" else s

                def edit(
                    at, x_q, x_k, c=c, j=j, side=side, pos=pos, layer=layer, head=head, diff=diff
                ):
                    if at != layer:
                        return x_q, x_k
                    x_q, x_k = x_q.clone(), x_k.clone()
                    target = x_q if side == "dest" else x_k
                    target[:, head, pos] += diff[c, pos, j]
                    return x_q, x_k

                cache: dict = {}
                model(p.tokens[b : b + 1], edit, cache)
                effects.append(
                    float(
                        clean[f"pattern{layer}"][0, head, d, s]
                        - cache[f"pattern{layer}"][0, head, d, s]
                    )
                )
    return effects


# ---------------------------------------------------------------------------------------------
# Circuit summaries (what a client reports) and the server-side distances
# ---------------------------------------------------------------------------------------------


def signal_space(model: AttnOnly) -> list[tuple[str, tuple[int, int], str, int]]:
    """Every possible signal: (upstream component, head, side, k)."""
    return [
        (name, (layer, h), side, k)
        for layer in range(model.layers) for h in range(model.heads)
        for name in component_names(model, layer) for side in ("dest", "source")
        for k in range(model.d_head)
    ]  # fmt: skip


class CircuitSummary(TypedDict):
    """What a client shares of its circuits: head and signal frequencies, mean sizes."""

    heads: np.ndarray
    signals: np.ndarray
    nodes: float
    edges: float
    signal_dim: float


class LanguageReport(TypedDict):
    """``language_report``: a summary per language and the distances between them."""

    summaries: list[CircuitSummary]
    head_distance: np.ndarray
    signal_distance: np.ndarray


def summarise(model: AttnOnly, circuits: list[Circuit]) -> CircuitSummary:
    """Frequencies of heads and signals over prompts, plus sizes; no prompt content."""
    heads = np.zeros((model.layers, model.heads))
    space = {sig: i for i, sig in enumerate(signal_space(model))}
    signals = np.zeros(len(space))
    for circuit in circuits:
        for layer, h in circuit.nodes:
            heads[layer, h] += 1
        for (name, node, side), ks in circuit.signals.items():
            for k in ks:
                signals[space[(name, node, side, k)]] += 1
    n = max(len(circuits), 1)
    dims = [len(ks) for c in circuits for ks in c.signals.values()]
    return {
        "heads": heads.reshape(-1) / n,
        "signals": signals / n,
        "nodes": float(np.mean([len(c.nodes) for c in circuits])),
        "edges": float(np.mean([len(c.edges) for c in circuits])),
        "signal_dim": float(np.mean(dims)) if dims else 0.0,
    }


def weighted_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    top = np.maximum(a, b).sum()
    return float(np.minimum(a, b).sum() / top) if top > 0 else 1.0


def circuit_distances(
    summaries: list[CircuitSummary], what: Literal["heads", "signals"] = "signals"
) -> np.ndarray:
    """Server side: ``1 - weighted Jaccard`` between the clients' head or signal frequencies."""
    n = len(summaries)
    out = np.zeros((n, n))
    for i, j in itertools.product(range(n), range(n)):
        out[i, j] = 1.0 - weighted_jaccard(summaries[i][what], summaries[j][what])
    return out


def client_circuits(metrics: dict[str, float], num_clients: int, model: AttnOnly | None = None):
    """Server side: rebuild each client's summary from the aggregated ``eval.*`` metrics.

    Every client reports the same keys, its own slot filled and the others zero; with
    ``fraction_evaluate: 1`` and equal ``num-examples`` the weighted mean is ``slot / n``.
    """
    model = model or AttnOnly()
    n_heads, n_sig = model.layers * model.heads, len(signal_space(model))
    out = []
    for p in range(num_clients):
        scaled = {k: v * num_clients for k, v in metrics.items() if k.startswith(f"eval.acc.c{p}.")}
        out.append(
            {
                "heads": np.array([scaled.get(f"eval.acc.c{p}.h{i}", 0.0) for i in range(n_heads)]),
                "signals": np.array([scaled.get(f"eval.acc.c{p}.s{i}", 0.0) for i in range(n_sig)]),
            }
        )
    return out


def language_report(model: AttnOnly, n_prompts: int = 32, seed: int = 0) -> LanguageReport:
    """Centralised analysis: circuits per language, sizes, head vs signal Jaccard, distances."""
    summaries = []
    for lang in range(LANGUAGES):
        p = make_prompts(lang, n_prompts, 10_000 + seed * 10 + lang)
        summaries.append(summarise(model, [trace_prompt(model, p, b) for b in range(n_prompts)]))
    return {
        "summaries": summaries,
        "head_distance": circuit_distances(summaries, "heads"),
        "signal_distance": circuit_distances(summaries, "signals"),
    }


# ---------------------------------------------------------------------------------------------
# 5. Registration: language communities train one model; clients report circuit summaries
# ---------------------------------------------------------------------------------------------


class LanguageShard(TypedDict):
    """A client's partition: its language's training prompts and the prompts it traces."""

    partition: int
    train: Prompts
    test: Prompts


@WORKLOADS.register("acc-pp", "ACC++ circuit tracing, tiny attention-only IOI model, 4 languages")
class ACCpp(Workload):
    """Client ``p`` speaks language ``p mod 4``; after local training it traces ACC++ circuits on
    ``trace_prompts`` local prompts and reports only head/signal frequencies (its slot of the
    ``acc.c{p}.*`` keys), circuit sizes and task metrics."""

    @dataclass
    class Params:
        local_steps: int = param(100, ge=0)
        lr: float = param(3e-3, gt=0)  # 1e-2 made training chaotic (see trained_model)
        batch_size: int = param(64, ge=1)
        train_prompts: int = param(1000, ge=1)
        trace_prompts: int = param(16, ge=1)
        attn_weight_thresh: float = param(0.1, gt=0, lt=0.5)  # edges traced at weight >= 2x
        ig_steps: int = param(256, ge=1)

    params: Params

    def _model(self, arrays: ArrayRecord | None = None) -> AttnOnly:
        torch.manual_seed(self.ctx.seed)
        model = AttnOnly()
        if arrays is not None:
            model.load_state_dict(arrays.to_torch_state_dict())
        return model

    def load_partition(self, partition_id: int, num_partitions: int) -> LanguageShard:
        lang = partition_id % LANGUAGES
        seed = client_seed(self.ctx.seed, partition_id, 0)
        return {
            "partition": partition_id,
            "train": make_prompts(lang, self.params.train_prompts, seed),
            "test": make_prompts(lang, self.params.trace_prompts, seed + 1),
        }

    def init_arrays(self) -> ArrayRecord:
        return ArrayRecord(self._model().state_dict())

    def fit(
        self, arrays: ArrayRecord, data: LanguageShard, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        torch.set_num_threads(1)
        model = self._model(arrays)
        seed = client_seed(self.ctx.seed, config["partition-id"], config["server-round"])
        p = self.params
        loss = train(model, data["train"], p.local_steps, seed, p.lr, p.batch_size)
        return ArrayRecord(model.state_dict()), {
            "num-examples": len(data["train"].io),
            "loss": loss,
        }

    def evaluate(
        self, arrays: ArrayRecord, data: LanguageShard, config: RoundConfig
    ) -> dict[str, float]:
        torch.set_num_threads(1)
        model = self._model(arrays).double().requires_grad_(False)
        test: Prompts = data["test"]
        p = self.params
        circuits = [
            trace_prompt(model, test, b, p.attn_weight_thresh, p.ig_steps)
            for b in range(len(test.io))
        ]
        summary = summarise(model, circuits)
        metrics: dict[str, float] = {
            "num-examples": len(test.io),
            "accuracy": accuracy(model, test),
            "logit_diff": float(logit_diff(model, test).mean()),
            "acc_nodes": summary["nodes"],
            "acc_edges": summary["edges"],
            "acc_signal_dim": summary["signal_dim"],
        }
        num = int(self.ctx.num_clients)
        for client in range(num):  # same keys on every client; only the own slot is non-zero
            mine = client == data["partition"]
            for i, v in enumerate(summary["heads"]):
                metrics[f"acc.c{client}.h{i}"] = float(v) if mine else 0.0
            for i, v in enumerate(summary["signals"]):
                metrics[f"acc.c{client}.s{i}"] = float(v) if mine else 0.0
        return metrics
