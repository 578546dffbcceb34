"""Defense-aware gradient inversion of federated tabular diffusion, on Goliath's engine.

The attacker knows each configured defense's public mechanism (what the defense publishes as typed
data, ``Defense.mechanism()``, handed over by the observer; never its randomness) and adapts what
it matches to the mechanism, whichever defense publishes it; everything else is Goliath
(``attacks.goliath``):

- ``Sparsification`` (top-k): only the kept coordinates carry the update. Each linear layer's gradient has rank at
  most B, so its dropped entries are filled from the kept ones (low-rank completion) and Goliath's
  closed forms run on the completed update; their rows are accepted if they explain the *kept*
  coordinates. Otherwise the optimisation matches a simulated update on the kept coordinates, and
  on a dropped one only where it exceeds the smallest kept magnitude (top-k dropped it, so its
  true value was below that threshold);
- ``Quantisation``: the observed update lies on each tensor's grid of ``2^bits`` levels between its min
  and max, and stochastic rounding moves a value by less than one level: a simulated update is
  matched up to one grid step per coordinate (inside that window any value could have produced the
  observation);
- ``GaussianNoise`` on the update the server receives (DP-SGD, local DP; not central DP, whose
  noise is on the aggregate): the same client's noisy updates of the same rows are averaged over the
  rounds it was observed (up to ``average_rounds``), which shrinks the noise by the square root of
  their number, and the average is inverted as R steps on the same rows (one latent draw each);
- ``Aggregation`` (secure aggregation): the aggregate of N clients is the FedSGD gradient of their N x B rows; it is
  inverted as one batch of N x B rows (the union of the group's rows is what can leak).

The observer hands this attack the group members of a secure-aggregation reply (public to the
server); ground truth stays in the scorer (``attacks.adaptive.scoring``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch
from flwr.app import ArrayRecord, Message, MetricRecord

from flowerbed.attacks.goliath.attack import TabularInversion
from flowerbed.attacks.goliath.closed_forms import analytic_mixed, analytic_time
from flowerbed.attacks.goliath.knowledge import (
    GOLIATH,
    InversionConfig,
    Knowledge,
    Reconstruction,
    decode,
    observed_target,
)
from flowerbed.attacks.goliath.objective import match_loss, simulate
from flowerbed.attacks.goliath.optimisation import invert, rows_score
from flowerbed.attacks.observer import AttackObserver, as_tensors
from flowerbed.attacks.prior import PriorKeeping, keep_prior
from flowerbed.clients.defenses import (
    GaussianNoise,
    Mechanism,
    Quantisation,
    Sparsification,
    published_mechanisms,
)
from flowerbed.clients.defenses.secagg import MEMBERS_RECORD
from flowerbed.clients.tabdiff.model import Latents, Rows
from flowerbed.clients.tabdiff.training import Protocol

View = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
AVERAGE_LR = 1e-3
#: the denoiser's layers whose outputs are summed (input projection + time embedding): one delta
SUMMED_LAYERS = (
    ("proj", "time_embed.2"),
)  # step size of the simulated "R steps on the same rows" of an averaged update


# -- what a defense does to an update, as the attacker models it -------------------------------------
def topk_view(observed: dict[str, torch.Tensor]) -> View:
    """Kept coordinates (nonzero) match as they are; a dropped one only beyond the kept minimum."""
    support = {k: v != 0 for k, v in observed.items()}
    kept = torch.cat([v[support[k]].abs().flatten() for k, v in observed.items()])
    threshold = float(kept.min()) if kept.numel() else 0.0

    def view(sim: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            k: torch.where(support[k], s, s - s.clamp(-threshold, threshold)) if k in support else s
            for k, s in sim.items()
        }

    return view


def grid_view(observed: dict[str, torch.Tensor], bits: int) -> View:
    """Each coordinate matches within one quantisation step of the observed value."""
    levels = 2**bits - 1
    steps = {k: (float(v.max()) - float(v.min())) / levels for k, v in observed.items()}

    def view(sim: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for k, s in sim.items():
            step = steps.get(k, 0.0)
            out[k] = s if step == 0 else s + (observed[k] - s).clamp(-step, step)
        return out

    return view


def complete_low_rank(
    target: dict[str, torch.Tensor],
    rank: int,
    together: tuple[tuple[str, ...], ...] = (),
    iterations: int = 50,
    ridge: float = 1e-9,
) -> dict[str, torch.Tensor]:
    """Fill a sparsified update's dropped entries from the kept ones, layer by layer.

    A linear layer's batch gradient ``[dW | db] = sum_i delta_i [a_i, 1]^T`` has rank at most the
    number of rows B, so its kept (nonzero) entries determine the rest when they are enough:
    alternating least squares of a rank-``rank`` factorisation on the kept entries only, started
    from the SVD of the zero-filled matrix. Layers whose outputs are summed share their ``delta_i``
    and are completed side by side (``together``: groups of layer names). Kept entries are
    returned as observed; tensors that are not ``<layer>.weight`` + ``<layer>.bias`` stay.
    """
    layers = [n.removesuffix(".weight") for n, w in target.items()
              if n.endswith(".weight") and w.dim() == 2 and f"{n[:-7]}.bias" in target]  # fmt: skip
    grouped = [tuple(g) for g in together if all(layer in layers for layer in g)]
    singles = [(layer,) for layer in layers if not any(layer in g for g in grouped)]
    out = dict(target)
    for group in grouped + singles:
        blocks = [
            torch.cat([target[f"{n}.weight"], target[f"{n}.bias"][:, None]], 1) for n in group
        ]
        g = torch.cat(blocks, 1).double()
        seen = g != 0
        if bool(seen.all()) or not bool(seen.any()):
            continue
        full = torch.where(seen, g, _als(g, seen, min(rank, *g.shape), iterations, ridge))
        start = 0
        for name, block in zip(group, blocks, strict=True):
            part = full[:, start : start + block.shape[1]].to(block.dtype)
            out[f"{name}.weight"], out[f"{name}.bias"] = (
                part[:, :-1].contiguous(),
                part[:, -1].contiguous(),
            )
            start += block.shape[1]
    return out


def _als(g: torch.Tensor, seen: torch.Tensor, rank: int, iterations: int, ridge: float) -> torch.Tensor:  # fmt: skip
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    left, right = u[:, :rank] * s[:rank].sqrt(), vh[:rank].T * s[:rank].sqrt()
    eye = torch.eye(rank, dtype=g.dtype) * ridge * float(s[0] if len(s) else 1.0)
    for _ in range(iterations):
        left = _solve_rows(g, seen, right, eye)
        right = _solve_rows(g.T, seen.T, left, eye)
    return left @ right.T


def _solve_rows(g: torch.Tensor, seen: torch.Tensor, basis: torch.Tensor, eye: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Per row i: least squares of g[i, seen[i]] on basis[seen[i]] (ridge-regularised)."""
    w = seen.to(g.dtype)
    gram = torch.einsum("ij,jr,js->irs", w, basis, basis) + eye  # (rows, r, r)
    rhs = (g * w) @ basis  # (rows, r)
    return torch.linalg.solve(gram, rhs[..., None])[..., 0]


def compose(views: list[View]) -> View | None:
    if not views:
        return None

    def view(sim: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for v in views:
            sim = v(sim)
        return sim

    return view


@dataclass
class Observation:
    """One observed update: the round, the arrays the server sent, the matching target, B."""

    server_round: int
    sent: dict[str, torch.Tensor]
    target: dict[str, torch.Tensor]
    examples: int


class DefenseAwareInversion(TabularInversion):
    """Goliath that adapts to the configured defenses' public mechanisms (module docstring)."""

    def __init__(
        self, cfg: dict[str, Any], icfg: InversionConfig, average_rounds: int = 4,
        mechanisms: list[Mechanism] | None = None,
    ) -> None:  # fmt: skip
        """``mechanisms``: the defenses' public mechanisms, in config order (what the server
        knows; by default ``published_mechanisms(cfg)``)."""
        super().__init__(cfg, icfg)
        self.mechanisms = published_mechanisms(cfg) if mechanisms is None else list(mechanisms)
        self.average_rounds = average_rounds
        self.history: dict[tuple[int, ...], list[Observation]] = {}

    @property
    def averages_noise(self) -> bool:
        noisy = any(isinstance(m, GaussianNoise) and m.on_update for m in self.mechanisms)
        return self.average_rounds > 1 and noisy

    def view_for(self, target: dict[str, torch.Tensor]) -> View | None:
        views: list[View] = []
        for mechanism in self.mechanisms:
            if isinstance(mechanism, Sparsification):
                views.append(topk_view(target))
            elif isinstance(mechanism, Quantisation):
                views.append(grid_view(target, mechanism.bits))
        return compose(views)

    def observe(
        self, members: tuple[int, ...], server_round: int, sent: dict[str, torch.Tensor],
        reply: dict[str, torch.Tensor], examples: int,
    ) -> None:  # fmt: skip
        """Record an observed update of ``members`` (one client, or a secure-aggregation group)."""
        target = observed_target(self.knowledge(sent), sent, reply)
        seen = self.history.setdefault(members, [])
        seen.append(Observation(server_round, sent, target, examples))
        del seen[: -max(self.average_rounds, 1)]

    def match(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], rec: Reconstruction) -> float:  # fmt: skip
        """The defense-aware objective for ``rec``'s rows: matched through the defenses' view."""
        know = self.knowledge(sent)
        target = observed_target(know, sent, reply)
        aware = replace(know, view=self.view_for(target))
        return rows_score(aware, target, rec.num, rec.cat, self.icfg, self.icfg.seed)

    def invert_latest(self, members: tuple[int, ...]) -> Reconstruction:
        """Invert the latest observation of ``members`` (averaged with earlier ones under DP noise)."""
        seen = self.history[members]
        latest = seen[-1]
        know = self.knowledge(latest.sent)
        same = [o for o in seen if o.examples == latest.examples]
        if self.averages_noise and len(same) > 1 and know.protocol.kind == "fedsgd":
            return self._invert_average(know, same)
        aware = replace(know, view=self.view_for(latest.target))
        rec = invert(aware, latest.target, latest.examples, self.icfg)
        if self.sparsified and know.protocol.kind == "fedsgd":
            found = self._closed_form_on_completion(know, aware, latest)
            if (
                found is not None and found.score < rec.score
            ):  # explains the kept coordinates better
                return found
        return rec

    @property
    def sparsified(self) -> bool:
        return any(isinstance(m, Sparsification) for m in self.mechanisms)

    def _closed_form_on_completion(
        self, know: Knowledge, aware: Knowledge, seen: Observation
    ) -> Reconstruction | None:
        """Goliath's closed forms on the low-rank completion of a top-k update, scored by how well
        their rows explain the *kept* coordinates (the top-k view of their update)."""
        start = time.perf_counter()
        completed = complete_low_rank(seen.target, seen.examples, SUMMED_LAYERS)
        best: Reconstruction | None = None
        for method in (analytic_time, analytic_mixed):
            try:
                candidate = method(know, completed, seen.examples)
            except (RuntimeError, ValueError):  # ill-posed where the completion is poor
                continue
            if candidate is None:
                continue
            rows, t, mask, eps = candidate
            rows = Rows(rows.num.float(), rows.cat.float())
            sim = simulate(aware, rows, [Latents(t.float(), eps.float(), mask)], False)
            score = float(match_loss(sim, seen.target, know.spec, GOLIATH))
            if math.isfinite(score) and (best is None or score < best.score):
                t_np, mask_np = t.float().numpy(), None if mask is None else mask.numpy()
                best = Reconstruction(rows.num, rows.cat, t_np, mask_np, score)
        if best is not None:
            best.frame = decode(know, best.num, best.cat)
            best.seconds = time.perf_counter() - start
        return best

    def _invert_average(self, know: Knowledge, seen: list[Observation]) -> Reconstruction:
        """R noisy FedSGD gradients of the same rows: their sum is R steps of local SGD on them."""
        batch = seen[-1].examples
        steps = Protocol("fedavg", batch, AVERAGE_LR, len(seen), "sgd")
        target = {k: AVERAGE_LR * sum(o.target[k] for o in seen) for k in seen[-1].target}
        return invert(replace(know, protocol=steps), target, batch, self.icfg)


def members_of(reply: Message) -> tuple[int, ...]:
    """Who contributed to a reply: its secure-aggregation group, else its own partition id."""
    if MEMBERS_RECORD in reply.content.config_records:
        return tuple(int(p) for p in reply.content[MEMBERS_RECORD]["members"])
    return (int(reply.content["metrics"]["partition-id"]),)


class DefenseAwareObserver(AttackObserver):
    """Runs the defense-aware attack and, beside it, the unaware one on the same replies.

    Every round it records the targets' updates (the averaging attacker needs earlier rounds); in
    the attacked rounds it scores the adaptive reconstruction under ``attack.*`` and the unaware
    Goliath's under ``attack.unaware_*`` (only for individual updates: under secure aggregation the
    unaware attacker has nothing to invert). A secure-aggregation reply is attacked when its group
    holds a target client, and scored against the union of the group's rows.
    """

    def __init__(
        self, inner: Any, writer: Any, attack: DefenseAwareInversion, scorer: Any,
        targets: list[int], rounds: list[int] | None, unaware: TabularInversion | None,
    ) -> None:  # fmt: skip
        super().__init__(inner, writer, attack, scorer, targets, aggregate=False, rounds=rounds)
        self.adaptive = attack
        seed = int(scorer.cfg["seed"]) if hasattr(scorer, "cfg") else 0
        self.unaware = None if unaware is None else keep_prior(unaware, seed)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        sent = as_tensors(self._sent)
        attacked = not self.rounds or server_round in self.rounds
        shown: list[tuple[Any, dict, Any]] = []
        for reply in replies:
            if reply.has_error():
                continue
            members = members_of(reply)
            if not self.targets.intersection(members):
                continue
            observed = as_tensors(reply.content["arrays"])
            examples = int(reply.content["metrics"]["num-examples"])
            self.adaptive.observe(members, server_round, sent, observed, examples)
            if not attacked:
                continue
            key: Any = members[0] if len(members) == 1 else members
            record: dict[str, float] = {}
            if self.unaware is not None and len(members) == 1:
                rec = self.unaware.invert(sent, observed, examples)
                record |= self._score(server_round, key, sent, rec, "unaware_")
            rec = self.adaptive.invert_latest(members)
            if isinstance(self.attack, PriorKeeping):
                rec = self.attack.keep(sent, observed, examples, rec)
            record = self._score(server_round, key, sent, rec, "") | record
            shown.append((key, sent, rec))
            self._record(server_round, key, record)
        self._illustrate(server_round, shown)
        return self.inner.aggregate_train(server_round, replies)
