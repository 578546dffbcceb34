"""FILOsofer's federated victim: an MLP on scikit-learn's digits trained by FedAvg.

Claim, numbers and limits: docs/methods/filosofer.md.

FILOsofer (OpenReview ``RujSwsLLlq``) deploys a trained network on an untrusted GPU with all
weights exposed after flipping the few that matter most (top-``rho`` by diagonal empirical Fisher),
and recovers the authorised user's accuracy through low-rank adapters held in a TEE; a
model-stealing attacker who fine-tunes the exposed weights on a fraction ``q`` of the data should do
no better than training from scratch. This module is the *victim's* side: the data, the centrally
trained victim of the analysis and the federated workload. The release mechanism is the
``filosofer`` defense (clients/defenses/filosofer.py), the attacker and the analysis table are in
attacks/model_stealing.py, the shared MLP and Fisher helpers in clients/training.py.

Federated (``filosofer``): clients train the victim MLP on shards of scikit-learn's digits with
FedAvg and return, next to the trained weights, the diagonal Fisher of the model they *received*
(``fisher.*`` arrays); FedAvg's example-weighted mean of them is the pooled-data Fisher of that
global model. The ``model-stealing`` attack releases the final global model under the configured
defense and runs the stealing attack.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from sklearn.datasets import load_digits
from torch import nn

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.params import param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.nn import make_mlp
from flowerbed.clients.training import accuracy, fisher_diagonal
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext, train_cross_entropy

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


# ---------------------------------------------------------------------------------------------
# 2. the centrally trained victim (the analysis' stand-in for the FedAvg model)
# ---------------------------------------------------------------------------------------------


def train_victim(split: Split, seed: int, epochs: int = 40, lr: float = 1e-3) -> nn.Sequential:
    """The centrally trained victim (the analysis' stand-in for the FedAvg model)."""
    torch.manual_seed(seed)
    model = make_mlp()
    train_cross_entropy(
        model, split.x_train, split.y_train, epochs, lr, 64, torch.Generator().manual_seed(seed)
    )
    return model


# ---------------------------------------------------------------------------------------------
# 3. registration: FedAvg of the victim MLP, clients' Fisher diagonals pooled by sample count
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


@dataclass(frozen=True)
class ReleaseSetup:
    """What a model-release attack knows of the victim: its hidden widths (the architecture is
    ``make_mlp``) and the data split (the owner's training pool, the attacker's share, the test
    set)."""

    hidden: list[int]
    split: Split


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

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        self.split = digits_split(self.ctx.seed, self.params.train_size)

    def _model(self) -> nn.Sequential:
        return make_mlp(hidden=list(self.params.hidden))

    def release_setup(self) -> ReleaseSetup:
        """The ``model-release`` contract: the victim's widths and the digits split."""
        return ReleaseSetup(list(self.params.hidden), self.split)

    def load_partition(self, partition_id: int, num_partitions: int) -> Shard:
        return Shard(
            self.split.x_train[partition_id::num_partitions],
            self.split.y_train[partition_id::num_partitions],
        )

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.ctx.seed)
        model = self._model()
        return pack(model, {k: torch.zeros_like(v) for k, v in model.state_dict().items()})

    def fit(
        self, arrays: ArrayRecord, data: Shard, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        torch.set_num_threads(1)
        model = self._model()
        model.load_state_dict(unpack(arrays)[0])
        fisher = fisher_diagonal(model, data.x, data.y)  # of the received global model
        seed = client_seed(self.ctx.seed, config["partition-id"], config["server-round"])
        loss = train_cross_entropy(model, data.x, data.y, self.params.local_epochs, self.params.lr,
                     self.params.batch_size, torch.Generator().manual_seed(seed))  # fmt: skip
        return pack(model, fisher), {"num-examples": len(data.y), "loss": loss}

    def evaluate(self, arrays: ArrayRecord, data: Shard, config: RoundConfig):
        model = self._model()
        model.load_state_dict(unpack(arrays)[0])
        return {"num-examples": len(data.y), "accuracy": accuracy(model, data.x, data.y)}

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        model = self._model()
        model.load_state_dict(unpack(arrays)[0])
        return {"accuracy": accuracy(model, self.split.x_test, self.split.y_test)}
