"""Client-side workloads: what a client does with its data in a round.

A workload is one class registered with ``@WORKLOADS.register(name, description)`` in its own module
under ``clients/workloads/``. The base class below is the contract every engine relies on.

Inputs, typed: a workload is built from its validated ``Params`` (``self.params``) and a
``WorkloadContext`` (``self.ctx``: the run's seed, rounds, client count, the shared data settings it
``reads``, its device and the configured defenses), never the whole experiment config, so it cannot
read another component's settings. ``build_workload(experiment)`` makes both from a resolved experiment.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from flowerbed.clients.contracts import check_offers
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.component import Component, P
from flowerbed.clients.core.config import DatasetConfig, Experiment
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.registry import Registry
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.model_loss import LocalTraining

if TYPE_CHECKING:
    from flowerbed.clients.defenses import Defense

T = TypeVar("T")

#: a workload offering a capability must have its Protocol's members (``clients/contracts.py``)
WORKLOADS: Registry[Workload] = Registry("workload", (__name__,), check=check_offers)

__all__ = ["WORKLOADS", "ClassifierWorkload", "Examples", "Workload", "WorkloadContext",
           "assigned_device", "build_workload", "fit_classifier", "round_subset",
           "score_classifier", "train_cross_entropy"]  # fmt: skip


def assigned_device(experiment: Experiment) -> str:
    """The torch device of a client's assigned resources: ``cuda`` when
    ``clients.resources.gpus`` > 0, else ``cpu``.

    Ray (a sweep cell with ``--gpus-per-cell``, a simulation ClientApp actor) makes the GPUs it
    assigned the only visible ones, so ``cuda`` is the assigned GPU.
    """
    gpus = float(experiment.clients.resources.gpus)
    if gpus <= 0:
        return "cpu"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        raise ConfigError(
            f"clients.resources.gpus={gpus:g} assigns a GPU, but torch sees no CUDA device in this "
            f"process (torch {torch.__version__}, CUDA_VISIBLE_DEVICES={visible}); use gpus=0"
        )
    return "cuda"


@dataclass(frozen=True)
class WorkloadContext:
    """What a workload knows of the run it serves, besides its own ``Params``.

    ``seed``: the experiment seed, from which every draw of data, model and training derives;
    ``rounds``: the number of rounds (some workloads report more at the last one);
    ``num_clients``: the federation's clients (N), for workloads that build every client's share;
    ``device``: the torch device of the assigned resources (``assigned_device``);
    ``defenses``: the configured defenses, built, in the order listed (training defenses such as
    DP-SGD act inside ``fit``; the runtime chains their client mods around it).

    The shared data settings a workload declares in ``reads`` (``clients.partitioner``,
    ``clients.alpha``, ``clients.partition_by``, ``dataset``): ``partitioner``, ``alpha``,
    ``partition_by`` and ``dataset`` (the dataset component's own section, read-only). A setting
    the workload does not read is ``None``: the config check refuses it when set, so a workload
    must not depend on its default either.
    """

    seed: int
    rounds: int
    num_clients: int
    device: str = "cpu"
    defenses: tuple[Defense, ...] = ()
    partitioner: str | None = None
    alpha: float | None = None
    partition_by: str | None = None
    dataset: DatasetConfig | None = None

    @classmethod
    def of(cls, experiment: Experiment) -> WorkloadContext:
        """The context of a resolved experiment, for its configured workload."""
        from flowerbed.clients.defenses import build_defenses

        reads = WORKLOADS.get(experiment.workload.name or "").reads
        clients = experiment.clients
        return cls(
            seed=experiment.seed,
            rounds=experiment.rounds,
            num_clients=clients.num,
            device=assigned_device(experiment),
            defenses=tuple(build_defenses(experiment)),
            partitioner=str(clients.partitioner) if "clients.partitioner" in reads else None,
            alpha=float(clients.alpha) if "clients.alpha" in reads else None,
            partition_by=clients.partition_by if "clients.partition_by" in reads else None,
            dataset=experiment.dataset if "dataset" in reads else None,
        )

    @property
    def dataset_json(self) -> str:
        """The dataset section as JSON with sorted keys: the key under which a workload caches
        what it derives from the table."""
        if self.dataset is None:
            raise ConfigError("this workload does not declare 'dataset' in its reads")
        return json.dumps(dataclasses.asdict(self.dataset), sort_keys=True)


def build_workload(experiment: Experiment) -> Workload:
    """The configured workload of a resolved experiment: its registered class, built from its
    typed ``Params`` and the run's ``WorkloadContext``."""
    cls = WORKLOADS.get(experiment.workload.name or "")
    return cls(experiment.workload.params, WorkloadContext.of(experiment))


@dataclass
class Examples:
    """Inputs and class labels of a classifier (model space)."""

    x: torch.Tensor
    y: torch.Tensor


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


class ShuffledBatches:
    """The batches of ``DataLoader(TensorDataset(x, y), batch_size, shuffle=True,
    generator=generator)``, bit for bit, drawn from ``generator`` as that loader draws (per
    pass: its base seed, the permutation, and its sampler's trailing empty slice of a second
    permutation), but each batch sliced from the tensors at once: the loader fetches every row
    by itself and stacks them (~40 % of a quickstart client's training time).
    """

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> None:
        self.x, self.y, self.batch_size, self.generator = x, y, batch_size, generator

    def __len__(self) -> int:
        return -(-len(self.y) // self.batch_size)

    def __iter__(self):  # noqa: ANN204
        n = len(self.y)
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)  # its base seed
        order = torch.randperm(n, generator=self.generator)
        for start in range(0, n, self.batch_size):
            batch = order[start : start + self.batch_size]
            yield self.x[batch], self.y[batch]
        torch.randperm(n, generator=self.generator)  # RandomSampler: randperm(n)[: n % n]


def fit_classifier(
    workload: Workload, model: nn.Module, data: Examples, training: LocalTraining, seed: int,
    state: RecordDict, proximal_mu: float = 0.0,
) -> dict[str, float]:  # fmt: skip
    """One round of a classifier's local training (``training``'s protocol), in place.

    Cross-entropy over shuffled minibatches with ``training``'s optimizer, through the workload's
    training defenses (Opacus DP-SGD); FedProx's proximal term when ``proximal_mu`` > 0. Returns
    the metrics (``num-examples``, ``loss``, ``update_norm`` = ``||w_local - w_global||``, the
    client's drift, which FedProx shrinks; ``epsilon`` under DP-SGD).
    """
    torch.manual_seed(seed)  # DP noise and Poisson sampling draw from the global generator
    fedsgd = training.protocol == "fedsgd"
    loader = DataLoader(
        TensorDataset(data.x, data.y), batch_size=len(data.y) if fedsgd else training.batch_size,
        shuffle=True, generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    global_params = [p.detach().clone() for p in model.parameters()]
    optimizer = training.optimizer_for(model.parameters())
    trained, optimizer, plain = workload.private_training(model, optimizer, loader, state)
    if plain is loader:  # no defense replaced it: the same batches, sliced at once
        plain = ShuffledBatches(data.x, data.y, loader.batch_size or len(data.y), loader.generator)
    loader = plain
    loss_fn = nn.CrossEntropyLoss()
    total_loss, steps = 0.0, 0
    trained.train()
    for _ in range(1 if fedsgd else training.local_epochs):
        for x, y in loader:
            if len(y) == 0:  # Poisson sampling (DP-SGD) may draw an empty batch
                continue
            x, y = x.to(workload.device), y.to(workload.device)
            optimizer.zero_grad()
            loss = loss_fn(trained(x), y)
            if proximal_mu > 0:
                prox = sum(
                    ((p - g) ** 2).sum()
                    for p, g in zip(model.parameters(), global_params, strict=True)
                )
                loss = loss + proximal_mu / 2 * prox
            loss.backward()
            optimizer.step()
            total_loss += float(loss.detach())
            steps += 1
    with torch.no_grad():
        drift = sum(
            float(((p - g) ** 2).sum())
            for p, g in zip(model.parameters(), global_params, strict=True)
        )
    metrics = {
        "num-examples": len(data.y),
        "loss": total_loss / max(steps, 1),
        "update_norm": drift**0.5,
    }
    workload.training_done(state, metrics)
    return metrics


def round_subset(
    train: Examples, training: LocalTraining, examples: int, seed: int, partition_id: int,
    server_round: int,
) -> Examples:  # fmt: skip
    """The examples a classifier client trains on in a round (``LocalTraining.round_examples``);
    a function of (seed, client, round), so the scorer rebuilds it and nothing else needs to."""
    gen_seed = client_seed(seed, partition_id, server_round, salt=11)
    idx = training.round_examples(len(train.y), examples, gen_seed)
    if len(idx) == len(train.y):
        return train
    return Examples(train.x[idx], train.y[idx])


def score_classifier(model: nn.Module, data: Examples) -> dict[str, float]:
    """Cross-entropy and accuracy of a classifier on ``data``."""
    model.eval()
    device = next(model.parameters()).device
    x, y = data.x.to(device), data.y.to(device)
    with torch.no_grad():
        logits = model(x)
        loss = float(nn.functional.cross_entropy(logits, y)) if len(y) else 0.0
        accuracy = float((logits.argmax(1) == y).float().mean()) if len(y) else 0.0
    return {"num-examples": len(data.y), "loss": loss, "accuracy": accuracy}


class Workload(Component[WorkloadContext, P]):
    """Contract between the engines and a client-side method.

    ``params`` is its typed ``workload.params``; ``ctx`` the ``WorkloadContext`` of the run;
    ``device`` (from ``ctx``) the torch device of the assigned resources: a workload computes there
    and returns CPU records. Methods receive and return Flower records so nothing is lost in
    transit.
    """

    Context = WorkloadContext
    built_by = "build_workload(experiment) builds a workload from an experiment"
    #: what this workload offers to attacks and defenses (``flowerbed list`` shows it)
    offers: ClassVar[frozenset[Capability]] = frozenset()
    #: shared config keys it honours (``dataset``, ``clients.partitioner``, ``clients.alpha``)
    reads: ClassVar[frozenset[str]] = frozenset()
    #: how it trains privately (``private-training``): ``opacus`` (``private_training``: Opacus on
    #: the model/optimizer/loader) or ``per-sample`` (the defense's ``privatize``); the DP audit
    #: runs the same path
    private_training_path: ClassVar[str] = "opacus"

    def __init__(self, params: P | Mapping[str, object] | None, ctx: WorkloadContext) -> None:
        """``params``: this workload's ``Params``, or its fields as a mapping (validated here);
        ``ctx``: the run (``build_workload(experiment)`` makes both from an experiment)."""
        super().__init__(params, ctx)
        self.device = ctx.device
        self.defenses = list(ctx.defenses)

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
        self, arrays: ArrayRecord, data: Any, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        """One round of local training. Metrics must include ``num-examples``."""
        raise NotImplementedError

    def evaluate(self, arrays: ArrayRecord, data: Any, config: RoundConfig) -> dict[str, float]:
        """Local evaluation. Metrics must include ``num-examples``."""
        raise NotImplementedError

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        """Optional centralised evaluation on held-out data (None to skip)."""
        return None

    # -- what attacks may know --------------------------------------------------------------
    @classmethod
    def withheld(cls, params: Any) -> dict[Capability, str]:
        """Offers this workload withholds under ``params`` (an instance of its ``Params``), each
        with the reason (default none)."""
        return {}

    def contract(self, kind: type[T]) -> T:
        """The method's shared config ``kind`` (a dataclass this workload's ``Params`` extends) as
        the method's other halves take it: only the fields ``kind`` declares, typed (the
        ``fed-kmeans`` strategy gets ``KMeansConfig`` of ``routing-kmeans``)."""
        if not (isinstance(self.params, kind) and dataclasses.is_dataclass(kind)):
            raise TypeError(f"workload '{self.registry_name}' params do not extend {kind.__name__}")
        return kind(**{f.name: getattr(self.params, f.name) for f in dataclasses.fields(kind)})

    # what a capability adds (``model_loss()`` for model-loss, ``release_setup()`` for
    # model-release, ...) is its Protocol in ``flowerbed.clients.contracts``, checked when the
    # class is registered


class ClassifierParams(Protocol):
    """The fields a ``ClassifierWorkload`` reads of its subclass's ``Params``."""

    test_fraction_local: float
    round_examples: int


class ClassifierWorkload(Workload):
    """A classifier over a pool of training examples: partitions (each split into local train
    and test), the examples of a round (``round_data``), local training with ``self.training``'s
    protocol through the defenses, local evaluation. Subclasses give the model and the pool."""

    params: ClassifierParams
    training: LocalTraining

    def _model(self) -> nn.Module:
        raise NotImplementedError

    def train_pool(self) -> Examples:
        """Every training example of the federation (partitioned by label)."""
        raise NotImplementedError

    def test_pool(self) -> Examples:
        """The server's held-out test examples (central evaluation; ``labelled-examples``)."""
        raise NotImplementedError

    def load_partition(self, partition_id: int, num_partitions: int) -> dict[str, Examples]:
        from flowerbed.clients.datasets.partition import partition_indices

        pool, ctx = self.train_pool(), self.ctx
        idx = partition_indices(
            pool.y.numpy(),
            partition_id,
            num_partitions,
            cast(str, ctx.partitioner),
            cast(float, ctx.alpha),
            ctx.seed,
        )
        idx = np.random.default_rng(client_seed(ctx.seed, partition_id, 0)).permutation(idx)
        n_test = int(round(len(idx) * self.params.test_fraction_local))
        test, train = idx[:n_test], idx[n_test:]
        return {
            "train": Examples(pool.x[train], pool.y[train]),
            "test": Examples(pool.x[test], pool.y[test]),
        }

    def root_update(self, arrays: ArrayRecord, size: int, server_round: int) -> ArrayRecord:
        """FLTrust's server model (``Capability.ROOT_DATA``): ``arrays`` after one round of the
        clients' own local training (``fit``) on ``size`` root examples.

        Threat model (Cao et al. 2021): the server holds a small clean sample of the task's
        training distribution. Here it is drawn once, seeded, from the federation's training pool
        (the paper samples it from the union of the clients' clean data), never from the test
        split the server evaluates on. It trains as partition ``num_clients``, an id no client has.
        """
        pool = self.train_pool()
        rng = np.random.default_rng(client_seed(self.ctx.seed, self.ctx.num_clients, 0, salt=53))
        idx = np.sort(rng.choice(len(pool.y), size=min(size, len(pool.y)), replace=False))
        root = {"train": Examples(pool.x[idx], pool.y[idx])}
        config: RoundConfig = {"partition-id": self.ctx.num_clients, "server-round": server_round}
        trained, _ = self.fit(arrays, root, config, RecordDict())
        return trained

    def round_data(self, data: dict[str, Examples], partition_id: int, server_round: int) -> Examples:  # fmt: skip
        """What a client trains on in a round (all it holds unless FedSGD / round_examples)."""
        return round_subset(data["train"], self.training, self.params.round_examples,
                            self.ctx.seed, partition_id, server_round)  # fmt: skip

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.ctx.seed)
        return ArrayRecord(self._model().state_dict())

    @staticmethod
    def _cpu_arrays(model: nn.Module) -> ArrayRecord:
        """The model's weights as CPU arrays (what travels, whatever the device)."""
        return ArrayRecord(OrderedDict((k, v.cpu()) for k, v in model.state_dict().items()))

    def fit(
        self, arrays: ArrayRecord, data: dict[str, Examples], config: RoundConfig,
        state: RecordDict,
    ) -> tuple[ArrayRecord, dict[str, float]]:  # fmt: skip
        model = self.loaded_model(arrays)
        pid, rnd = config["partition-id"], config["server-round"]
        train = self.round_data(data, pid, rnd)
        seed = client_seed(self.ctx.seed, pid, rnd)
        metrics = fit_classifier(self, model, train, self.training, seed, state,
                                 float(config.get("proximal-mu", 0.0)))  # fmt: skip
        return self._cpu_arrays(model), metrics

    def evaluate(self, arrays: ArrayRecord, data: dict[str, Examples], config: RoundConfig) -> dict[str, float]:  # fmt: skip
        return score_classifier(self.loaded_model(arrays), data["test"])

    def loaded_model(self, arrays: ArrayRecord) -> nn.Module:
        """The model with ``arrays`` loaded, on ``self.device``."""
        model = self._model()
        model.load_state_dict(arrays.to_torch_state_dict())
        return model.to(self.device)
