"""The model-loss contract: what a workload exposes so that gradient inversion runs on its model.

A workload that offers ``Capability.MODEL_LOSS`` returns a :class:`ModelLoss` from
``Workload.model_loss()``. Everything in it is public knowledge of an honest-but-curious server:
the architecture (parameters come from the arrays the server sent), the loss on a batch, the
input/label schema (shape, classes, input box, one-hot groups), the agreed preprocessing (to decode
a reconstructed input into original units) and the local-training protocol. It holds no client
data: attacks built on it see only this object, the sent arrays and the reply.

The client trains with ``torch.optim`` (so Opacus DP-SGD still wraps it, ``LocalTraining.optimizer``);
the attacker replays the same protocol functionally and differentiably
(``flowerbed.attacks.inversion.simulate``); a test checks the two agree.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from flowerbed.clients.core.errors import ConfigError

PROTOCOLS = ("fedsgd", "fedavg")
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class LocalTraining:
    """A client's local training in one round (public: the server configured it).

    FedSGD: one plain gradient step on ``batch_size`` examples (the server reads the gradient as
    ``(sent - reply) / lr``). FedAvg: ``local_epochs`` epochs of minibatches of ``batch_size`` with
    SGD (``momentum``) or Adam (torch defaults); the server sees the model delta.
    """

    protocol: str = "fedavg"
    lr: float = 0.05
    batch_size: int = 64
    local_epochs: int = 1
    optimizer: str = "sgd"
    momentum: float = 0.0

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError(
                f"unknown protocol '{self.protocol}' (allowed: {', '.join(PROTOCOLS)})"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"unknown optimizer '{self.optimizer}' (allowed: {', '.join(OPTIMIZERS)})"
            )
        if self.lr <= 0 or self.batch_size < 1 or self.local_epochs < 1:
            raise ConfigError("lr must be > 0, batch_size >= 1 and local_epochs >= 1")

    @property
    def keeps_gradient_ratios(self) -> bool:
        """FedSGD or SGD steps: the update is (to first order) a positive multiple of the
        gradient, so per-neuron weight/bias ratios survive; Adam keeps little but the signs."""
        return self.protocol == "fedsgd" or self.optimizer == "sgd"

    def plan(self, n: int) -> list[slice]:
        """The minibatches of one round over ``n`` examples, each epoch in index order.

        The client shuffles within an epoch; the attacker's variables are exchangeable, so the
        fixed order is exact whenever no example is visited twice with different batch mates
        (FedSGD, one epoch, or full-batch local steps).
        """
        if self.protocol == "fedsgd":
            return [slice(0, n)]
        per_epoch = [slice(s, min(s + self.batch_size, n)) for s in range(0, n, self.batch_size)]
        return per_epoch * self.local_epochs

    def optimizer_for(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        """The client's optimizer (FedSGD: one plain SGD step)."""
        if self.protocol == "fedsgd":
            return torch.optim.SGD(params, lr=self.lr)
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)

    def round_examples(self, n_local: int, examples: int, seed: int) -> np.ndarray:
        """Positions (into a client's local training data) used in one round.

        FedSGD: ``batch_size`` examples drawn for the round; FedAvg: ``examples`` drawn (0 = all,
        in their stored order). Seeded per (experiment, client, round).
        """
        want = self.batch_size if self.protocol == "fedsgd" else examples
        if want <= 0 or want >= n_local:
            return np.arange(n_local)
        return np.sort(np.random.default_rng(seed).choice(n_local, want, replace=False))


@dataclass(frozen=True)
class InputSchema:
    """One example's input in model space, and its labels."""

    shape: tuple[int, ...]  # e.g. (1, 8, 8) for an image, (d,) for an encoded table row
    num_classes: int
    low: torch.Tensor  # (prod(shape),) lower bound per input coordinate
    high: torch.Tensor  # (prod(shape),) upper bound
    kind: str  # "image" | "table"
    #: (start, size) of each categorical one-hot group in the flattened input (tables)
    onehot_blocks: tuple[tuple[int, int], ...] = ()

    @property
    def dim(self) -> int:
        return math.prod(self.shape)


@dataclass
class ModelLoss:
    """A model whose loss the server can evaluate: the contract gradient inversion runs on."""

    module: nn.Module  # the architecture; parameters are supplied per call
    schema: InputSchema
    training: LocalTraining
    #: model-space inputs (B, *shape) -> original units (a DataFrame of rows, or an image array)
    decode: Callable[[torch.Tensor], Any]
    #: names of the (weight, bias) of a fully connected first layer reading the flattened input
    first_linear: tuple[str, str] | None = None
    #: name of the output layer's bias (its gradient is mean(softmax - onehot): label recovery)
    last_bias: str | None = None
    #: public prior draws in model space (tables: per-feature marginals); None = uniform in the box
    prior: Callable[[int, torch.Generator], torch.Tensor] | None = None
    #: the best guess of an input from public knowledge alone, model space (images: the public
    #: mean image); None = a prior draw (``draw``). What leakage is measured above.
    guess: Callable[[int, torch.Generator], torch.Tensor] | None = None
    #: public class frequencies (labels guessed from public knowledge); None = uniform
    class_prior: torch.Tensor | None = None

    def loss(self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Mean cross-entropy of a batch; ``y`` holds class indices or class probabilities."""
        return F.cross_entropy(functional_call(self.module, params, (x,)), y)

    def logits(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.module, params, (x,))

    def rebuild(self, arrays: dict[str, torch.Tensor]) -> nn.Module:
        """The torch model with the given arrays loaded."""
        model = copy.deepcopy(self.module)
        model.load_state_dict({k: v.to(next(iter(self.module.parameters())).dtype) for k, v in arrays.items()})  # fmt: skip
        return model

    def draw(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Inputs drawn from the public prior (uniform in the box without one), model space."""
        if self.prior is not None:
            return self.prior(n, generator).reshape(n, *self.schema.shape)
        s = self.schema
        u = torch.rand(n, s.dim, generator=generator, dtype=s.low.dtype)
        return (s.low + u * (s.high - s.low)).reshape(n, *s.shape)


def prior_guess_inputs(contract: ModelLoss, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` inputs guessed from public knowledge alone: ``contract.guess`` or prior draws."""
    if contract.guess is not None:
        return contract.guess(n, generator).reshape(n, *contract.schema.shape)
    return contract.draw(n, generator)


def prior_guess_labels(contract: ModelLoss, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` labels drawn from the public class frequencies (uniform without them)."""
    k = contract.schema.num_classes
    probs = contract.class_prior if contract.class_prior is not None else torch.ones(k)
    return torch.multinomial(probs.double() / probs.double().sum(), n, replacement=True,
                             generator=generator)  # fmt: skip


def class_frequencies(labels: np.ndarray, classes: int) -> torch.Tensor:
    """Public class frequencies of a label vector."""
    return torch.from_numpy(np.bincount(labels, minlength=classes) / max(len(labels), 1))


def mean_image(images: torch.Tensor) -> Callable[[int, torch.Generator], torch.Tensor]:
    """The public mean image, repeated (the MSE-optimal constant guess of an image)."""
    mean = images.double().mean(0).float()

    def guess(n: int, generator: torch.Generator) -> torch.Tensor:
        return mean.expand(n, *mean.shape).clone()

    return guess


def marginal_prior(
    columns: np.ndarray, blocks: tuple[tuple[int, int], ...], quantiles: int = 201
) -> Callable[[int, torch.Generator], torch.Tensor]:
    """A per-feature prior from public statistics of an encoded table: numeric columns by
    interpolated quantiles, each one-hot group by its category frequencies."""
    in_block = np.zeros(columns.shape[1], bool)
    for start, size in blocks:
        in_block[start : start + size] = True
    numeric = np.flatnonzero(~in_block)
    qs = np.quantile(columns[:, numeric], np.linspace(0, 1, quantiles), axis=0)  # (Q, n_num)
    freqs = [columns[:, s : s + k].mean(0) for s, k in blocks]
    dim = columns.shape[1]

    def draw(n: int, generator: torch.Generator) -> torch.Tensor:
        out = torch.zeros(n, dim, dtype=torch.float32)
        u = torch.rand(n, len(numeric), generator=generator).numpy() * (quantiles - 1)
        lo = np.floor(u).astype(int).clip(0, quantiles - 2)
        frac = u - lo
        cols = np.arange(len(numeric))
        vals = qs[lo, cols] * (1 - frac) + qs[lo + 1, cols] * frac
        out[:, numeric] = torch.from_numpy(vals.astype(np.float32))
        for (start, _), f in zip(blocks, freqs, strict=True):
            probs = torch.from_numpy(np.asarray(f, np.float64) / max(float(np.sum(f)), 1e-12))
            pick = torch.multinomial(probs, n, replacement=True, generator=generator)
            out[torch.arange(n), start + pick] = 1.0
        return out

    return draw
