"""Triangular inversion for Delta-rule linear attention (Sobczyk et al., arXiv 2605.21325).

A chunk of a DeltaNet layer needs ``T = (I + A)^{-1} diag(beta)`` with ``A`` strictly lower triangular
(the UT transform). The paper compares direct methods (row forward substitution, blocked/recursive
inversion) with matmul-rich ones (Neumann product ``prod_j (I + (-A)^(2^j))``, Newton-Schulz) in low
precision: blocked methods keep forward substitution's accuracy, while the full-chunk Neumann product
multiplies terms ``(-A)^(2^j)`` that grow huge once keys correlate, and blows up in bf16/fp16.

This module holds the analysis (generator of DeltaNet-like ``A``, the inverses in any precision, a
growth monitor, chunked and recurrent (gated) delta rule) and a federated workload: clients train a
tiny DeltaNet LM on multi-query associative recall with a chosen inverse and precision, and report
inversion error on their own ``A`` matrices, growth, kernel time and recall accuracy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from flowerbed.clients.core.params import choices, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext

DTYPES: dict[str, torch.dtype] = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}

# -- 1. data generator: DeltaNet-like A matrices ---------------------------------------------------


def delta_keys(
    batch: int, chunk: int, dim: int, corr: float, generator: torch.Generator
) -> torch.Tensor:
    """L2-normalised keys sharing a common component: ``k = sqrt(corr) s + sqrt(1-corr) z`` per chunk.

    ``corr`` is about the mean cosine similarity between two keys of a chunk (0 = near-orthogonal).
    """
    shared = torch.randn(batch, 1, dim, generator=generator, dtype=torch.float64)
    own = torch.randn(batch, chunk, dim, generator=generator, dtype=torch.float64)
    keys = math.sqrt(corr) * shared + math.sqrt(1.0 - corr) * own
    return keys / keys.norm(dim=-1, keepdim=True)


def log_decays(batch: int, chunk: int, generator: torch.Generator) -> torch.Tensor:
    """Per-token log decays ``g_t = log sigmoid(x)`` (Gated DeltaNet), x ~ N(3, 1): mild forgetting."""
    x = 3.0 + torch.randn(batch, chunk, generator=generator, dtype=torch.float64)
    return nn.functional.logsigmoid(x)


def delta_A(
    keys: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor | None = None
) -> torch.Tensor:
    """``A = tril(diag(beta) K K^T, -1)``, times ``exp(G_i - G_j)`` (G = cumulative log decay) if gated."""
    a = beta.unsqueeze(-1) * (keys @ keys.transpose(-1, -2))
    if log_decay is not None:
        cum = log_decay.cumsum(-1)
        a = a * torch.exp(cum.unsqueeze(-1) - cum.unsqueeze(-2)).tril()
    return a.tril(-1)


def make_A(
    batch: int = 256,
    chunk: int = 64,
    dim: int = 64,
    corr: float = 0.0,
    gated: bool = False,
    seed: int = 0,
) -> torch.Tensor:
    """A batch of DeltaNet chunk matrices (fp64): normalised keys, beta ~ U(0, 1), optional gating."""
    generator = torch.Generator().manual_seed(seed)
    keys = delta_keys(batch, chunk, dim, corr, generator)
    beta = torch.rand(batch, chunk, generator=generator, dtype=torch.float64)
    decay = log_decays(batch, chunk, generator) if gated else None
    return delta_A(keys, beta, decay)


def neumann_growth(a: torch.Tensor) -> torch.Tensor:
    """Growth monitor: ``max_j max|(-A)^(2^j)|`` per matrix (fp64), the size of the Neumann terms.

    The inverse itself has moderate entries; when this is large, the Neumann product subtracts huge
    terms and loses ``log10(growth)`` digits, so it fails once ``growth * eps(dtype)`` nears 1.
    """
    power = -a.to(torch.float64)
    growth = power.abs().amax(dim=(-1, -2))
    for _ in range(max(1, math.ceil(math.log2(a.shape[-1]))) - 1):
        power = power @ power
        growth = torch.maximum(growth, power.abs().amax(dim=(-1, -2)))
    return growth


def growth_flagged(growth: torch.Tensor, precision: str, tol: float = 1.0) -> torch.Tensor:
    """True where the Neumann terms are too large for the precision: ``growth * eps >= tol``."""
    return growth * torch.finfo(DTYPES[precision]).eps >= tol


# -- 2. the inverses X = (I + L)^{-1}, L strictly lower triangular ---------------------------------


def _eye(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.eye(n, dtype=like.dtype, device=like.device)


def forward_substitution(lower: torch.Tensor) -> torch.Tensor:
    """Row forward substitution ``X_i = e_i - sum_{j<i} L_ij X_j`` (C sequential matvecs)."""
    n = lower.shape[-1]
    eye = _eye(n, lower).expand(*lower.shape[:-2], n, n)
    if not (torch.is_grad_enabled() and lower.requires_grad):
        x = eye.clone()  # in place, row by row (what a kernel does)
        for i in range(1, n):
            x[..., i, :] -= (lower[..., i : i + 1, :i] @ x[..., :i, :]).squeeze(-2)
        return x
    rows = [eye[..., 0:1, :]]  # differentiable: rows are never overwritten
    for i in range(1, n):
        done = torch.cat(rows, dim=-2)
        rows.append(eye[..., i : i + 1, :] - lower[..., i : i + 1, :i] @ done)
    return torch.cat(rows, dim=-2)


def neumann_product(lower: torch.Tensor) -> torch.Tensor:
    """Neumann series in product form ``prod_{j < log2 C} (I + (-L)^(2^j))``: exact as L^C = 0.

    2 log2(C) - 1 matmuls, all matrix-matrix; the factors commute (powers of one matrix).
    """
    n = lower.shape[-1]
    eye = _eye(n, lower)
    power = -lower
    result = eye + power
    for _ in range(max(1, math.ceil(math.log2(n))) - 1):
        power = power @ power
        result = result @ (eye + power)
    return result


def blocked_inverse(
    lower: torch.Tensor, leaf: int, leaf_fn: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Recursive 2x2 blocking ``[[X11, 0], [-X22 L21 X11, X22]]`` down to ``leaf``-sized diagonal blocks.

    Only the leaves are solved by ``leaf_fn``; every merge is two matmuls, so the method is matmul-rich
    and never forms a product of more than two inverse blocks with ``L21``.
    """
    n = lower.shape[-1]
    if n <= leaf:
        return leaf_fn(lower)
    h = n // 2
    x11 = blocked_inverse(lower[..., :h, :h], leaf, leaf_fn)
    x22 = blocked_inverse(lower[..., h:, h:], leaf, leaf_fn)
    x21 = -(x22 @ (lower[..., h:, :h] @ x11))
    top = torch.cat([x11, torch.zeros_like(lower[..., :h, h:])], dim=-1)
    return torch.cat([top, torch.cat([x21, x22], dim=-1)], dim=-2)


def newton_schulz(lower: torch.Tensor, x: torch.Tensor, steps: int = 1) -> torch.Tensor:
    """Newton-Schulz refinement ``X <- X (2I - (I + L) X)`` (quadratic convergence, matmul only)."""
    eye = _eye(lower.shape[-1], lower)
    for _ in range(steps):
        x = x @ (2 * eye - (eye + lower) @ x)
    return x


METHODS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "fwd": forward_substitution,
    "blocked": lambda lower: blocked_inverse(lower, 16, forward_substitution),
    "blocked-neumann8": lambda lower: blocked_inverse(lower, 8, neumann_product),
    "blocked-neumann16": lambda lower: blocked_inverse(lower, 16, neumann_product),
    "neumann": neumann_product,
}


def invert_unit_lower(
    lower: torch.Tensor, method: str = "fwd", precision: str = "fp32", refine: int = 0
) -> torch.Tensor:
    """``(I + L)^{-1}`` by ``method`` with every operation in ``precision``; returned in L's dtype.

    The input is rounded to the precision first (as a kernel would receive it); torch rounds the
    result of every op to the tensor dtype, so bf16/fp16 are real low-precision arithmetic.
    """
    if method not in METHODS:
        raise ValueError(f"unknown inverse '{method}' (allowed: {', '.join(METHODS)})")
    low = lower.to(DTYPES[precision])
    x = METHODS[method](low)
    if refine:
        x = newton_schulz(low, x, refine)
    return x.to(lower.dtype)


def reference_inverse(lower: torch.Tensor) -> torch.Tensor:
    """fp64 ``(I + L)^{-1}`` by LAPACK's triangular solve (the ground truth)."""
    lower = lower.to(torch.float64)
    eye = _eye(lower.shape[-1], lower).expand_as(lower)
    return torch.linalg.solve_triangular(eye + lower, eye, upper=False, unitriangular=True)


def relative_error(x: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Relative Frobenius error per matrix (inf where x is not finite)."""
    x = x.to(torch.float64)
    err = (x - reference).norm(dim=(-1, -2)) / reference.norm(dim=(-1, -2))
    return torch.where(torch.isfinite(x).all(-1).all(-1), err, torch.full_like(err, math.inf))


# -- 3. the delta rule: recurrent reference and chunked (UT transform) -----------------------------


def delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token-by-token (gated) delta rule ``S_t = a_t S_{t-1}(I - b_t k_t k_t^T) + b_t v_t k_t^T``.

    Shapes: q, k (B, T, dk); v (B, T, dv); beta, log_decay (B, T). Returns o_t = S_t q_t (B, T, dv).
    """
    bsz, length, dk = k.shape
    state = q.new_zeros(bsz, v.shape[-1], dk)
    outputs = []
    for t in range(length):
        if log_decay is not None:
            state = state * log_decay[:, t].exp()[:, None, None]
        kt, bt = k[:, t], beta[:, t, None]
        pred = (state @ kt.unsqueeze(-1)).squeeze(-1)
        state = state + (bt * (v[:, t] - pred)).unsqueeze(-1) * kt.unsqueeze(-2)
        outputs.append((state @ q[:, t].unsqueeze(-1)).squeeze(-1))
    return torch.stack(outputs, dim=1)


class KernelOptions(TypedDict, total=False):
    """Keyword options of ``delta_rule_chunked`` a model passes through to its mixers."""

    chunk: int
    method: str
    precision: str
    refine: int


def delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    chunk: int = 64,
    method: str = "fwd",
    precision: str = "fp32",
    refine: int = 0,
    record: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Chunked (gated) delta rule with a pluggable inverse for ``T = (I + A)^{-1} diag(beta)``.

    Per chunk, with ``G`` the cumulative log decay (0 if ungated) and ``D_ij = exp(G_i - G_j)``:
    ``W = T diag(e^G) K``, ``U' = T V - W S^T``, ``O = diag(e^G) Q S^T + tril(Q K^T * D) U'``,
    ``S <- e^{G_C} S + U'^T diag(e^{G_C - G}) K``. ``record`` collects the A matrices (detached).
    """
    bsz, length, dk = k.shape
    if length % chunk:
        raise ValueError(f"sequence length {length} is not a multiple of the chunk size {chunk}")
    state = q.new_zeros(bsz, v.shape[-1], dk)
    outputs = []
    for start in range(0, length, chunk):
        sl = slice(start, start + chunk)
        qc, kc, vc, bc = q[:, sl], k[:, sl], v[:, sl], beta[:, sl]
        if log_decay is None:
            cum = q.new_zeros(bsz, chunk)
        else:
            cum = log_decay[:, sl].cumsum(-1)
        ratio = torch.exp((cum.unsqueeze(-1) - cum.unsqueeze(-2)).tril()).tril()
        a = (bc.unsqueeze(-1) * (kc @ kc.transpose(-1, -2)) * ratio).tril(-1)
        if record is not None:
            record.append(a.detach())
        inv = invert_unit_lower(a, method, precision, refine)
        t_mat = inv * bc.unsqueeze(-2)  # (I + A)^{-1} diag(beta)
        w = t_mat @ (kc * cum.exp().unsqueeze(-1))
        u = t_mat @ vc - w @ state.transpose(-1, -2)
        inter = (qc * cum.exp().unsqueeze(-1)) @ state.transpose(-1, -2)
        intra = ((qc @ kc.transpose(-1, -2)) * ratio).tril() @ u
        outputs.append(inter + intra)
        last = cum[:, -1:]
        state = state * last.exp().unsqueeze(-1) + u.transpose(-1, -2) @ (
            kc * (last - cum).exp().unsqueeze(-1)
        )
    return torch.cat(outputs, dim=1)


# -- 4. data: multi-query associative recall (MQAR) ------------------------------------------------


@dataclass
class RecallData:
    tokens: torch.Tensor  # (N, L) int64
    targets: torch.Tensor  # (N, L) int64, -100 where not a query answer


def make_recall(
    num: int, length: int, num_keys: int, num_values: int, pairs: int, seed: int
) -> RecallData:
    """MQAR sequences: ``pairs`` (key, value) tokens, then the keys again in random order.

    Keys are tokens 0..num_keys-1, values follow; filler token = vocab - 1. The target at each
    repeated key is its value, so a model must store and retrieve the bindings (the delta rule's job).
    """
    rng = np.random.default_rng(seed)
    filler = num_keys + num_values
    tokens = np.full((num, length), filler, dtype=np.int64)
    targets = np.full((num, length), -100, dtype=np.int64)
    for i in range(num):
        keys = rng.choice(num_keys, pairs, replace=False)
        values = num_keys + rng.choice(num_values, pairs, replace=True)
        tokens[i, 0 : 2 * pairs : 2], tokens[i, 1 : 2 * pairs : 2] = keys, values
        order = rng.permutation(pairs)
        query_pos = 2 * pairs + np.arange(pairs)
        tokens[i, query_pos] = keys[order]
        targets[i, query_pos] = values[order]
    return RecallData(torch.from_numpy(tokens), torch.from_numpy(targets))


# -- 5. model: a tiny DeltaNet LM -------------------------------------------------------------------


class DeltaNetLayer(nn.Module):
    """One DeltaNet token mixer: q, k L2-normalised (with a short causal conv), beta = sigmoid."""

    def __init__(self, dim: int, gated: bool) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.conv = nn.Conv1d(3 * dim, 3 * dim, kernel_size=4, padding=3, groups=3 * dim)
        self.beta = nn.Linear(dim, 1)
        self.gate = nn.Linear(dim, 1) if gated else None
        self.out = nn.Linear(dim, dim, bias=False)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, kernel: KernelOptions) -> torch.Tensor:
        h = self.norm(x)
        length = h.shape[1]
        qkv = self.conv(self.qkv(h).transpose(1, 2))[..., :length].transpose(1, 2)
        q, k, v = nn.functional.silu(qkv).chunk(3, dim=-1)
        q, k = nn.functional.normalize(q, dim=-1), nn.functional.normalize(k, dim=-1)
        beta = torch.sigmoid(self.beta(h)).squeeze(-1)
        decay = None
        if self.gate is not None:
            decay = nn.functional.logsigmoid(self.gate(h).squeeze(-1) + 3.0)
        o = delta_rule_chunked(q, k, v, beta, decay, **kernel)
        return x + self.out(o)


class DeltaNetLM(nn.Module):
    """Embedding, DeltaNet layers with MLPs, tied output head."""

    def __init__(self, vocab: int, dim: int, layers: int, gated: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mixers = nn.ModuleList(DeltaNetLayer(dim, gated) for _ in range(layers))
        self.mlps = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)
            )
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        nn.init.normal_(self.embed.weight, std=dim**-0.5)  # tied head: logits start at O(1)

    def forward(self, tokens: torch.Tensor, kernel: KernelOptions) -> torch.Tensor:
        x = self.embed(tokens)
        for mixer, mlp in zip(self.mixers, self.mlps, strict=True):
            x = mixer(x, kernel)
            x = x + mlp(x)
        return self.norm(x) @ self.embed.weight.T


# -- 6. local step and metrics ---------------------------------------------------------------------


def recall_scores(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    """(cross-entropy, accuracy) over query positions only."""
    mask = targets >= 0
    loss = nn.functional.cross_entropy(logits[mask], targets[mask])
    accuracy = (logits[mask].argmax(-1) == targets[mask]).float().mean()
    return float(loss), float(accuracy)


def kernel_report(
    a: torch.Tensor, method: str, precision: str, refine: int, repeats: int = 3
) -> dict[str, float]:
    """Inversion error vs fp64, growth, flagged fraction and kernel time on a client's real A."""
    reference = reference_inverse(a)
    err = relative_error(invert_unit_lower(a, method, precision, refine), reference)
    growth = neumann_growth(a)
    started = time.perf_counter()
    for _ in range(repeats):
        invert_unit_lower(a, method, precision, refine)
    kernel_s = (time.perf_counter() - started) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        reference_inverse(a)
    solve_s = (time.perf_counter() - started) / repeats
    return {
        "inv_err_median": float(err.median()),
        "inv_err_max": float(err.max()),
        "inv_nonfinite": float((~torch.isfinite(err)).float().mean()),
        "growth_max": float(growth.max()),
        "growth_flagged": float(growth_flagged(growth, precision).float().mean()),
        "kernel_s": kernel_s,
        "kernel_vs_solve": kernel_s / max(solve_s, 1e-12),
    }


# -- 7. registration ---------------------------------------------------------------------------------


Method = choices("Method", METHODS)
Precision = choices("Precision", DTYPES)


@WORKLOADS.register(
    "triangular-inversion",
    "DeltaNet LM on associative recall; (I+A)^-1 by fwd/blocked/Neumann in fp32/bf16/fp16",
)
class TriangularInversion(Workload):
    @dataclass
    class Params:
        method: Method = Method("blocked")
        precision: Precision = Precision("fp32")
        refine: int = param(0, ge=0)
        chunk: int = param(32, ge=1)
        dim: int = param(32, ge=1)
        layers: int = param(1, ge=1)
        gated: bool = False
        num_keys: int = param(16, ge=1)
        num_values: int = param(16, ge=1)
        pairs: int = param(8, ge=1)
        seq_len: int = param(32, ge=1)
        train_size: int = param(256, ge=1)
        test_size: int = param(64, ge=1)
        batch_size: int = param(32, ge=1)
        local_steps: int = param(30, ge=0)
        lr: float = param(1e-2, gt=0)
        probe_method: Method = Method(
            "neumann"
        )  # evaluation only: the same weights served with this inverse
        probe_precision: Precision = Precision("bf16")

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        p = self.params
        self.vocab = p.num_keys + p.num_values + 1
        self.kernel: KernelOptions = {
            "chunk": p.chunk,
            "method": p.method,
            "precision": p.precision,
        }
        self.kernel["refine"] = p.refine

    def _model(self) -> DeltaNetLM:
        return DeltaNetLM(self.vocab, self.params.dim, self.params.layers, self.params.gated)

    def load_partition(self, partition_id: int, num_partitions: int) -> dict[str, RecallData]:
        """Each client draws its own bindings; non-IID: clients differ in the number of pairs."""
        p = self.params
        pairs = max(2, min(p.pairs - partition_id % 3, p.seq_len // 3))
        seed = client_seed(self.ctx.seed, partition_id, 0)
        args = (p.seq_len, p.num_keys, p.num_values, pairs)
        return {
            "train": make_recall(p.train_size, *args, seed=seed),
            "test": make_recall(p.test_size, *args, seed=seed + 1),
        }

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.ctx.seed)
        return ArrayRecord(self._model().state_dict())

    def fit(
        self, arrays: ArrayRecord, data: dict[str, RecallData], config: RoundConfig,
        state: RecordDict,
    ) -> tuple[ArrayRecord, dict[str, float]]:  # fmt: skip
        torch.set_num_threads(1)
        model = self._model()
        model.load_state_dict(arrays.to_torch_state_dict())
        train = data["train"]
        seed = client_seed(self.ctx.seed, config["partition-id"], config["server-round"])
        generator = torch.Generator().manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.params.lr)
        losses = []
        model.train()
        for _ in range(self.params.local_steps):
            batch = torch.randint(len(train.tokens), (self.params.batch_size,), generator=generator)
            logits = model(train.tokens[batch], self.kernel)
            mask = train.targets[batch] >= 0
            loss = nn.functional.cross_entropy(logits[mask], train.targets[batch][mask])
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
        finite = all(math.isfinite(x) for x in losses)
        metrics = {
            "num-examples": len(train.tokens),
            "loss": float(np.mean(losses)) if finite else math.inf,
            "diverged": float(not finite),
        }
        return ArrayRecord(model.state_dict()), metrics

    def evaluate(
        self, arrays: ArrayRecord, data: dict[str, RecallData], config: RoundConfig
    ) -> dict[str, float]:
        """Recall accuracy (configured and exact kernel), and the kernel report on this client's A."""
        torch.set_num_threads(1)
        model = self._model()
        model.load_state_dict(arrays.to_torch_state_dict())
        model.eval()
        test = data["test"]
        record: list[torch.Tensor] = []
        with torch.no_grad():
            logits = model(test.tokens, {**self.kernel, "record": record})
            exact_kernel: KernelOptions = {
                **self.kernel,
                "method": "fwd",
                "precision": "fp64",
                "refine": 0,
            }
            exact_logits = model(test.tokens, exact_kernel)
            probe_kernel: KernelOptions = {**self.kernel, "method": self.params.probe_method}
            probe_kernel["precision"] = self.params.probe_precision
            probe_logits = model(test.tokens, probe_kernel)
        loss, accuracy = recall_scores(logits, test.targets)
        p = self.params
        real_a = torch.cat([a.reshape(-1, p.chunk, p.chunk) for a in record]).to(torch.float64)
        metrics = {"num-examples": len(test.tokens), "loss": loss, "recall_accuracy": accuracy}
        # the same weights served with an exact (fp64 forward-substitution) inverse
        metrics["recall_accuracy_exact_kernel"] = recall_scores(exact_logits, test.targets)[1]
        # ... and with the probe kernel (default: full-chunk Neumann in bf16), swapped in at serving
        metrics["recall_accuracy_probe_kernel"] = recall_scores(probe_logits, test.targets)[1]
        metrics.update(kernel_report(real_a, p.method, p.precision, p.refine))
        return metrics
