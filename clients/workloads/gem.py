"""GEM: geometric embedding mixture regulariser for language-model pre-training.

Method page: docs/methods/gem.md.

A tied-embedding decoder-only LM predicts ``p_t = softmax(E h_t)``. GEM adds
``lambda * ||h_t - E^T sg(p_t)||^2``: the hidden state is pulled toward the probability-weighted
mixture of token embeddings, i.e. into the convex hull of the vocabulary. The paper claims lower
anisotropy, intermediate layers that decode through the untuned head (logit lens) and better
perplexity; at this scale only the first two reproduce (see docs/workloads.md, "GEM").

Corpus: the running interpreter's own standard-library sources (character level, no download).
Federated: each client holds a contiguous block of modules (non-IID by module); FedAvg of all
weights; ``gem_lambda = 0`` is the standard-training arm under the same seeds.
"""

from __future__ import annotations

import functools
import math
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import SupportsInt

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from flowerbed.clients.core.params import param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.nn import PreLNBlock
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext

# ---------------------------------------------------------------------------------------------
# 1. Data: the standard library's own source, character level
# ---------------------------------------------------------------------------------------------

VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))  # 96 symbols; anything else -> "?"
_INDEX = {ch: i for i, ch in enumerate(VOCAB)}
_UNKNOWN = _INDEX["?"]


def encode(text: str) -> np.ndarray:
    """Characters to token ids (tabs become four spaces, other non-ASCII becomes '?')."""
    text = text.replace("\t", "    ")
    return np.fromiter((_INDEX.get(ch, _UNKNOWN) for ch in text), dtype=np.int64, count=len(text))


def decode(ids: Iterable[SupportsInt]) -> str:
    return "".join(VOCAB[int(i)] for i in ids)


@functools.lru_cache(maxsize=4)
def stdlib_modules(num_modules: int = 60) -> tuple[tuple[str, np.ndarray], ...]:
    """The first ``num_modules`` top-level ``.py`` files of this interpreter's stdlib, encoded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))[:num_modules]
    if not files:
        raise RuntimeError(f"no standard-library sources found under {root}")
    return tuple((f.stem, encode(f.read_text(encoding="utf-8", errors="replace"))) for f in files)


def split_module(ids: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Head of each module for training, its tail for validation (no window crosses the cut)."""
    cut = int(round(len(ids) * (1 - val_fraction)))
    return ids[:cut], ids[cut:]


def module_blocks(sizes: list[int], num_partitions: int) -> list[list[int]]:
    """Contiguous blocks of modules with roughly equal character counts (non-IID by module)."""
    total = float(sum(sizes))
    blocks: list[list[int]] = [[] for _ in range(num_partitions)]
    running = 0.0
    for i, size in enumerate(sizes):
        centre = running + size / 2
        blocks[min(int(centre / total * num_partitions), num_partitions - 1)].append(i)
        running += size
    for b in range(num_partitions):  # every client gets at least one module
        if not blocks[b]:
            donor = max(range(num_partitions), key=lambda j: len(blocks[j]))
            blocks[b].append(blocks[donor].pop())
    return blocks


def corpus(
    num_modules: int, val_fraction: float, modules: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated train and validation token streams of the chosen modules."""
    mods = stdlib_modules(num_modules)
    chosen = range(len(mods)) if modules is None else modules
    parts = [split_module(mods[i][1], val_fraction) for i in chosen]
    train = np.concatenate([p[0] for p in parts])
    val = np.concatenate([p[1] for p in parts])
    return torch.from_numpy(train), torch.from_numpy(val)


def sample_windows(
    stream: torch.Tensor, n: int, ctx: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random windows: inputs ``x[:, :ctx]`` and next-token targets ``y``."""
    starts = torch.randint(0, len(stream) - ctx - 1, (n,), generator=generator)
    windows = torch.stack([stream[s : s + ctx + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


# ---------------------------------------------------------------------------------------------
# 2. Model: a small pre-LN GPT with tied input/output embeddings
# ---------------------------------------------------------------------------------------------


class TinyLM(nn.Module):
    """Decoder-only LM; ``logits = E . LN_f(h_L)`` with ``E`` the input embedding (tied head)."""

    def __init__(
        self, vocab: int, d: int, layers: int, heads: int, ctx: int, emb_std: float = 1.0
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(PreLNBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        nn.init.normal_(self.tok.weight, std=emb_std)
        nn.init.normal_(self.pos.weight, std=0.02)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.tok.weight.T

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1]))

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Returns (logits, final post-LN state, residual stream after each block)."""
        x = self.embed(idx)
        residuals = []
        for block in self.blocks:
            x = block(x)
            residuals.append(x)
        h = self.ln_f(x)
        return self.head(h), h, residuals

    def run_from(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Logits when the residual stream after block ``layer`` (1-based) is replaced by ``x``."""
        for block in self.blocks[layer:]:
            x = block(x)
        return self.head(self.ln_f(x))


# ---------------------------------------------------------------------------------------------
# 3. Local step: next-token cross-entropy + the GEM term
# ---------------------------------------------------------------------------------------------


def gem_loss(
    h: torch.Tensor, embeddings: torch.Tensor, logits: torch.Tensor, detach_p: bool = True
) -> torch.Tensor:
    """Mean over positions of ``||h - E^T p||^2`` with ``p = softmax(logits)`` (optionally sg)."""
    p = torch.softmax(logits, dim=-1)
    if detach_p:
        p = p.detach()
    mixture = p @ embeddings
    return ((h - mixture) ** 2).sum(-1).mean()


@dataclass
class LMConfig:
    """The language model and its local training (also the first fields of the workload params)."""

    d_model: int = param(64, ge=1)
    layers: int = param(3, ge=1)
    heads: int = param(4, ge=1)
    ctx: int = param(64, ge=1)
    batch_size: int = param(32, ge=1)
    lr: float = param(3e-3, gt=0)
    weight_decay: float = param(0.01, ge=0)
    gem_lambda: float = param(0.03, ge=0)  # 0 = the standard-training arm
    detach_p: bool = True
    # -1: final state after LN_f; l in 1..layers-1: LN_f(residual l) (checked against layers)
    target_layer: int = param(-1, ge=-1)
    warmup_steps: int = param(0, ge=0)
    emb_std: float = param(
        1.0, gt=0
    )  # torch's nn.Embedding default; 0.02 (GPT-2) gives no GEM benefit here


def build_model(cfg: LMConfig, seed: int) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(len(VOCAB), cfg.d_model, cfg.layers, cfg.heads, cfg.ctx, cfg.emb_std)


def gem_weight(cfg: LMConfig, step: int) -> float:
    """GEM weight at global step ``step``: linear warm-up from 0 over ``warmup_steps``."""
    if cfg.warmup_steps <= 0:
        return cfg.gem_lambda
    return cfg.gem_lambda * min(1.0, (step + 1) / cfg.warmup_steps)


def train_lm(
    model: TinyLM, stream: torch.Tensor, cfg: LMConfig, steps: int, seed: int, start_step: int = 0
) -> dict[str, float]:
    """``steps`` AdamW steps on random windows of ``stream``; returns mean CE and GEM terms."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    model.train()
    ce_sum = gem_sum = 0.0
    for step in range(steps):
        x, y = sample_windows(stream, cfg.batch_size, cfg.ctx, generator)
        logits, h, residuals = model(x)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss = ce
        weight = gem_weight(cfg, start_step + step)
        if weight > 0:
            state = h if cfg.target_layer < 0 else model.ln_f(residuals[cfg.target_layer - 1])
            gem = gem_loss(state, model.tok.weight, logits, cfg.detach_p)
            loss = ce + weight * gem
            gem_sum += float(gem.detach())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ce_sum += float(ce.detach())
    return {"train_ce": ce_sum / max(steps, 1), "train_gem": gem_sum / max(steps, 1)}


# ---------------------------------------------------------------------------------------------
# 4. Metrics: perplexity, anisotropy, hull residual, logit lens, causal faithfulness
# ---------------------------------------------------------------------------------------------


def anisotropy(states: torch.Tensor) -> float:
    """Mean cosine similarity over distinct pairs of rows (Ethayarajh 2019)."""
    unit = F.normalize(states, dim=-1)
    gram = unit @ unit.T
    n = len(unit)
    return float((gram.sum() - gram.diagonal().sum()) / (n * (n - 1)))


@torch.no_grad()
def lm_metrics(
    model: TinyLM, stream: torch.Tensor, ctx: int, windows: int = 64, seed: int = 0
) -> dict[str, float]:
    """Validation metrics on ``windows`` fixed random windows of ``stream``.

    ``lens_ce_l{l}``: CE of ``E . LN_f(h_l)`` (untuned final LN and tied head) for every layer
    below the last. ``faithfulness_l{l}``: removing the embedding direction of the lens's top
    token from ``h_l`` lowers the final log-probability of that token by this many nats more
    than removing a random token's direction does (> 0: the decoding is causally used).
    """
    model.eval()
    x, y = sample_windows(stream, windows, ctx, torch.Generator().manual_seed(seed))
    logits, h, residuals = model(x)
    vocab = logits.shape[-1]
    ce = float(F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1)))
    emb = model.tok.weight
    flat_h = h.reshape(-1, h.shape[-1])
    mixture = torch.softmax(logits, -1).reshape(-1, vocab) @ emb
    picks = torch.randperm(len(flat_h), generator=torch.Generator().manual_seed(seed + 1))[:512]
    out = {
        "val_ce": ce,
        "perplexity": math.exp(ce),
        "anisotropy": anisotropy(flat_h[picks]),
        "anisotropy_embeddings": anisotropy(emb),
        "hull_residual": float(
            ((flat_h - mixture) ** 2).sum(-1).mean() / (flat_h**2).sum(-1).mean()
        ),
    }
    log_p = torch.log_softmax(logits, -1)
    rng = torch.Generator().manual_seed(seed + 2)
    for layer in range(1, len(residuals)):
        lens_logits = model.head(model.ln_f(residuals[layer - 1]))
        out[f"lens_ce_l{layer}"] = float(
            F.cross_entropy(lens_logits.reshape(-1, vocab), y.reshape(-1))
        )
        top = lens_logits.argmax(-1)
        rand = torch.randint(0, vocab, top.shape, generator=rng)
        drops = []
        for token in (top, rand):
            direction = F.normalize(emb[token], dim=-1)
            r = residuals[layer - 1]
            ablated = r - (r * direction).sum(-1, keepdim=True) * direction
            new_log_p = torch.log_softmax(model.run_from(layer, ablated), -1)
            base = log_p.gather(-1, top.unsqueeze(-1))
            drops.append(float((base - new_log_p.gather(-1, top.unsqueeze(-1))).mean()))
        out[f"faithfulness_l{layer}"] = drops[0] - drops[1]
    return out


def run_local(
    cfg: LMConfig, seed: int, steps: int, num_modules: int = 60, val_fraction: float = 0.1,
    eval_windows: int = 64,
) -> dict[str, float]:  # fmt: skip
    """Centralised pre-training of one arm from ``seed``; metrics on the validation tails."""
    torch.set_num_threads(1)
    train, val = corpus(num_modules, val_fraction)
    model = build_model(cfg, seed)
    train_lm(model, train, cfg, steps, seed)
    return lm_metrics(model, val, cfg.ctx, eval_windows, seed=12345)


# ---------------------------------------------------------------------------------------------
# 5. Registration: the federated workload
# ---------------------------------------------------------------------------------------------


@dataclass
class LMData:
    train: torch.Tensor
    val: torch.Tensor


@WORKLOADS.register("gem", "Char-level tied LM on stdlib sources with the GEM regulariser")
class GEM(Workload):
    @dataclass
    class Params(LMConfig):
        local_steps: int = param(50, ge=0)
        num_modules: int = param(60, ge=1)
        val_fraction: float = param(0.1, gt=0, lt=1)
        eval_windows: int = param(64, ge=1)

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        p = self.params
        self.lm = LMConfig(**{f.name: getattr(p, f.name) for f in fields(LMConfig)})
        if not -1 <= p.target_layer < p.layers or p.target_layer == 0:
            raise ValueError("target_layer must be -1 (final) or in 1..layers-1")

    def _model(self, arrays: ArrayRecord) -> TinyLM:
        model = TinyLM(len(VOCAB), self.lm.d_model, self.lm.layers, self.lm.heads, self.lm.ctx)
        model.load_state_dict(arrays.to_torch_state_dict())
        return model

    def load_partition(self, partition_id: int, num_partitions: int) -> LMData:
        sizes = [len(ids) for _, ids in stdlib_modules(self.params.num_modules)]
        block = module_blocks(sizes, num_partitions)[partition_id]
        train, val = corpus(self.params.num_modules, self.params.val_fraction, block)
        return LMData(train, val)

    def init_arrays(self) -> ArrayRecord:
        return ArrayRecord(build_model(self.lm, self.ctx.seed).state_dict())

    def fit(
        self, arrays: ArrayRecord, data: LMData, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        model = self._model(arrays)
        server_round = int(config["server-round"])
        seed = client_seed(self.ctx.seed, config["partition-id"], server_round)
        steps = self.params.local_steps
        metrics = train_lm(model, data.train, self.lm, steps, seed, (server_round - 1) * steps)
        metrics["num-examples"] = steps * self.lm.batch_size
        return ArrayRecord(model.state_dict()), metrics

    def evaluate(self, arrays: ArrayRecord, data: LMData, config: RoundConfig):
        metrics = lm_metrics(self._model(arrays), data.val, self.lm.ctx, self.params.eval_windows)
        metrics["num-examples"] = self.params.eval_windows * self.lm.ctx
        return metrics

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        _, val = corpus(self.params.num_modules, self.params.val_fraction)
        return lm_metrics(self._model(arrays), val, self.lm.ctx, self.params.eval_windows, 12345)
