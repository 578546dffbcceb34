"""Image classifier on scikit-learn's bundled digits (1,797 8x8 greyscale images, 10 classes).

A small MLP or CNN, trained federated with FedSGD or FedAvg (SGD or Adam local steps). It is the
image workload of the gradient-inversion benchmark: it offers the model-loss contract (the model,
cross-entropy, the image schema [0, 1]^(1x8x8), the agreed pixel scaling and the local protocol),
so DLG, iDLG, Inverting Gradients and (for the MLP) the analytic first-layer attack run on it.

Data: pixels / 16 (the agreed preprocessing), a fixed stratified 80/20 train/test split (seed 0),
train images partitioned over clients (iid or Dirichlet); no downloads.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.params import choices, param
from flowerbed.clients.model_loss import (
    OPTIMIZERS,
    PROTOCOLS,
    InputSchema,
    LocalTraining,
    ModelLoss,
    class_frequencies,
    mean_image,
)
from flowerbed.clients.workloads import (
    WORKLOADS,
    ClassifierWorkload,
    Examples,
    WorkloadContext,
    score_classifier,
)

SHAPE = (1, 8, 8)
PIXEL_MAX = 16.0  # digits intensities are integers 0..16
MODELS = ("mlp", "cnn")


# -- data ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def digits_split() -> tuple[Examples, Examples]:
    """Train and test images in model space ([0, 1], shape (N, 1, 8, 8)), fixed split."""
    digits = load_digits()
    x = (digits.data / PIXEL_MAX).astype(np.float32).reshape(-1, *SHAPE)
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    as_examples = lambda a, b: Examples(torch.from_numpy(a), torch.from_numpy(b))  # noqa: E731
    return as_examples(x_tr, y_tr), as_examples(x_te, y_te)


def decode_images(x: torch.Tensor) -> np.ndarray:
    """Model space to original units: (B, 8, 8) intensities in [0, 16]."""
    return (x.detach().reshape(len(x), 8, 8).clamp(0, 1) * PIXEL_MAX).double().numpy()


# -- models -------------------------------------------------------------------------------------
def make_model(kind: str, hidden: list[int], channels: list[int]) -> nn.Sequential:
    """``mlp``: flatten -> [Linear, ReLU] x len(hidden) -> Linear(10); the first layer reads the
    pixels directly. ``cnn``: [Conv3x3, ReLU] x len(channels) (stride 2 after the first) ->
    flatten -> Linear(10)."""
    layers: list[nn.Module] = []
    if kind == "mlp":
        layers.append(nn.Flatten())
        width = int(np.prod(SHAPE))
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 10))
        return nn.Sequential(*layers)
    c_in, side = SHAPE[0], SHAPE[1]
    for i, c in enumerate(channels):
        stride = 2 if i > 0 else 1
        layers += [nn.Conv2d(c_in, c, 3, stride=stride, padding=1), nn.ReLU()]
        c_in, side = c, (side + 2 - 3) // stride + 1
    layers += [nn.Flatten(), nn.Linear(c_in * side * side, 10)]
    return nn.Sequential(*layers)


ModelKind = choices("ModelKind", ("mlp", "cnn"))
Protocol = choices("Protocol", PROTOCOLS)
Optimizer = choices("Optimizer", OPTIMIZERS)


# -- workload -----------------------------------------------------------------------------------
@WORKLOADS.register("digits-classifier", "Image classifier (MLP or CNN) on sklearn digits 8x8")
class DigitsClassifier(ClassifierWorkload):
    offers = frozenset(
        {Capability.PRIVATE_TRAINING, Capability.MODEL_LOSS, Capability.LINEAR_FIRST_LAYER,
         Capability.ROOT_DATA, Capability.LABELLED_EXAMPLES}
    )  # fmt: skip
    reads = frozenset({"clients.partitioner", "clients.alpha"})

    @dataclass
    class Params:
        model: ModelKind = ModelKind("mlp")  # mlp | cnn
        hidden: list[int] = param(factory=lambda: [128], ge=1)  # MLP widths
        channels: list[int] = param(factory=lambda: [8, 16], ge=1)  # CNN channels
        protocol: Protocol = Protocol("fedavg")  # fedavg | fedsgd (one step on batch_size images)
        lr: float = param(0.1, gt=0)
        momentum: float = param(0.9, ge=0, lt=1)
        optimizer: Optimizer = Optimizer("sgd")  # sgd | adam (FedAvg local steps)
        batch_size: int = param(32, ge=1)
        local_epochs: int = param(2, ge=1)
        #: FedAvg: images a client trains on per round (0 = all it holds)
        round_examples: int = param(0, ge=0)
        test_fraction_local: float = param(0.2, ge=0, lt=1)

    params: Params

    @classmethod
    def withheld(cls, params: Params) -> dict[Capability, str]:
        out = {}
        if params.model == "cnn":
            out[Capability.LINEAR_FIRST_LAYER] = "model=cnn starts with a convolution"
        elif params.protocol == "fedavg" and params.optimizer == "adam":
            out[Capability.LINEAR_FIRST_LAYER] = "Adam local steps keep only gradient signs"
        return out

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        p = self.params
        if p.model not in MODELS:
            raise ConfigError(f"unknown workload.params.model '{p.model}' (allowed: mlp, cnn)")
        self.training = LocalTraining(p.protocol, p.lr, p.batch_size, p.local_epochs, p.optimizer,
                                      p.momentum)  # fmt: skip

    def _model(self) -> nn.Sequential:
        return make_model(self.params.model, list(self.params.hidden), list(self.params.channels))

    def train_pool(self) -> Examples:
        return digits_split()[0]

    def test_pool(self) -> Examples:
        return digits_split()[1]

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        scores = score_classifier(self.loaded_model(arrays), digits_split()[1])
        scores.pop("num-examples")
        return scores

    # -- public knowledge (model-loss contract) --------------------------------------------------
    def model_loss(self) -> ModelLoss:
        """The network, cross-entropy, images in [0, 1]^(1x8x8), pixel scaling, the protocol; the
        public guess is the mean image and the class frequencies of the held-out split (the
        server's own evaluation data, no client's)."""
        dim = int(np.prod(SHAPE))
        schema = InputSchema(SHAPE, 10, torch.zeros(dim), torch.ones(dim), "image")
        n_layers = len(self._model())
        first = ("1.weight", "1.bias") if self.params.model == "mlp" else None
        public = digits_split()[1]
        return ModelLoss(self._model(), schema, self.training, decode_images, first,
                         f"{n_layers - 1}.bias", guess=mean_image(public.x),
                         class_prior=class_frequencies(public.y.numpy(), 10))  # fmt: skip
