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

The observer (with the ``DefenseAware`` hooks below) hands this attack the group members of a secure-aggregation reply (public to the
server) and answers with the candidate ``attacks.adaptive.selection`` picks (the unaware
reconstruction, the prior guess or this attack's); ground truth stays in the scorer
(``attacks.goliath.scoring``: a group's reply against the union of its members' rows).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import replace

import torch

from flowerbed.attacks.adaptive.selection import (
    carries_evidence,
    changes_update,
    choice_metrics,
    choose,
    noise_sd_per_lr,
)
from flowerbed.attacks.goliath.attack import TabularInversion
from flowerbed.attacks.goliath.closed_forms import analytic_mixed, analytic_time
from flowerbed.attacks.goliath.knowledge import GOLIATH, local_steps
from flowerbed.attacks.goliath.objective import match_loss, simulate
from flowerbed.attacks.goliath.optimisation import invert, rows_score
from flowerbed.attacks.inversion.simulate import tensor_sum
from flowerbed.attacks.inversion.types import (
    DiffusionReplay,
    InversionSettings,
    Knowledge,
    Reading,
    Reconstruction,
)
from flowerbed.attacks.observer import AttackObserver, Hooks
from flowerbed.attacks.prior import KEEPER_SALT, keep_prior
from flowerbed.attacks.protocols import AdaptiveEngine, Inverter, Key, Tensors
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.defenses import GaussianNoise, Mechanism, Quantisation, Sparsification
from flowerbed.clients.tabdiff.model import Latents, Rows
from flowerbed.clients.tabdiff.training import Protocol

AVERAGE_LR = 1e-3
#: the denoiser's layers whose outputs are summed (input projection + time embedding): one delta
SUMMED_LAYERS = (
    ("proj", "time_embed.2"),
)  # step size of the simulated "R steps on the same rows" of an averaged update


# -- what a defense does to an update, as the attacker models it -------------------------------------
def topk_view(observed: dict[str, torch.Tensor]) -> Reading:
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


def grid_view(observed: dict[str, torch.Tensor], bits: int) -> Reading:
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


def compose(views: list[Reading]) -> Reading | None:
    if not views:
        return None

    def view(sim: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for v in views:
            sim = v(sim)
        return sim

    return view


class DefenseAwareInversion(TabularInversion):
    """Goliath that adapts to the configured defenses' public mechanisms (module docstring)."""

    def __init__(self, replay: DiffusionReplay, settings: InversionSettings,
                 mechanisms: Iterable[Mechanism], average_rounds: int = 4) -> None:  # fmt: skip
        """``mechanisms``: the defenses' public mechanisms, in config order (what the server
        knows: ``AttackContext.mechanisms``)."""
        super().__init__(replay, settings)
        self.mechanisms = list(mechanisms)
        self.average_rounds = average_rounds
        #: the latest observed updates of each target (one client, or a secure-aggregation group)
        self.history: dict[tuple[int, ...], list[Knowledge[DiffusionReplay]]] = {}

    @property
    def averages_noise(self) -> bool:
        noisy = any(isinstance(m, GaussianNoise) and m.on_update for m in self.mechanisms)
        return self.average_rounds > 1 and noisy

    def view_for(self, target: dict[str, torch.Tensor]) -> Reading | None:
        views: list[Reading] = []
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
        seen = self.history.setdefault(members, [])
        seen.append(self.knowledge(sent, reply, examples))
        del seen[: -max(self.average_rounds, 1)]

    def _averaged(self, members: tuple[int, ...]) -> list[Knowledge[DiffusionReplay]]:
        """The observations the attack inverts together: the latest alone, or (DP noise, FedSGD)
        every recorded one of the same batch size, averaged."""
        seen = self.history[members]
        latest = seen[-1]
        same = [o for o in seen if o.batch == latest.batch]
        fedsgd = self.replay.protocol.kind == "fedsgd"
        return same if self.averages_noise and len(same) > 1 and fedsgd else [latest]

    # -- the selection's interface (``attacks.adaptive.selection``) ------------------------------
    @property
    def identity(self) -> bool:
        """No published mechanism changes a client's update: the unaware attack is the answer."""
        return not changes_update(self.mechanisms)

    def noise_variance(self, members: tuple[int, ...], examples: int) -> float | None:
        """Per-entry variance of the published on-update noise in the matching target's units
        (FedSGD: gradient = delta / lr; FedAvg: the delta), for an aggregate of ``members``;
        None without such noise or where its scale is not known in those units."""
        protocol = self.replay.protocol
        batch = max(examples // max(len(members), 1), 1)
        steps = local_steps(protocol, batch)
        total, noisy = 0.0, False
        for m in self.mechanisms:
            if not (isinstance(m, GaussianNoise) and m.on_update):
                continue
            if (
                m.where == "per-example"
                and protocol.kind != "fedsgd"
                and protocol.optimizer != "sgd"
            ):
                return None  # Adam's steps reshape the noise: no known scale
            sd = noise_sd_per_lr(m, protocol.lr, batch, protocol.batch_size, steps)
            if sd is None:
                return None
            scale = 1.0 if protocol.kind == "fedsgd" else protocol.lr
            total, noisy = total + (sd * scale) ** 2, True
        return total / max(len(members), 1) if noisy else None

    def evidence(self, members: tuple[int, ...]) -> bool | None:
        """The noise test (``selection.carries_evidence``) on what the attack inverts: the latest
        target, or the mean of the averaged ones (its noise variance over their number)."""
        seen = self._averaged(members)
        variance = self.noise_variance(members, seen[-1].batch)
        if variance is None:
            return None
        mean = {k: tensor_sum(o.update[k] for o in seen) / len(seen) for k in seen[-1].update}
        return carries_evidence(mean, variance / len(seen))

    def objective(self, members: tuple[int, ...], rec: Reconstruction) -> float:
        """The defense-aware objective of ``rec``'s rows on the latest update of ``members``: the
        engine's match through the defenses' view with the latents refitted (``rows_score``)
        from the seed's draw (the same for every candidate); under a published sparsification,
        where ``rec`` has fitted latents, also from those, the lower kept. On the few kept
        coordinates a short refit from a draw cannot rank candidates (measured on top-k 10 %:
        the prior chosen on 46 % of replies, the answer 0.019 above the prior against the
        unaware 0.045). Elsewhere the own start is not used: on a quantisation grid it favours
        the rows fitted to the rounding itself (4 bits: the aware candidate chosen 58 % instead
        of 21 %, the answer's advantage -0.028 against -0.011)."""
        aware = self.aware(self.history[members][-1])
        seed = self.settings.seed
        score = rows_score(aware, rec.num, rec.cat, self.settings, seed)
        if not self.sparsified or getattr(rec, "t", None) is None:
            return score
        return min(score, rows_score(aware, rec.num, rec.cat, self.settings, seed, rec))

    def aware(self, know: Knowledge[DiffusionReplay]) -> Knowledge[DiffusionReplay]:
        """``know`` read through the defenses' published mechanisms (``view_for``)."""
        return replace(know, reading=self.view_for(know.update))

    def invert_latest(
        self, members: tuple[int, ...], start: Reconstruction | None = None
    ) -> Reconstruction:
        """Invert the latest observation of ``members`` (averaged with earlier ones under DP noise).
        ``start``: the unaware reconstruction of the same reply, one more restart's start (the
        aware objective then descends from it: the aware answer is not worse by its own objective
        than what the unaware attack found, up to that descent)."""
        same = self._averaged(members)
        latest = same[-1]
        if len(same) > 1:
            return self._invert_average(same)
        aware = self.aware(latest)
        rec = invert(aware, self.settings, start=start)
        if self.sparsified and self.replay.protocol.kind == "fedsgd":
            found = self._closed_form_on_completion(latest, aware)
            if (
                found is not None and found.score < rec.score
            ):  # explains the kept coordinates better
                return found
        return rec

    @property
    def sparsified(self) -> bool:
        return any(isinstance(m, Sparsification) for m in self.mechanisms)

    def _closed_form_on_completion(
        self, seen: Knowledge[DiffusionReplay], aware: Knowledge[DiffusionReplay]
    ) -> Reconstruction | None:
        """Goliath's closed forms on the low-rank completion of a top-k update, scored by how well
        their rows explain the *kept* coordinates (the top-k view of their update)."""
        start = time.perf_counter()
        completed = replace(seen, update=complete_low_rank(seen.update, seen.batch, SUMMED_LAYERS))
        best: Reconstruction | None = None
        for method in (analytic_time, analytic_mixed):
            try:
                candidate = method(completed)
            except (RuntimeError, ValueError):  # ill-posed where the completion is poor
                continue
            if candidate is None:
                continue
            rows, t, mask, eps = candidate
            rows = Rows(rows.num.float(), rows.cat.float())
            sim = simulate(aware, rows, [Latents(t.float(), eps.float(), mask)], False)
            score = float(match_loss(sim, seen.update, self.replay.spec, GOLIATH))
            if math.isfinite(score) and (best is None or score < best.score):
                t_np, mask_np = t.float().numpy(), None if mask is None else mask.numpy()
                best = Reconstruction(rows, score, t=t_np, mask=mask_np, eps=eps.float().numpy())
        if best is not None:
            best.decoded = self.replay.decode(best.num, best.cat)
            best.seconds = time.perf_counter() - start
        return best

    def _invert_average(self, seen: list[Knowledge[DiffusionReplay]]) -> Reconstruction:
        """R noisy FedSGD gradients of the same rows: their sum is R steps of local SGD on them."""
        latest = seen[-1]
        steps = Protocol("fedavg", latest.batch, AVERAGE_LR, len(seen), "sgd")
        target = {k: AVERAGE_LR * tensor_sum(o.update[k] for o in seen) for k in latest.update}
        return invert(Knowledge(replace(self.replay, protocol=steps), latest.params, target,
                                latest.batch), self.settings)  # fmt: skip


class DefenseAware(Hooks):
    """The observer's hooks for a defense-aware attack, the unaware one beside it on the same
    replies.

    Every round it records the targets' updates (``observe``: the averaging attacker needs earlier
    rounds); in the attacked rounds it scores the unaware attack's reconstruction under
    ``attack.unaware_*`` (only for individual updates: under secure aggregation the unaware
    attacker has nothing to invert) and the defense-aware attacker's answer under ``attack.*``:
    the one of (prior guess, unaware, aware) that ``selection.choose`` picks, without ground
    truth, with the choice in ``attack.chosen_*``. A secure-aggregation reply is attacked when its
    group holds a target client, and scored against the union of the group's rows.
    """

    every_round = True

    def __init__(self, adaptive: AdaptiveEngine[Reconstruction],
                 unaware: Inverter[Reconstruction] | None, seed: int = 0) -> None:  # fmt: skip
        """``seed``: the run's (the prior guesses are seeded from it, per reply)."""
        self.adaptive = adaptive
        self.seed = seed
        self.unaware = None if unaware is None else keep_prior(unaware, seed)

    def observe(self, members: tuple[int, ...], server_round: int, sent: Tensors,
                received: Tensors, examples: int) -> None:  # fmt: skip
        self.adaptive.observe(members, server_round, sent, received, examples)

    def answer(self, observer: AttackObserver, server_round: int, key: Key,
               members: tuple[int, ...], sent: Tensors, received: Tensors,
               examples: int) -> tuple[Reconstruction, dict[str, float]]:  # fmt: skip
        record: dict[str, float] = {}
        candidates: dict[str, Reconstruction] = {}
        if self.unaware is not None and len(members) == 1:
            candidates["unaware"] = self.unaware.invert(sent, received, examples)
            record |= observer.score(server_round, key, sent, candidates["unaware"], "unaware_")
        rec = self.select(members, server_round, sent, received, examples, candidates)
        return rec, observer.score(server_round, key, sent, rec, "") | record

    def select(
        self, members: tuple[int, ...], server_round: int, sent: Tensors, observed: Tensors,
        examples: int, candidates: dict[str, Reconstruction],
    ) -> Reconstruction:  # fmt: skip
        """The defense-aware attacker's answer (``selection.choose``), its choice attached as
        ``rec.choice`` (the metrics the observer records beside its scores)."""
        identity = self.adaptive.identity
        evidence = None if identity else self.adaptive.evidence(members)
        if not identity:  # the prior guess: public knowledge, seeded per reply
            seed = client_seed(self.seed, members[0], server_round, salt=KEEPER_SALT)
            candidates["prior"] = self.adaptive.prior_guess(sent, observed, examples, seed)
        # the aware inversion, unless the unaware one is the answer (nothing to adapt to) or the
        # update holds no evidence above the noise (the prior is)
        if not (identity and "unaware" in candidates) and evidence is not False:
            candidates["aware"] = self.adaptive.invert_latest(members, candidates.get("unaware"))
        choice = choose(candidates, lambda r: self.adaptive.objective(members, r), identity,
                        evidence)  # fmt: skip
        rec: Reconstruction = choice.rec
        rec.choice = choice_metrics(choice, evidence)
        return rec
