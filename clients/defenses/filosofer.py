"""Model-release defenses against model stealing: FILOsofer and its comparators.

These act when the trained model is *deployed*, not during federated rounds: every client-side
hook stays the identity, and the ``model-stealing`` attack (attacks/model_stealing.py) asks the
configured defense how the final global model is released (``release``). This module holds the
release mechanism itself (masks, the flip, entropy ascent, TEE-held LoRA adapters); the shared MLP
helpers and the Fisher live in ``clients/training.py``.

- ``filosofer``: flip the top-``rho`` weights (by Fisher; ``mask: random | magnitude`` are the
  same-size ablations) to the other sign with a magnitude the tensor already has (``flip:
  sampled``; ``extreme`` pins them at the tensor's min / max, which a defense-aware attacker finds
  and zeroes: docs/methods/filosofer.md), LoRA adapters in the TEE recover the user's accuracy;
- ``shield-last-layer`` (``shield_last_layer.py``): DarkneTZ-style, the last layer runs in the TEE
  and is withheld;
- ``whole-model-tee`` (``whole_model_tee.py``): the whole model in the TEE, the attacker is
  black-box.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import choices, param
from flowerbed.clients.defenses import DEFENSES, Defense, Mechanism, WeightFlipping
from flowerbed.clients.training import (
    fisher_diagonal,
    hidden_sizes,
    linear_layers,
    load_state,
    predict,
)

DEFAULT_RHO = 0.08  # flipped fraction of the weight matrices (docs/methods/filosofer.md)


# -- the TEE part: low-rank adapters ----------------------------------------------------------
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


# -- masks and the flip ------------------------------------------------------------------
def weight_keys(model: nn.Sequential) -> list[str]:
    """State-dict keys of the weight matrices (the obfuscation candidates; biases stay exposed)."""
    return [f"{i}.weight" for i, m in enumerate(model) if isinstance(m, nn.Linear)]


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


#: where a flipped weight goes (``sampled`` is the default; ``extreme`` the original rule)
Flip = choices("Flip", ("extreme", "sampled"))


def obfuscate(
    state: dict[str, torch.Tensor], masks: dict[str, torch.Tensor], flip: Flip = Flip.sampled,
    low: float = 0.5, seed: int = 0,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Flip each masked weight to the other sign with a large magnitude, inside its tensor's range.

    ``extreme``: ``theta > 0 -> min``, else ``max`` (the largest damage, but the flipped weights sit
    exactly at their tensor's extremes, where an attacker finds them all). ``sampled``: a positive
    weight becomes a value drawn from the tensor's unflipped negative weights, between the ``low``
    quantile of their magnitudes and the most negative one (interpolated between order statistics),
    and a negative weight likewise from the positive ones: every flipped value lies among values the
    tensor already takes, never beyond them, so no exposed weight is an extreme or an outlier.
    """
    out = {k: v.clone() for k, v in state.items()}
    for index, (key, mask) in enumerate(masks.items()):
        w = state[key]
        if flip == Flip.extreme:
            flipped = torch.where(w > 0, w.min(), w.max())
        else:
            gen = torch.Generator().manual_seed(seed * 1009 + index)
            kept = w[~mask]
            negative = _sample_magnitudes(-kept[kept < 0], w.shape, low, gen)
            positive = _sample_magnitudes(kept[kept > 0], w.shape, low, gen)
            flipped = torch.where(w > 0, -negative, positive)
        out[key] = torch.where(mask, flipped, w)
    return out


def _sample_magnitudes(
    pool: torch.Tensor, shape: torch.Size, low: float, gen: torch.Generator
) -> torch.Tensor:
    """Values drawn between the ``low`` quantile and the maximum of ``pool`` (interpolated)."""
    pool = pool.flatten().sort().values
    if len(pool) < 2:
        return pool.max().expand(shape) if len(pool) else torch.zeros(shape)
    u = low + (1 - low) * torch.rand(shape, generator=gen, dtype=torch.float64)
    pos = u * (len(pool) - 1)
    below = pos.floor().long().clamp(max=len(pool) - 2)
    frac = (pos - below).to(pool.dtype)
    return pool[below] * (1 - frac) + pool[below + 1] * frac


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
    flip: Flip = Flip.sampled, low: float = 0.5, seed: int = 0,
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
        current = obfuscate(state, total, flip, low, seed)
    return total


def distill_adapters(
    victim: nn.Sequential, exposed: nn.Sequential, x: torch.Tensor, rank: int = 4,
    cross_layer: bool = True, epochs: int = 80, lr: float = 1e-2, batch_size: int = 128,
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
    fisher: dict[str, torch.Tensor] | None, rho: float = DEFAULT_RHO, rank: int = 4,
    cross_layer: bool = True, entropy_steps: int = 0, distill_epochs: int = 80,
    fisher_chunks: int = 4, seed: int = 0, flip: Flip = Flip.sampled, flip_low: float = 0.5,
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
    keys, hidden = weight_keys(victim), hidden_sizes(victim)
    if scheme == "fisher":
        if fisher is None:
            fisher = fisher_diagonal(victim, owner_x, owner_y)
        masks = iterative_fisher_mask(state, keys, rho, fisher, owner_x, owner_y, fisher_chunks,
                                      hidden, flip, flip_low, seed)  # fmt: skip
    else:
        masks = select_mask(state, keys, rho, scheme, fisher, seed)
    exposed_model = load_state(obfuscate(state, masks, flip, flip_low, seed), hidden)
    if entropy_steps:
        entropy_ascent(exposed_model, masks, owner_x, entropy_steps)
    exposed = {k: v.detach().clone() for k, v in exposed_model.state_dict().items()}
    adapted = distill_adapters(victim, exposed_model, owner_x, rank, cross_layer, distill_epochs,
                               seed=seed)  # fmt: skip
    return Release(exposed, adapted, adapted.tee_params() / total, adapted.tee_macs() / macs,
                   extra={"masked": float(sum(m.sum() for m in masks.values()))})  # fmt: skip


# -- registration ---------------------------------------------------------------------------
class ModelRelease(Defense):
    """A defense that decides what of the trained model the untrusted side sees."""

    needs = frozenset({Capability.MODEL_RELEASE})
    scheme = "none"

    def release(
        self, victim: nn.Sequential, owner_x: torch.Tensor, owner_y: torch.Tensor,
        fisher: dict[str, torch.Tensor] | None, seed: int,
    ) -> Release:  # fmt: skip
        return release(victim, self.scheme, owner_x, owner_y, fisher, seed=seed)


Mask = choices("Mask", ("fisher", "random", "magnitude"))


@DEFENSES.register(
    "filosofer", "Fisher-guided flip of the top-rho exposed weights + TEE-held LoRA recovery"
)
class Filosofer(ModelRelease):
    @dataclass
    class Params:
        rho: float = param(DEFAULT_RHO, gt=0, lt=1)
        mask: Mask = Mask("fisher")  # fisher | random | magnitude
        rank: int = param(4, ge=1)
        cross_layer: bool = True
        entropy_steps: int = param(0, ge=0)
        distill_epochs: int = param(80, ge=0)
        # 1 = one-shot top-rho; >1 = greedy, Fisher re-estimated between chunks
        fisher_chunks: int = param(4, ge=1)
        flip: Flip = Flip("sampled")  # sampled: values the tensor already has; extreme: min / max
        # sampled flips draw magnitudes between this quantile of the other sign's and its maximum
        flip_low: float = param(0.5, ge=0, lt=1)

    params: Params

    def mechanism(self) -> list[Mechanism]:
        return [WeightFlipping(self.params.rho)]

    def release(self, victim, owner_x, owner_y, fisher, seed: int) -> Release:  # noqa: ANN001
        p = self.params
        return release(victim, p.mask, owner_x, owner_y, fisher, p.rho, p.rank, p.cross_layer,
                       p.entropy_steps, p.distill_epochs, p.fisher_chunks, seed, p.flip,
                       p.flip_low)  # fmt: skip
