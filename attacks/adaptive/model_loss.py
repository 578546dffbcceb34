"""Defense-aware gradient inversion of any model-loss workload (the classifiers: tabular MLP, digits).

Any model-loss attack (``analytic-fc``, ``inverting-gradients``, ``tableak``, ...) gets the
defense-aware path from the configured defenses' public mechanisms (``Defense.mechanism()``), never
from their names: the attacker changes how it *reads* an update, the attack itself is unchanged.

- ``Sparsification`` (top-k): a candidate's update is compared through ``topk_view`` (kept
  coordinates as they are, a dropped one only beyond the smallest kept magnitude); a first-layer
  column top-k dropped entirely is still read as an absent category (a present category's
  column holds some of the largest entries, so all-zero is what absence most likely gives);
  the analytic attack runs on the low-rank completion of the first layer
  (``complete_low_rank``: rank <= the batch size);
- ``Quantisation``: compared within one grid step per coordinate (``grid_view``); an absent
  category's zero column rounds to the two grid levels around zero, so a column reads absent when
  every entry is within one step of zero (the unaware attacker looks for exact zeros and finds
  none);
- ``GaussianNoise`` on the update (DP-SGD, local DP): a column reads absent when every entry is
  within ``NOISE_SDS`` noise standard deviations of zero (the noise scale in update units from
  the mechanism and the public protocol); the classifier clients draw fresh rows every round, so
  there is nothing to average over rounds;
- ``Aggregation`` (secure aggregation): an aggregate of N clients is inverted as the mean of N
  clients' updates of ``B`` rows each (``Knowledge.members``), scored against the union of their
  rows (``ClassifierScorer`` with a group of members).

Without a mechanism to adapt to, the defense-aware attacker is the unaware one (same inversion,
run once). The observer's ``DefenseAware`` hooks run both on the same replies (``attack.*`` / ``attack.unaware_*``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from flwr.serverapp.strategy import Strategy

from flowerbed.attacks.adaptive.inversion import (
    DefenseAware,
    complete_low_rank,
    compose,
    grid_view,
    topk_view,
)
from flowerbed.attacks.adaptive.selection import (
    carries_evidence,
    changes_update,
    noise_sd_per_lr,
    rounding_nll,
)
from flowerbed.attacks.baseline_common import ON_MODEL_LOSS
from flowerbed.attacks.common import InversionAttack, ObservedParams
from flowerbed.attacks.inversion.analytic import invert_analytic
from flowerbed.attacks.inversion.attack import ModelLossAttack
from flowerbed.attacks.inversion.optimisation import invert_optimised
from flowerbed.attacks.inversion.scoring import ClassifierScorer
from flowerbed.attacks.inversion.simulate import observed
from flowerbed.attacks.inversion.types import (
    InversionSettings,
    Knowledge,
    ModelLossReplay,
    Reading,
    Reconstruction,
)
from flowerbed.attacks.observer import AttackObserver
from flowerbed.attacks.protocols import Answer, Scorer, Writer
from flowerbed.clients.core.params import param
from flowerbed.clients.defenses import GaussianNoise, Mechanism, Quantisation, Sparsification
from flowerbed.clients.model_loss import ModelLoss

NOISE_SDS = 3.0  # a column reads absent when every entry is within this many noise sds of 0


def grid_step(update: torch.Tensor, bits: int) -> float:
    """One step of a quantised tensor's grid (its range over ``2**bits - 1``): an absent
    category's zero entries round to one of the two levels around zero, at most a step away."""
    return (float(update.max()) - float(update.min())) / (2**bits - 1) * (1 + 1e-6)


def update_noise_std(mechanism: GaussianNoise, contract: ModelLoss, batch: int) -> float | None:
    """Per-entry sd of a mechanism's noise in the attacker's update units (``(sent - reply) /
    lr``; ``selection.noise_sd_per_lr``); None where it is not known in those units (FedAvg's many
    steps of DP-SGD noise are, approximately: sqrt(steps) x one step's)."""
    training = contract.training
    steps = len(training.plan(max(batch, 1)))
    return noise_sd_per_lr(mechanism, training.lr, batch, training.batch_size, steps)


class RememberingAttack(ModelLossAttack):
    """The unaware model-loss attack, remembering its last (reply, reconstruction)."""

    def __init__(self, replay: ModelLossReplay, settings: InversionSettings, name: str = "") -> None:  # fmt: skip
        super().__init__(replay, settings, name)
        self.last: tuple[dict, Reconstruction] | None = None

    def invert(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], num_examples: int) -> Reconstruction:  # fmt: skip
        rec = super().invert(sent, reply, num_examples)
        self.last = (reply, replace(rec))
        return rec


class DefenseAwareModelLoss(ModelLossAttack):
    """A model-loss attack that reads each update through the defenses' public mechanisms."""

    def __init__(self, replay: ModelLossReplay, settings: InversionSettings, name: str,
                 mechanisms: Iterable[Mechanism], plain: RememberingAttack | None = None) -> None:  # fmt: skip
        super().__init__(replay, settings, name)
        self.mechanisms = list(mechanisms)
        #: the unaware attack run on the same replies (its result is reused where nothing adapts)
        self.plain = plain
        self.latest: dict[tuple[int, ...], tuple[dict, dict, int]] = {}
        self.members = 1

    @property
    def adapts(self) -> bool:
        """Whether any published mechanism changes how the update is read."""
        return changes_update(self.mechanisms)

    # -- the selection's interface (``attacks.adaptive.selection``) ------------------------------
    @property
    def identity(self) -> bool:
        """No published mechanism changes a client's update: the unaware attack is the answer."""
        return not self.adapts

    def evidence(self, members: tuple[int, ...]) -> bool | None:
        """The noise test (``selection.carries_evidence``) on the latest update of ``members``;
        None without published on-update noise of a known scale. An aggregate of N clients'
        means carries 1/N of one client's noise variance."""
        sent, reply, examples = self.latest[members]
        n = max(len(members), 1)
        total, noisy = 0.0, False
        for m in self.mechanisms:
            if isinstance(m, GaussianNoise) and m.on_update:
                std = update_noise_std(m, self.contract, examples // n)
                if std is None:
                    return None
                total, noisy = total + std**2, True
        if not noisy:
            return None
        update = Knowledge.observe(self.replay, sent, reply, examples).update
        return carries_evidence(update, total / n)

    def objective(self, members: tuple[int, ...], rec: Reconstruction) -> float:
        """The defense-aware objective of ``rec`` on the latest update of ``members``: under
        stochastic quantisation the rounding likelihood of the observed grid values given
        ``rec``'s simulated update (``selection.rounding_nll``), else the attack's update
        distance through the published view (top-k: kept coordinates; ``match``)."""
        sent, reply, examples = self.latest[members]
        self.members = len(members)
        bits = [m.bits for m in self.mechanisms if isinstance(m, Quantisation)]
        if not bits:
            return self.match(sent, reply, rec)
        plain = replace(self.knowledge(sent, reply, examples), reading=None)
        with torch.enable_grad():
            sim = observed(plain, rec.inputs.to(plain.dtype), rec.labels, create_graph=False)
        return rounding_nll(sim, plain.update, min(bits))

    def knowledge(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], num_examples: int) -> Knowledge[ModelLossReplay]:  # fmt: skip
        base = super().knowledge(sent, reply, num_examples)
        readings: list[Reading] = []
        absent_at: float | None = 0.0
        first = self.contract.first_linear[0] if self.contract.first_linear else None
        for mechanism in self.mechanisms:
            if isinstance(mechanism, Sparsification):
                readings.append(topk_view(base.update))
            elif isinstance(mechanism, Quantisation):
                readings.append(grid_view(base.update, mechanism.bits))
                if first in base.update and absent_at is not None:
                    absent_at = max(absent_at, grid_step(base.update[first], mechanism.bits))
            elif isinstance(mechanism, GaussianNoise) and mechanism.on_update:
                std = update_noise_std(mechanism, self.contract, num_examples // self.members)
                absent_at = None if std is None or absent_at is None else max(absent_at, NOISE_SDS * std)  # fmt: skip
        return replace(base, reading=compose(readings), absent_at=absent_at, members=self.members)

    def invert(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], num_examples: int) -> Reconstruction:  # fmt: skip
        know = self.knowledge(sent, reply, num_examples)
        if self.settings.method == "analytic":
            if any(isinstance(m, Sparsification) for m in self.mechanisms):
                know = replace(know, update=completed_first_layer(know))
            return invert_analytic(know, self.settings.seed)
        if self.settings.method == "optimised":
            return invert_optimised(know, self.settings, self.name)
        return super().invert(sent, reply, num_examples)

    # -- the observer's interface (``attacks.adaptive.inversion.DefenseAware``) ------------------
    def observe(self, members: tuple[int, ...], server_round: int, sent: dict[str, torch.Tensor],
                reply: dict[str, torch.Tensor], examples: int) -> None:  # fmt: skip
        self.latest[members] = (sent, reply, examples)

    def invert_latest(self, members: tuple[int, ...], start: Reconstruction | None = None) -> Reconstruction:  # fmt: skip
        """The aware inversion of the latest reply of ``members``. ``start`` (the unaware answer,
        the observer's warm start for Goliath) is not read: these attacks start from the
        analytic first-layer rows of the update itself."""
        sent, reply, examples = self.latest[members]
        self.members = len(members)
        if not self.adapts and self.plain is not None and self.plain.last is not None:
            seen, rec = self.plain.last
            if seen is reply:  # nothing to adapt to: the unaware inversion of this very reply
                return replace(rec)
        return self.invert(sent, reply, examples)


def completed_first_layer(know: Knowledge[ModelLossReplay]) -> dict[str, torch.Tensor]:
    """The update with its first layer's dropped entries filled by low-rank completion (rank at
    most the batch size: ``[dW | db] = sum_i delta_i [x_i, 1]^T``)."""
    update = know.update
    w, b = know.replay.contract.first_linear or ("", "")
    if w not in update or b not in update:
        return update
    layer = w.removesuffix(".weight")
    part = {f"{layer}.weight": update[w].double(), f"{layer}.bias": update[b].double()}
    rank = min(know.batch, *update[w].shape)
    done = complete_low_rank(part, rank)
    out = dict(update)
    out[w] = done[f"{layer}.weight"].to(update[w].dtype)
    out[b] = done[f"{layer}.bias"].to(update[b].dtype)
    return out


# -- the registered entries: one per model-loss attack, each in its own ``<base>_adaptive`` module --
DESCRIPTION = (
    "defense-aware {base} on a model-loss workload (reads the update through the defenses' "
    "public mechanisms)"
)


@dataclass
class ModelLossAdaptiveParams(ObservedParams):
    restarts: int = param(0, ge=0)  # 0 = the attack's own default
    iterations: int = param(0, ge=0)  # 0 = the attack's own default (optimisation attacks)
    compare_unaware: bool = True  # also run the unaware attack on the same replies


class ModelLossAdaptive(InversionAttack):
    """The defense-aware variant of the model-loss attack ``base`` (module docstring): its
    ``settings`` read through the context's published mechanisms, the unaware attack beside it."""

    reads_aggregates = True  # secure-aggregation groups are attacked as their union

    Params = ModelLossAdaptiveParams
    params: ModelLossAdaptiveParams
    needs = ON_MODEL_LOSS
    scorer = ClassifierScorer
    base: ClassVar[str]  # the unaware attack's registered name

    def engine(self) -> DefenseAwareModelLoss:
        """The aware attack with its unaware companion (``plain``: reused where nothing adapts)."""
        settings = self.budgeted()  # a budget of 0: the attack's own
        replay = self.ctx.replay_as(ModelLossReplay)
        plain = RememberingAttack(replay, settings, self.base)
        return DefenseAwareModelLoss(replay, settings, self.registry_name,
                                     self.ctx.mechanisms, plain)  # fmt: skip

    def wrap(self, strategy: Strategy, writer: Writer, scorer: Scorer[Answer] | None) -> Strategy:
        p, adaptive = self.params, self.engine()
        unaware = adaptive.plain if p.compare_unaware else None
        hooks = DefenseAware(adaptive, unaware, seed=self.ctx.seed)
        return AttackObserver(strategy, writer, hooks, scorer, p.target_clients, p.rounds)
