"""Federated tabular diffusion (TabDDPM-Gaussian or TabDiff-style mixed regime).

Clients train a shared denoiser on their rows with FedSGD or FedAvg; the ``tabdiff`` strategy
aggregates; the final global model samples synthetic rows whose quality is reported centrally
(KS / TVD marginals, correlation difference, ML efficacy vs real data). The math (schedules,
denoiser, the one pure loss, protocols, sampler) lives in ``clients.tabdiff`` because the Goliath
attacker uses the very same functions.
"""

from __future__ import annotations

import functools
import json
import time
import typing
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import numpy as np
import pandas as pd
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.config import DatasetConfig
from flowerbed.clients.core.params import choices, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.datasets import Table, dataset_key, table_from_key
from flowerbed.clients.datasets.partition import partition_indices
from flowerbed.clients.tabdiff.model import (
    REGIMES,
    Denoiser,
    DiffusionSpec,
    Latents,
    Rows,
    build_model,
    loss_terms,
    onehot_rows,
    sample_latents,
)
from flowerbed.clients.tabdiff.preprocess import TablePreprocessor
from flowerbed.clients.tabdiff.pretrain import Pretraining, pretrained_params, public_table_key
from flowerbed.clients.tabdiff.quality import quality_report
from flowerbed.clients.tabdiff.sampler import DivergedModel, sample_rows
from flowerbed.clients.tabdiff.training import (
    OPTIMIZERS,
    PROTOCOLS,
    Protocol,
    batch_plan,
    local_update,
    per_sample_gradients,
)
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext

ROWS_KEY = "tabdiff-rows"  # per-round row ids a client used: kept in its state, never sent


@typing.runtime_checkable
class PerSampleDp(typing.Protocol):
    """A defense on the per-sample path (``DpSgd``): noises per-row gradients and accounts."""

    def privatize(
        self, per_sample: dict[str, torch.Tensor], generator: torch.Generator,
        sample_rate: float | None = None,
    ) -> dict[str, torch.Tensor]: ...  # fmt: skip

    def account(self, state: RecordDict, sample_rate: float, steps: int) -> float: ...


# -- data ---------------------------------------------------------------------------------------
@dataclass
class Encoded:
    table: Table
    prep: TablePreprocessor
    num: np.ndarray  # train numerics, normal space, float32
    codes: np.ndarray  # train categorical codes (label last)
    test_num: np.ndarray
    test_codes: np.ndarray


def encoded(dataset_json: str) -> Encoded:
    """The dataset in model space; the preprocessor is fitted once per schema on the train split.

    Cached per dataset config (JSON) and the bytes of the file it reads.
    """
    return _encoded_table(dataset_key(DatasetConfig(**json.loads(dataset_json))))


@functools.lru_cache(maxsize=4)
def _encoded_table(key: str) -> Encoded:
    table = table_from_key(key)
    prep = TablePreprocessor.fit(table.schema, table.train)
    num, codes = prep.encode(table.train)
    test_num, test_codes = prep.encode(table.test)
    return Encoded(
        table, prep, num.astype(np.float32), codes, test_num.astype(np.float32), test_codes
    )


def client_row_ids(ctx: WorkloadContext, partition_id: int, num_partitions: int) -> np.ndarray:
    """Train-row positions a client holds (a function of the run's dataset, partitioner, alpha and
    seed, and the partition id only)."""
    data = encoded(ctx.dataset_json)
    labels = data.table.train[data.table.schema.label].astype(str).to_numpy()
    return partition_indices(
        labels,
        partition_id,
        num_partitions,
        cast(str, ctx.partitioner),
        cast(float, ctx.alpha),
        ctx.seed,
    )


def round_plan(
    seed: int, spec: DiffusionSpec, protocol: Protocol, params: dict[str, torch.Tensor],
    partition_id: int, server_round: int, n_rows: int,
) -> tuple[list[np.ndarray], list[Latents]]:  # fmt: skip
    """The local positions of each step's batch and its latents, from (experiment seed, client,
    round)."""
    gen = torch.Generator().manual_seed(client_seed(seed, partition_id, server_round))
    plan = batch_plan(n_rows, protocol, gen)
    if protocol.kind == "fedsgd":
        plan = plan[:1]
    latents = [sample_latents(spec, params, len(idx), gen) for idx in plan]
    return plan, latents


# -- model --------------------------------------------------------------------------------------
def to_params(arrays: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in arrays.to_torch_state_dict().items()}


def to_arrays(model: Denoiser, params: dict[str, torch.Tensor]) -> ArrayRecord:
    names = [n for n, _ in model.named_parameters()]
    return ArrayRecord(OrderedDict((n, params[n].detach().cpu().clone()) for n in names))


class ClientRows(TypedDict):
    """A client's partition: its row ids in the encoded table, their numeric columns and their
    categorical codes."""

    ids: np.ndarray
    num: torch.Tensor
    codes: torch.Tensor


def to_device(device: str, *items: Any) -> list[Any]:
    """Parameter dicts, Rows and Latents moved to ``device`` (no-ops on ``cpu``)."""
    moved: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            moved.append({k: v.to(device) for k, v in item.items()})
        elif isinstance(item, Rows):
            moved.append(Rows(item.num.to(device), item.cat.to(device)))
        elif isinstance(item, Latents):
            mask = item.mask.to(device) if item.mask is not None else None
            moved.append(Latents(item.t.to(device), item.eps.to(device), mask))
        else:
            raise TypeError(f"cannot move {type(item).__name__} to a device")
    return moved


# -- workload -----------------------------------------------------------------------------------
Regime = choices("Regime", REGIMES)
ProtocolKind = choices("ProtocolKind", PROTOCOLS)
Optimizer = choices("Optimizer", OPTIMIZERS)


@WORKLOADS.register(
    "tabdiff", "Tabular diffusion (Gaussian DDPM or TabDiff mixed) with synthetic-data quality"
)
class TabDiff(Workload):
    # DP-SGD via per-row clipped, noised gradients
    offers = frozenset({Capability.PRIVATE_TRAINING, Capability.TABULAR_DIFFUSION})
    private_training_path = "per-sample"  # DP-SGD via the defense's ``privatize``
    reads = frozenset({"dataset", "clients.partitioner", "clients.alpha"})
    # the tabular-diffusion contract (``TabularDiffusionOffer``), set in ``__init__``; ``prep``
    spec: DiffusionSpec
    protocol: Protocol
    model: Denoiser

    @dataclass
    class Params:
        regime: Regime = Regime("mixed")
        hidden: int = param(256, ge=1)
        layers: int = param(3, ge=1)
        learnable_k: bool = False
        c_lambda: float = param(1.0, ge=0)
        d_lambda: float = param(1.0, ge=0)
        protocol: ProtocolKind = ProtocolKind("fedavg")
        batch_size: int = param(256, ge=1)
        lr: float = param(2e-3, gt=0)
        optimizer: Optimizer = Optimizer("adam")
        local_epochs: int = param(1, ge=1)
        max_steps: int = param(0, ge=0)
        eval_rows: int = param(1024, ge=1)
        quality_rows: int = param(0, ge=0)
        sample_steps: int = param(50, ge=1)
        #: warm start: the server pretrains the initial model on this many public train rows
        #: outside the clients' ``dataset.max_rows`` (0 = from scratch; clients.tabdiff.pretrain)
        pretrain_rows: int = param(0, ge=0)
        pretrain_epochs: int = param(20, ge=1)
        pretrain_batch_size: int = param(256, ge=1)
        pretrain_lr: float = param(2e-3, gt=0)

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        p = self.params
        self._key = self.ctx.dataset_json
        data = encoded(self._key)
        self.spec = DiffusionSpec(
            n_num=data.num.shape[1], cat_sizes=data.prep.cat_sizes, regime=p.regime,
            hidden=p.hidden, layers=p.layers, learnable_k=p.learnable_k,
            c_lambda=p.c_lambda, d_lambda=p.d_lambda,
        )  # fmt: skip
        self.protocol = Protocol(
            p.protocol, p.batch_size, p.lr, p.local_epochs, p.optimizer, p.max_steps
        )
        self.model = build_model(self.spec, self.ctx.seed)
        self.pretraining = Pretraining(
            p.pretrain_rows, p.pretrain_epochs, p.pretrain_batch_size, p.pretrain_lr
        )
        if p.pretrain_rows:  # refuse a config with no public split before anything starts
            public_table_key(self._key)

    @property
    def prep(self) -> TablePreprocessor:
        """The agreed preprocessing (public feature statistics of the schema)."""
        return encoded(self._key).prep

    @property
    def table(self) -> Table:
        return encoded(self._key).table

    def load_partition(self, partition_id: int, num_partitions: int) -> ClientRows:
        ids = client_row_ids(self.ctx, partition_id, num_partitions)
        data = encoded(self._key)
        return {
            "ids": ids,
            "num": torch.from_numpy(data.num[ids]),
            "codes": torch.from_numpy(data.codes[ids]),
        }

    def init_arrays(self) -> ArrayRecord:
        """The seed's initial denoiser, pretrained on the public split when warm-started."""
        model = build_model(self.spec, self.ctx.seed)
        if not self.pretraining.rows:
            return to_arrays(model, dict(model.named_parameters()))
        params = pretrained_params(self._key, self.prep, self.spec, self.pretraining, self.ctx.seed)
        return to_arrays(model, params)

    # -- local step -----------------------------------------------------------------------------
    def fit(
        self, arrays: ArrayRecord, data: ClientRows, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        torch.set_num_threads(1)
        params = to_params(arrays)
        pid, rnd = int(config["partition-id"]), int(config["server-round"])
        plan, latents = round_plan(
            self.ctx.seed, self.spec, self.protocol, params, pid, rnd, len(data["ids"])
        )
        batches = [onehot_rows(data["num"][i], data["codes"][i], self.spec.cat_sizes) for i in plan]
        # plan and latents are drawn on the CPU (the same bits on any device), then moved
        dev = self.device
        params, *batches = to_device(dev, params, *batches)
        latents = to_device(dev, *latents)
        losses: list[float] = []
        start = time.perf_counter()
        dp = next((d for d in self.defenses if isinstance(d, PerSampleDp)), None)
        gradient = None
        rate = min(1.0, self.protocol.batch_size / max(len(data["ids"]), 1))
        if dp is not None:  # DP-SGD: clipped per-row gradients + Gaussian noise, seeded per round
            noise = torch.Generator().manual_seed(client_seed(self.ctx.seed, pid, rnd, salt=3))

            def gradient(model, state, rows, lat):  # noqa: ANN001, ANN202
                per_row = per_sample_gradients(model, state, rows, lat)
                noised = dp.privatize({k: g.cpu() for k, g in per_row.items()}, noise, rate)
                return {k: g.to(dev) for k, g in noised.items()}

        new = local_update(
            self.model, params, batches, latents, self.protocol, on_loss=losses.append,
            gradient=gradient,
        )  # fmt: skip
        elapsed = time.perf_counter() - start
        used = sorted({int(data["ids"][j]) for idx in plan for j in idx})
        if ROWS_KEY not in state.config_records:
            state.config_records[ROWS_KEY] = ConfigRecord()
        state.config_records[ROWS_KEY][f"round-{rnd}"] = used
        rows_seen = sum(len(i) for i in plan)
        privacy = {}
        if dp is not None:
            privacy = {"epsilon": dp.account(state, rate, len(batches))}
        metrics = {
            "num-examples": len(used),
            "loss": float(np.mean(losses)),
            "rows_per_s": rows_seen / max(elapsed, 1e-9),
            **privacy,
        }
        return to_arrays(self.model, new), metrics

    # -- metrics --------------------------------------------------------------------------------
    def _heldout_loss(
        self, params: dict[str, torch.Tensor], num: np.ndarray, codes: np.ndarray
    ) -> dict[str, float]:
        n = min(self.params.eval_rows, len(num))
        gen = torch.Generator().manual_seed(self.ctx.seed + 12345)
        idx = torch.randperm(len(num), generator=gen)[:n].numpy()
        rows = onehot_rows(
            torch.from_numpy(num[idx]), torch.from_numpy(codes[idx]), self.spec.cat_sizes
        )
        latents = sample_latents(self.spec, params, n, gen)
        params, rows, latents = to_device(self.device, params, rows, latents)
        with torch.no_grad():
            terms = loss_terms(self.model, params, rows, latents)
        return {k: float(v) for k, v in terms.items()} | {"num-examples": n}

    def evaluate(
        self, arrays: ArrayRecord, data: ClientRows, config: RoundConfig
    ) -> dict[str, float]:
        return self._heldout_loss(to_params(arrays), data["num"].numpy(), data["codes"].numpy())

    def synthesize(self, arrays: ArrayRecord, n: int, seed: int) -> pd.DataFrame:
        """N synthetic rows (original units) from the global model (on the CPU: the sampler
        draws from a CPU generator)."""
        params = to_params(arrays)
        num, codes = sample_rows(self.model, params, n, self.params.sample_steps, seed)
        return encoded(self._key).prep.decode(num.double().numpy(), codes.numpy())

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        torch.set_num_threads(1)
        data = encoded(self._key)
        out = self._heldout_loss(to_params(arrays), data.test_num, data.test_codes)
        out.pop("num-examples")
        if self.pretraining.rows:  # the summary says the run is warm-started, and from what
            out["warm_start_rows"] = float(self.pretraining.rows)
            out["warm_start_epochs"] = float(self.pretraining.epochs)
        if self.params.quality_rows and server_round == self.ctx.rounds:
            try:
                synth = self.synthesize(arrays, self.params.quality_rows, self.ctx.seed)
            except DivergedModel:  # e.g. strong DP noise: a diverged model draws no row
                return out | {"diverged": 1.0}
            schema = data.table.schema
            out |= quality_report(
                data.table.train, synth, data.table.test, list(schema.numeric),
                list(data.prep.categorical), data.prep.categories, schema.label, self.ctx.seed,
            )  # fmt: skip
        return out


def rows_of(data: ClientRows, positions: np.ndarray, cat_sizes: tuple[int, ...]) -> Rows:
    """Model-space rows of a client's local positions (used by tests and the scorer)."""
    return onehot_rows(data["num"][positions], data["codes"][positions], cat_sizes)
