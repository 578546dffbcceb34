"""FILOsofer: Fisher-guided obfuscation of exposed weights, recovered by TEE-held LoRA (abstracts.md §19).

A model owner deploys a network on an untrusted GPU and keeps a small part in a TEE (TEE-shielded
DNN partitioning). FILOsofer exposes *all* weights but first corrupts the few that matter most: the
top-``rho`` weights by diagonal empirical Fisher ``F_i = E[(d log p(y|x) / d theta_i)^2]`` are
flipped to the opposite extreme of their layer (in range, no magnitude outlier), optionally pushed
further by masked entropy ascent. The authorised user gets the accuracy back through low-rank
adapters ``B A`` held in the TEE, distilled from the victim with the obfuscated weights frozen. A
model-stealing attacker who copies the exposed weights and fine-tunes them on a fraction ``q`` of the
data should do no better than training from scratch (the black-box bound), while a random mask of
the same size leaks. After the OpenReview submission ``RujSwsLLlq``; no code was available, so the
flip rule, the cross-layer adapter and the attacker are reconstructions (docs/workloads.md).

Federated (``filosofer``): clients train the victim MLP on shards of scikit-learn's digits with
FedAvg and return, next to the trained weights, the diagonal Fisher of the model they *received*
(``fisher.*`` arrays); FedAvg's example-weighted mean of them is the pooled-data Fisher of that
global model. The ``model-stealing`` attack (attacks/model_stealing.py) releases the final global
model under the configured defense (clients/defenses/filosofer.py) and runs the stealing attack.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from sklearn.datasets import load_digits
from torch import nn

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.workloads import WORKLOADS, Workload, train_cross_entropy

# ---------------------------------------------------------------------------------------------
# 1. data: scikit-learn's bundled digits, a seeded train pool / test split
# ---------------------------------------------------------------------------------------------


@dataclass
class Split:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


def digits_split(seed: int, n_train: int = 1200) -> Split:
    """Digits (pixels in [0, 1]) split into a training pool and a held-out test set by ``seed``."""
    x, y = _digits()
    order = np.random.default_rng(seed).permutation(len(y))
    tr, te = order[:n_train], order[n_train:]
    t = torch.from_numpy
    return Split(t(x[tr]), t(y[tr]), t(x[te]), t(y[te]))


def attacker_subset(split: Split, q: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fraction ``q`` of the training pool (at least one sample per class where possible)."""
    n = max(int(round(q * len(split.y_train))), 10)
    idx = np.random.default_rng([seed, 17]).permutation(len(split.y_train))[:n]
    return split.x_train[idx], split.y_train[idx]


# ---------------------------------------------------------------------------------------------
# 2. model: an MLP, and the same MLP with low-rank adapters (the TEE part)
# ---------------------------------------------------------------------------------------------


def make_mlp(in_dim: int = 64, hidden: list[int] | None = None, classes: int = 10) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden if hidden is not None else [128, 128]:
        layers += [nn.Linear(in_dim, width), nn.ReLU()]
        in_dim = width
    layers.append(nn.Linear(in_dim, classes))
    return nn.Sequential(*layers)


def linear_layers(model: nn.Sequential) -> list[nn.Linear]:
    return [m for m in model if isinstance(m, nn.Linear)]


def weight_keys(model: nn.Sequential) -> list[str]:
    """State-dict keys of the weight matrices (the obfuscation candidates; biases stay exposed)."""
    return [f"{i}.weight" for i, m in enumerate(model) if isinstance(m, nn.Linear)]


class AdaptedMLP(nn.Module):
    """Frozen (obfuscated) MLP plus rank-``r`` adapters ``z_dst += B A h_src``.

    ``h_src`` is the input of linear layer ``src`` and ``z_dst`` the pre-activation of linear layer
    ``dst``. Per-layer LoRA: pairs ``(l, l)``. Cross-layer: ``(l, l + 1)`` reads layer l's input and
    corrects the next layer's pre-activation, so one TEE call spans two layers (our reading of the
    paper's "cross-layer LoRA").
    """

    def __init__(self, base: nn.Sequential, pairs: list[tuple[int, int]], rank: int, seed: int):
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        lins = linear_layers(base)
        gen = torch.Generator().manual_seed(seed)
        self.pairs = list(pairs)
        self.a = nn.ParameterList()
        self.b = nn.ParameterList()
        for src, dst in self.pairs:
            d_in, d_out = lins[src].in_features, lins[dst].out_features
            self.a.append(nn.Parameter(torch.randn(rank, d_in, generator=gen) / d_in**0.5))
            self.b.append(nn.Parameter(torch.zeros(d_out, rank)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inputs: dict[int, torch.Tensor] = {}
        layer, h = 0, x
        for module in self.base:
            if isinstance(module, nn.Linear):
                inputs[layer] = h
                z = module(h)
                for (src, dst), a, b in zip(self.pairs, self.a, self.b, strict=True):
                    if dst == layer:
                        z = z + inputs[src] @ a.T @ b.T
                h, layer = z, layer + 1
            else:
                h = module(h)
        return h

    def tee_params(self) -> int:
        return sum(p.numel() for p in list(self.a) + list(self.b))

    def tee_macs(self) -> int:
        """Multiply-accumulates per sample done in the TEE: ``r (d_in + d_out)`` per adapter."""
        return sum(a.numel() + b.numel() for a, b in zip(self.a, self.b, strict=True))


def model_params(model: nn.Sequential) -> int:
    return sum(p.numel() for p in model.parameters())


def model_macs(model: nn.Sequential) -> int:
    return sum(m.in_features * m.out_features for m in linear_layers(model))


# ---------------------------------------------------------------------------------------------
# 3. local step
# ---------------------------------------------------------------------------------------------


train = train_cross_entropy  # Adam on cross-entropy in shuffled minibatches (shared)


def train_victim(split: Split, seed: int, epochs: int = 40, lr: float = 1e-3) -> nn.Sequential:
    """The centrally trained victim (the analysis' stand-in for the FedAvg model)."""
    torch.manual_seed(seed)
    model = make_mlp()
    train(model, split.x_train, split.y_train, epochs, lr, 64, torch.Generator().manual_seed(seed))
    return model


# ---------------------------------------------------------------------------------------------
# 4. metrics: Fisher, masks, obfuscation, recovery, stealing
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    return model(x)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((predict(model, x).argmax(1) == y).float().mean())


def output_entropy(model: nn.Module, x: torch.Tensor) -> float:
    """Mean predictive entropy normalised by ``log(classes)`` (1 = uniform outputs)."""
    logp = torch.log_softmax(predict(model, x), dim=1)
    return float(-(logp.exp() * logp).sum(1).mean() / np.log(logp.shape[1]))


def fisher_diagonal(
    model: nn.Sequential, x: torch.Tensor, y: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Diagonal empirical Fisher of every parameter, vectorised (one backward pass).

    For a linear layer the per-sample gradient of ``W`` is ``g a^T`` (``g`` = d log p(y|x) / d z,
    ``a`` = the layer input), so ``E[(g a^T)^2] = (g^2)^T (a^2) / N`` and the bias gets ``E[g^2]``.
    The ``g`` of all samples come from one backward of the summed log-likelihood, since sample i's
    log-likelihood depends only on its own pre-activations.
    """
    inputs, outputs = [], []
    h = x
    for module in model:
        if isinstance(module, nn.Linear):
            inputs.append(h.detach())
            h = module(h)
            outputs.append(h)
        else:
            h = module(h)
    logp = torch.log_softmax(h, dim=1).gather(1, y[:, None]).sum()
    grads = torch.autograd.grad(logp, outputs)
    fisher = {}
    idx = [i for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    for i, a, g in zip(idx, inputs, grads, strict=True):
        fisher[f"{i}.weight"] = (g**2).T @ (a**2) / len(x)
        fisher[f"{i}.bias"] = (g**2).mean(0)
    return {k: v.detach() for k, v in fisher.items()}


def fisher_per_sample(
    model: nn.Sequential, x: torch.Tensor, y: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Reference: mean of squared per-sample autograd gradients (slow; for the test)."""
    names = [n for n, _ in model.named_parameters()]
    total = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(len(x)):
        logp = torch.log_softmax(model(x[i : i + 1]), dim=1)[0, y[i]]
        for n, g in zip(names, torch.autograd.grad(logp, list(model.parameters())), strict=True):
            total[n] += g.detach() ** 2
    return {n: t / len(x) for n, t in total.items()}


def select_mask(
    state: dict[str, torch.Tensor], keys: list[str], rho: float, how: str,
    fisher: dict[str, torch.Tensor] | None = None, seed: int = 0,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Global top-``rho`` mask over the tensors ``keys``: by Fisher, by |theta|, or at random."""
    if how == "fisher":
        if fisher is None:
            raise ValueError("a Fisher mask needs the Fisher diagonal")
        score = torch.cat([fisher[k].flatten().double() for k in keys])
    elif how == "magnitude":
        score = torch.cat([state[k].flatten().abs().double() for k in keys])
    elif how == "random":
        total = sum(state[k].numel() for k in keys)
        score = torch.rand(
            total, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
        )
    else:
        raise ValueError(f"mask must be fisher, magnitude or random, not {how!r}")
    k = max(int(round(rho * score.numel())), 1)
    flat = torch.zeros(score.numel(), dtype=torch.bool)
    flat[torch.topk(score, k).indices] = True
    masks, start = {}, 0
    for key in keys:
        n = state[key].numel()
        masks[key] = flat[start : start + n].reshape(state[key].shape)
        start += n
    return masks


def obfuscate(
    state: dict[str, torch.Tensor], masks: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Flip each masked weight to the opposite extreme of its tensor: ``theta > 0 -> min``, else max.

    With a layer's min < 0 < max this is ``-sign(theta) * (near-max magnitude)``, and every value
    stays inside the original ``[min, max]``, so no exposed weight is a magnitude outlier.
    """
    out = {k: v.clone() for k, v in state.items()}
    for key, mask in masks.items():
        w = state[key]
        flipped = torch.where(w > 0, w.min(), w.max())
        out[key] = torch.where(mask, flipped, w)
    return out


def entropy_ascent(
    model: nn.Sequential, masks: dict[str, torch.Tensor], x: torch.Tensor, steps: int,
    lr: float = 0.05,
) -> None:  # fmt: skip
    """Masked entropy ascent in place: only masked weights move, clamped to their layer's range."""
    params = dict(model.named_parameters())
    masks = {k: m for k, m in masks.items() if m.any()}
    bounds = {k: (float(params[k].detach().min()), float(params[k].detach().max())) for k in masks}
    for _ in range(steps):
        logp = torch.log_softmax(model(x), dim=1)
        entropy = -(logp.exp() * logp).sum(1).mean()
        grads = torch.autograd.grad(entropy, [params[k] for k in masks])
        with torch.no_grad():
            for (key, mask), g in zip(masks.items(), grads, strict=True):
                lo, hi = bounds[key]
                step = lr * (hi - lo) * g / (g[mask].abs().max() + 1e-12)
                params[key].add_(torch.where(mask, step, torch.zeros_like(step)))
                params[key].clamp_(*bounds[key])


def iterative_fisher_mask(
    state: dict[str, torch.Tensor], keys: list[str], rho: float, fisher: dict[str, torch.Tensor],
    x: torch.Tensor, y: torch.Tensor, chunks: int = 4, hidden: list[int] | None = None,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Greedy Fisher selection: flip ``rho / chunks`` at a time, re-estimating the Fisher in between.

    The first chunk uses ``fisher`` (the clients' pooled diagonal); later chunks use the Fisher of
    the partially obfuscated model on the owner's ``(x, y)``, so each chunk targets the weights that
    matter *given* the flips already made. ``chunks = 1`` is the one-shot top-``rho`` selection.
    """
    total = {k: torch.zeros_like(state[k], dtype=torch.bool) for k in keys}
    current, scores = state, fisher
    for chunk in range(chunks):
        if chunk:
            scores = fisher_diagonal(load_state(current, hidden), x, y)
        scores = {k: torch.where(total[k], torch.zeros_like(scores[k]), scores[k]) for k in keys}
        masks = select_mask(state, keys, rho / chunks, "fisher", scores)
        total = {k: total[k] | masks[k] for k in keys}
        current = obfuscate(state, total)
    return total


def load_state(state: dict[str, torch.Tensor], hidden: list[int] | None = None) -> nn.Sequential:
    model = make_mlp(hidden=hidden)
    model.load_state_dict({k: v.clone() for k, v in state.items()})
    return model


def distill_adapters(
    victim: nn.Sequential, exposed: nn.Sequential, x: torch.Tensor, rank: int = 4,
    cross_layer: bool = False, epochs: int = 80, lr: float = 1e-2, batch_size: int = 128,
    seed: int = 0,
) -> AdaptedMLP:  # fmt: skip
    """Train TEE adapters on the owner's data with ``KL(p_victim || p_exposed+BA)``; exposed frozen."""
    n_layers = len(linear_layers(exposed))
    if cross_layer:
        pairs = [(i, i + 1) for i in range(n_layers - 1)] + [(n_layers - 1, n_layers - 1)]
    else:
        pairs = [(i, i) for i in range(n_layers)]
    adapted = AdaptedMLP(exposed, pairs, rank, seed)
    with torch.no_grad():
        target = torch.log_softmax(predict(victim, x), dim=1)
    opt = torch.optim.Adam(list(adapted.a) + list(adapted.b), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), batch_size):
            batch = order[start : start + batch_size]
            opt.zero_grad()
            logq = torch.log_softmax(adapted(x[batch]), dim=1)
            loss = nn.functional.kl_div(logq, target[batch], log_target=True, reduction="batchmean")
            loss.backward()
            opt.step()
    return adapted


@dataclass
class Release:
    """What the owner deploys: ``exposed`` on the GPU (None = nothing exposed) and the TEE's share."""

    exposed: dict[str, torch.Tensor] | None
    user_model: nn.Module
    tee_param_fraction: float
    tee_flop_fraction: float
    keep_last_layer_secret: bool = False
    extra: dict[str, float] = field(default_factory=dict)


def release(
    victim: nn.Sequential, scheme: str, owner_x: torch.Tensor, owner_y: torch.Tensor,
    fisher: dict[str, torch.Tensor] | None, rho: float = 0.02, rank: int = 4,
    cross_layer: bool = False, entropy_steps: int = 0, distill_epochs: int = 80,
    fisher_chunks: int = 4, seed: int = 0,
) -> Release:  # fmt: skip
    """Deploy ``victim`` under ``scheme``.

    ``none``: all weights exposed, nothing in the TEE. ``shield-last-layer`` (DarkneTZ-style): the
    last layer runs in the TEE and is withheld. ``whole-model``: everything in the TEE (the attacker
    is black-box). ``fisher`` / ``random`` / ``magnitude``: a top-``rho`` mask of that kind is
    flipped (FILOsofer = fisher) and LoRA adapters recover the user's accuracy.
    """
    state = {k: v.detach().clone() for k, v in victim.state_dict().items()}
    total, macs = model_params(victim), model_macs(victim)
    if scheme == "none":
        return Release(state, victim, 0.0, 0.0)
    if scheme == "whole-model":
        return Release(None, victim, 1.0, 1.0)
    if scheme == "shield-last-layer":
        last = linear_layers(victim)[-1]
        frac_p = (last.weight.numel() + last.bias.numel()) / total
        return Release(
            state, victim, frac_p, last.weight.numel() / macs, keep_last_layer_secret=True
        )
    keys, hidden = weight_keys(victim), _hidden(victim)
    if scheme == "fisher":
        if fisher is None:
            fisher = fisher_diagonal(victim, owner_x, owner_y)
        masks = iterative_fisher_mask(state, keys, rho, fisher, owner_x, owner_y, fisher_chunks,
                                      hidden)  # fmt: skip
    else:
        masks = select_mask(state, keys, rho, scheme, fisher, seed)
    exposed_model = load_state(obfuscate(state, masks), hidden)
    if entropy_steps:
        entropy_ascent(exposed_model, masks, owner_x, entropy_steps)
    exposed = {k: v.detach().clone() for k, v in exposed_model.state_dict().items()}
    adapted = distill_adapters(victim, exposed_model, owner_x, rank, cross_layer, distill_epochs,
                               seed=seed)  # fmt: skip
    return Release(exposed, adapted, adapted.tee_params() / total, adapted.tee_macs() / macs,
                   extra={"masked": float(sum(m.sum() for m in masks.values()))})  # fmt: skip


def _hidden(model: nn.Sequential) -> list[int]:
    return [m.out_features for m in linear_layers(model)[:-1]]


def steal(
    exposed: dict[str, torch.Tensor] | None, x: torch.Tensor, y: torch.Tensor,
    x_test: torch.Tensor, y_test: torch.Tensor, lrs: tuple[float, ...] = (0.0, 1e-3, 1e-2),
    steps: int = 150, seed: int = 0, keep_last_layer_secret: bool = False,
    hidden: list[int] | None = None,
) -> dict[str, float]:  # fmt: skip
    """Model stealing: warm-start from the exposed weights, fine-tune on ``(x, y)``, best over ``lrs``.

    ``lr = 0`` uses the exposed weights as they are. ``exposed=None`` (nothing exposed) or a
    withheld last layer re-initialise the missing part at random. Full-batch Adam for ``steps``
    steps. Returns the best test accuracy and the per-lr accuracies (the attacker's upper bound:
    the best lr is picked on the test set).
    """
    out: dict[str, float] = {}
    for lr in lrs:
        torch.manual_seed(seed)
        model = make_mlp(hidden=hidden)
        if exposed is not None:
            state = {k: v.clone() for k, v in exposed.items()}
            if keep_last_layer_secret:
                last = [k for k in model.state_dict() if k.startswith(f"{len(model) - 1}.")]
                fresh = model.state_dict()
                state.update({k: fresh[k].clone() for k in last})
            model.load_state_dict(state)
        if lr > 0:
            opt = torch.optim.Adam(model.parameters(), lr=lr)
            model.train()
            for _ in range(steps):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        out[f"lr{lr:g}"] = accuracy(model, x_test, y_test)
    out["best"] = max(out.values())
    return out


def black_box(
    x: torch.Tensor, y: torch.Tensor, x_test: torch.Tensor, y_test: torch.Tensor, steps: int = 150,
    seed: int = 0, hidden: list[int] | None = None,
) -> float:  # fmt: skip
    """The black-box bound: the same architecture from random init on the same data, best lr."""
    return steal(None, x, y, x_test, y_test, (1e-3, 1e-2), steps, seed, hidden=hidden)["best"]


SCHEMES: dict[str, dict[str, Any]] = {
    "none": {"scheme": "none"},
    "shield-last-layer": {"scheme": "shield-last-layer"},
    "whole-model": {"scheme": "whole-model"},
    "random 2%": {"scheme": "random"},
    "magnitude 2%": {"scheme": "magnitude"},
    "FILOsofer 2%": {"scheme": "fisher"},
}


def stealing_table(
    seed: int, qs: tuple[float, ...] = (0.02, 0.05, 0.1),
    schemes: dict[str, dict[str, Any]] | None = None, steps: int = 150, victim_epochs: int = 40,
) -> dict[str, Any]:  # fmt: skip
    """One seed of the analysis: victim, each scheme's release (``release`` kwargs), surrogate per q."""
    torch.set_num_threads(1)
    split = digits_split(seed)
    victim = train_victim(split, seed, victim_epochs)
    fisher = fisher_diagonal(victim, split.x_train, split.y_train)
    out: dict[str, Any] = {"victim": accuracy(victim, split.x_test, split.y_test), "schemes": {}}
    subsets = {q: attacker_subset(split, q, seed) for q in qs}
    out["black-box"] = {
        q: black_box(*subsets[q], split.x_test, split.y_test, steps, seed) for q in qs
    }
    for name, kwargs in (schemes or SCHEMES).items():
        rel = release(victim, owner_x=split.x_train, owner_y=split.y_train, fisher=fisher,
                      seed=seed, **kwargs)  # fmt: skip
        row: dict[str, Any] = {
            "user": accuracy(rel.user_model, split.x_test, split.y_test),
            "tee_params": rel.tee_param_fraction,
            "tee_flops": rel.tee_flop_fraction,
        }
        if rel.exposed is not None and not rel.keep_last_layer_secret:
            exposed_model = load_state(rel.exposed)
            row["exposed"] = accuracy(exposed_model, split.x_test, split.y_test)
            row["entropy"] = output_entropy(exposed_model, split.x_test)
        row["surrogate"] = {
            q: steal(rel.exposed, *subsets[q], split.x_test, split.y_test, steps=steps, seed=seed,
                     keep_last_layer_secret=rel.keep_last_layer_secret)["best"]
            for q in qs
        }  # fmt: skip
        out["schemes"][name] = row
    return out


# ---------------------------------------------------------------------------------------------
# 5. registration: FedAvg of the victim MLP, clients' Fisher diagonals pooled by sample count
# ---------------------------------------------------------------------------------------------

FISHER_PREFIX = "fisher."


@dataclass
class Shard:
    x: torch.Tensor
    y: torch.Tensor


def pack(model: nn.Module, fisher: dict[str, torch.Tensor]) -> ArrayRecord:
    """Model weights plus ``fisher.<key>`` arrays (the Fisher of the model the client received)."""
    record = {k: Array(v.detach().numpy().copy()) for k, v in model.state_dict().items()}
    record |= {FISHER_PREFIX + k: Array(v.detach().numpy().copy()) for k, v in fisher.items()}
    return ArrayRecord(record)


def unpack(arrays: ArrayRecord) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(model state, Fisher)`` from a packed record."""
    state, fisher = {}, {}
    for key in arrays:
        value = torch.from_numpy(np.array(arrays[key].numpy()))
        if key.startswith(FISHER_PREFIX):
            fisher[key[len(FISHER_PREFIX) :]] = value
        else:
            state[key] = value
    return state, fisher


@WORKLOADS.register(
    "filosofer",
    "victim MLP on digits by FedAvg; clients also return the Fisher diagonal (FILOsofer defense)",
)
class Filosofer(Workload):
    """Clients train the victim and report the diagonal empirical Fisher of the model they received.

    FedAvg's example-weighted mean of the clients' ``fisher.*`` arrays is the pooled-data Fisher
    of the global model sent that round; the ``model-stealing`` attack releases that model under
    the configured defense in the final round.
    """

    offers = frozenset({Capability.MODEL_RELEASE})

    @dataclass
    class Params:
        hidden: list[int] = param(factory=lambda: [128, 128], ge=1)
        train_size: int = param(1200, ge=1)
        lr: float = param(1e-3, gt=0)
        local_epochs: int = param(5, ge=1)
        batch_size: int = param(64, ge=1)

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.split = digits_split(cfg["seed"], self.params.train_size)

    def _model(self) -> nn.Sequential:
        return make_mlp(hidden=list(self.params.hidden))

    def load_partition(self, partition_id: int, num_partitions: int) -> Shard:
        return Shard(
            self.split.x_train[partition_id::num_partitions],
            self.split.y_train[partition_id::num_partitions],
        )

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.cfg["seed"])
        model = self._model()
        return pack(model, {k: torch.zeros_like(v) for k, v in model.state_dict().items()})

    def fit(
        self, arrays: ArrayRecord, data: Shard, config: dict[str, Any], state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        torch.set_num_threads(1)
        model = self._model()
        model.load_state_dict(unpack(arrays)[0])
        fisher = fisher_diagonal(model, data.x, data.y)  # of the received global model
        seed = client_seed(self.cfg["seed"], config["partition-id"], config["server-round"])
        loss = train(model, data.x, data.y, self.params.local_epochs, self.params.lr,
                     self.params.batch_size, torch.Generator().manual_seed(seed))  # fmt: skip
        return pack(model, fisher), {"num-examples": len(data.y), "loss": loss}

    def evaluate(self, arrays: ArrayRecord, data: Shard, config: dict[str, Any]):
        model = self._model()
        model.load_state_dict(unpack(arrays)[0])
        return {"num-examples": len(data.y), "accuracy": accuracy(model, data.x, data.y)}

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        model = self._model()
        model.load_state_dict(unpack(arrays)[0])
        return {"accuracy": accuracy(model, self.split.x_test, self.split.y_test)}
