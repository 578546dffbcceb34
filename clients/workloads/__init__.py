"""Client-side workloads: what a client does with its data in a round.

A workload is one class registered with ``@WORKLOADS.register(name, description)`` in its own module
under ``clients/workloads/``. The base class below is the contract every engine relies on.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import torch
from flwr.app import ArrayRecord, RecordDict

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.registry import NoParams, Registry

WORKLOADS = Registry("workload", (__name__,))

__all__ = ["WORKLOADS", "Workload", "assigned_device", "train_cross_entropy"]


def assigned_device(cfg: dict[str, Any]) -> str:
    """The torch device of a client's assigned resources: ``cuda`` when
    ``clients.resources.gpus`` > 0, else ``cpu``.

    Ray (a sweep cell with ``--gpus-per-cell``, a simulation ClientApp actor) makes the GPUs it
    assigned the only visible ones, so ``cuda`` is the assigned GPU.
    """
    gpus = float(cfg.get("clients", {}).get("resources", {}).get("gpus", 0.0))
    if gpus <= 0:
        return "cpu"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        raise ConfigError(
            f"clients.resources.gpus={gpus:g} assigns a GPU, but torch sees no CUDA device in this "
            f"process (torch {torch.__version__}, CUDA_VISIBLE_DEVICES={visible}); use gpus=0"
        )
    return "cuda"


def train_cross_entropy(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float,
    batch_size: int, generator: torch.Generator,
) -> float:  # fmt: skip
    """Adam on cross-entropy over shuffled minibatches (trainable parameters only).

    Shared by the classifier workloads; returns the last batch loss.
    """
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    loss = torch.tensor(0.0)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), batch_size):
            batch = order[start : start + batch_size]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            opt.step()
    return float(loss.detach())


class Workload:
    """Contract between the engines and a client-side method.

    ``cfg`` is the resolved experiment config (a plain dict); ``params`` its typed
    ``workload.params``; ``device`` the torch device of the assigned resources
    (``assigned_device``): a workload computes there and returns CPU records. Methods receive and
    return Flower records so nothing is lost in transit.
    """

    Params: ClassVar[type] = NoParams
    registry_name: ClassVar[str]
    description: ClassVar[str]
    #: what this workload offers to attacks and defenses (``flowerbed list`` shows it)
    offers: ClassVar[frozenset[Capability]] = frozenset()
    #: shared config keys it honours (``dataset``, ``clients.partitioner``, ``clients.alpha``)
    reads: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, cfg: dict[str, Any]) -> None:
        from flowerbed.clients.defenses import build_defenses

        self.cfg = cfg
        self.params = self.Params(**cfg["workload"]["params"])
        self.device = assigned_device(cfg)
        self.defenses = build_defenses(cfg)

    # -- defenses that act inside training (DP-SGD) -------------------------------------------
    def private_training(self, model: Any, optimizer: Any, loader: Any, state: RecordDict) -> tuple:
        """Let training defenses wrap the model/optimizer/loader (Opacus DP-SGD)."""
        for defense in self.defenses:
            model, optimizer, loader = defense.make_private(model, optimizer, loader, state)
        return model, optimizer, loader

    def training_done(self, state: RecordDict, metrics: dict[str, float]) -> None:
        """Let training defenses account for what was done (adds ``epsilon`` to metrics)."""
        for defense in self.defenses:
            defense.after_training(state, metrics)

    # -- data -------------------------------------------------------------------------------
    def load_partition(self, partition_id: int, num_partitions: int) -> Any:
        """The client's local data, rebuilt from (seed, partition id); no I/O beyond the dataset."""
        raise NotImplementedError

    # -- model ------------------------------------------------------------------------------
    def init_arrays(self) -> ArrayRecord:
        """Initial global model, seeded from the experiment seed."""
        raise NotImplementedError

    def fit(
        self, arrays: ArrayRecord, data: Any, config: dict[str, Any], state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        """One round of local training. Metrics must include ``num-examples``."""
        raise NotImplementedError

    def evaluate(self, arrays: ArrayRecord, data: Any, config: dict[str, Any]) -> dict[str, float]:
        """Local evaluation. Metrics must include ``num-examples``."""
        raise NotImplementedError

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        """Optional centralised evaluation on held-out data (None to skip)."""
        return None
