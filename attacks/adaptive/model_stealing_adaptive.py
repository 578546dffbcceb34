"""Defense-aware model stealing: find the weights a release defense flipped, zero them, fine-tune.

FILOsofer exposes every weight after flipping a small Fisher-selected subset (``rho`` of the weight
matrices; the mechanism and ``rho`` are public, the mask is not). The attacker flags candidates with
three detectors and, for each, zeroes the flagged weights of the exposed model and runs the plain
stealing attack (fine-tune on its fraction ``q`` of the data, best learning rate):

- ``extremes``: values equal to their tensor's min or max (a flip pinned at the extremes);
- ``magnitude``: the largest ``f`` of all weight magnitudes (a damaging flip is a large value);
- ``saliency``: the largest ``f`` of ``theta * dL/dtheta`` on the attacker's own data, the
  first-order loss *decrease* from zeroing ``theta`` (a harmful weight shows in the gradient);

with ``f`` in ``fractions`` x ``rho``. The adaptive surrogate is the best of them, like the plain
attacker's best learning rate (an upper bound of what such an attacker gets).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from flwr.serverapp.strategy import Strategy
from torch import nn

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.model_stealing import ModelStealing, Stealing, steal
from flowerbed.attacks.observer import AttackObserver
from flowerbed.attacks.protocols import Answer, Scorer, Writer
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.defenses import WeightFlipping
from flowerbed.clients.defenses.filosofer import DEFAULT_RHO, Release
from flowerbed.clients.training import load_state

DETECTORS = ("extremes", "magnitude", "saliency")


def weight_names(state: dict[str, torch.Tensor]) -> list[str]:
    """The weight matrices of an exposed state dict (biases are never flipped)."""
    return [k for k, v in state.items() if k.endswith("weight") and v.dim() == 2]


def _top_fraction(scores: dict[str, torch.Tensor], fraction: float) -> dict[str, torch.Tensor]:
    flat = torch.cat([s.flatten() for s in scores.values()])
    k = max(int(round(fraction * flat.numel())), 1)
    threshold = torch.topk(flat, k).values[-1]
    return {name: s >= threshold for name, s in scores.items()}


def flag(
    exposed: dict[str, torch.Tensor], detector: str, fraction: float = 0.0,
    x: torch.Tensor | None = None, y: torch.Tensor | None = None,
    hidden: list[int] | None = None,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Masks of the weights ``detector`` suspects (see the module docstring)."""
    names = weight_names(exposed)
    if detector == "extremes":
        return {
            n: (exposed[n] == exposed[n].min()) | (exposed[n] == exposed[n].max()) for n in names
        }
    if detector == "magnitude":
        return _top_fraction({n: exposed[n].abs() for n in names}, fraction)
    if detector == "saliency":
        model = load_state(exposed, hidden)
        params = dict(model.named_parameters())
        assert y is not None  # the saliency detector is given the attacker's data
        loss = nn.functional.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, [params[n] for n in names])
        scores = {n: (exposed[n] * g).detach() for n, g in zip(names, grads, strict=True)}
        return _top_fraction(scores, fraction)
    raise ValueError(f"unknown detector {detector!r} (allowed: {', '.join(DETECTORS)})")


def zeroed(exposed: dict[str, torch.Tensor], masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:  # fmt: skip
    return {k: torch.where(masks[k], torch.zeros_like(v), v) if k in masks else v.clone()
            for k, v in exposed.items()}  # fmt: skip


def adaptive_steal(
    exposed: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, x_test: torch.Tensor,
    y_test: torch.Tensor, rho: float, fractions: tuple[float, ...] = (1.0, 2.5),
    lrs: tuple[float, ...] = (0.0, 1e-3, 1e-2), steps: int = 150, seed: int = 0,
    hidden: list[int] | None = None,
) -> dict[str, float]:  # fmt: skip
    """Best stealing accuracy over detectors: flag, zero, fine-tune. Keys ``<detector>[<f>]``, ``best``."""
    out: dict[str, float] = {}
    plans = [("extremes", 0.0)] + [
        (d, f * rho) for d in ("magnitude", "saliency") for f in fractions
    ]
    for detector, fraction in plans:
        masks = flag(exposed, detector, fraction, x, y, hidden)
        name = detector if detector == "extremes" else f"{detector}{fraction:g}"
        start = zeroed(exposed, masks)
        out[name] = steal(start, x, y, x_test, y_test, lrs, steps, seed, hidden=hidden)["best"]
    out["best"] = max(out.values())
    return out


@ATTACKS.register(
    "model-stealing-adaptive",
    "model stealing that detects flipped weights (extremes, magnitude, saliency), zeroes, fine-tunes",
)
class ModelStealingAdaptive(ModelStealing):
    needs = frozenset({Capability.MODEL_RELEASE})

    @dataclass
    class Params(ModelStealing.Params):  # the plain attack's budget (q, lrs, steps), and:
        rho: float = param(0.0, ge=0, lt=1)  # the release's flip fraction; 0 = the defense's
        fractions: list[float] = param(factory=lambda: [1.0, 2.5], gt=0)  # flagged, x rho

    params: Params

    def wrap(self, strategy: Strategy, writer: Writer, scorer: Scorer[Answer] | None) -> Strategy:
        params = self.params
        if not params.rho:  # the release's published flip fraction
            rhos = [m.rho for m in self.ctx.mechanisms if isinstance(m, WeightFlipping)]
            params = replace(params, rho=rhos[0] if rhos else DEFAULT_RHO)
        return AttackObserver(strategy, writer, Stealing(self.ctx, params, adaptive_metrics))


def adaptive_metrics(rel: Release, attacker: tuple[torch.Tensor, torch.Tensor],
                     test: tuple[torch.Tensor, torch.Tensor], seed: int, hidden: list[int],
                     params: ModelStealingAdaptive.Params, plain: dict[str, float]) -> dict[str, float]:  # fmt: skip
    """The adaptive attacker on the same release, data and budget as the plain one (which it may
    also just run: its surrogate is the best of the detectors and the plain attack)."""
    out: dict[str, float] = {}
    best = plain["surrogate_accuracy"]
    if rel.exposed is not None and not rel.keep_last_layer_secret:
        found = adaptive_steal(rel.exposed, *attacker, *test, params.rho,
                               tuple(params.fractions), tuple(params.lrs), params.steps, seed,
                               hidden)  # fmt: skip
        out = {f"adaptive.{k}": v for k, v in found.items() if k != "best"}
        best = max(best, found["best"])
    out["adaptive_surrogate_accuracy"] = best
    out["adaptive_security_gap"] = best - plain["blackbox_accuracy"]
    return out
