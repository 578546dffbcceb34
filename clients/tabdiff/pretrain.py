"""Warm start: the server pretrains the denoiser once on public rows disjoint from every client's.

Cross-device clients (tens to a few hundred rows each) cannot train a 256 x 3 denoiser from
scratch within a benchmark's budget (docs/privacy-benchmark.md, "Known gaps"). A warm start is
the affordable route: before round 1 the server trains the initial model on a **public split**
of the same table, and the federation fine-tunes from there.

Threat model: the public rows and the pretrained weights are public; the server (and so the
attacker) knows both. The public split is taken from the train rows the clients' table does not
hold: the clients' table is the first ``dataset.max_rows`` train rows, and every partition is a
subset of it, so the public split comes from the rows after it (a fixed draw, seed 0, the same
for every run seed), minus every row whose values equal a row of the clients' table (Adult has
duplicate rows). No client row, by position or by value, reaches pretraining
(``tests/clients/test_tabdiff_pretrain.py``).

Pretraining is one ``local_update`` (fresh Adam, shuffled minibatches, ``epochs`` passes) from
the run seed's initial model, with batch order and latents from a generator seeded by the run
seed: the same seed gives the same weights on every engine. It runs on the CPU with one thread
and is cached in memory and, with ``$FLOWERBED_CACHE_DIR`` (set by ``flowerbed sweep``), on disk,
so a sweep pays it once per seed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from flowerbed.clients.core.config import DatasetConfig
from flowerbed.clients.core.diskcache import cached_arrays
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.datasets import Table, dataset_key, table_from_key
from flowerbed.clients.tabdiff.model import (
    DiffusionSpec,
    build_model,
    model_params,
    onehot_rows,
    sample_latents,
)
from flowerbed.clients.tabdiff.preprocess import TablePreprocessor
from flowerbed.clients.tabdiff.training import Protocol, batch_plan, local_update

#: the generator of the public draw: fixed, so the public split never depends on the run seed
PUBLIC_DRAW_SEED = 0
#: salt of the pretraining generator (batch order, latents) on top of the run seed
PRETRAIN_SALT = 7919


@dataclass(frozen=True)
class Pretraining:
    """How the server pretrains: ``rows`` public rows (0 = no warm start), ``epochs`` passes of
    fresh Adam at ``lr`` in minibatches of ``batch_size``."""

    rows: int
    epochs: int
    batch_size: int
    lr: float


def public_table_key(dataset_json: str) -> tuple[str, int]:
    """The dataset key of the whole table (``max_rows`` lifted) and the clients' row count.

    Refuses a config whose clients hold every train row (nothing left to be public) or whose
    train rows are resampled (a resampled row may repeat any row)."""
    section = json.loads(dataset_json)
    if section.get("resample_rows"):
        raise ConfigError(
            "workload.params.pretrain_rows cannot be used with dataset.resample_rows (a "
            "resampled table may repeat any row, so no public split is disjoint from it)"
        )
    if not section.get("max_rows"):
        raise ConfigError(
            "workload.params.pretrain_rows needs dataset.max_rows: the clients hold the first "
            "max_rows train rows and the public pretraining rows come from the rest"
        )
    whole = DatasetConfig(**{**section, "max_rows": None})
    return dataset_key(whole), int(section["max_rows"])


def public_row_ids(dataset_json: str, rows: int) -> np.ndarray:
    """Positions, in the whole train split, of the ``rows`` public rows (sorted).

    Drawn (fixed seed) from the positions after the clients' ``max_rows``, skipping every row
    whose values equal one of the clients' table."""
    key, n_clients = public_table_key(dataset_json)
    train = table_from_key(key).train
    n_clients = min(n_clients, len(train))
    clients = set(_row_tuples(train.iloc[:n_clients]))
    rest = train.iloc[n_clients:]
    fresh = np.array(
        [n_clients + i for i, row in enumerate(_row_tuples(rest)) if row not in clients],
        dtype=np.int64,
    )
    if len(fresh) < rows:
        raise ConfigError(
            f"workload.params.pretrain_rows={rows} exceeds the {len(fresh)} train rows outside "
            f"the clients' dataset.max_rows={n_clients} (lower pretrain_rows or max_rows)"
        )
    pick = np.random.default_rng(PUBLIC_DRAW_SEED).permutation(len(fresh))[:rows]
    return np.sort(fresh[pick])


def _row_tuples(frame: pd.DataFrame) -> list[tuple[str, ...]]:
    return [tuple(map(str, r)) for r in frame.itertuples(index=False, name=None)]


def public_table(dataset_json: str) -> Table:
    """The whole table (train rows beyond the clients' ``max_rows`` included)."""
    return table_from_key(public_table_key(dataset_json)[0])


#: in-process cache: (dataset JSON, spec, pretraining, seed) -> pretrained arrays
_MEMORY: dict[tuple[str, DiffusionSpec, Pretraining, int], dict[str, np.ndarray]] = {}


def pretrained_params(
    dataset_json: str,
    prep: TablePreprocessor,
    spec: DiffusionSpec,
    pretraining: Pretraining,
    seed: int,
) -> dict[str, torch.Tensor]:
    """The run seed's initial denoiser trained on the public split (cached; see module doc)."""
    memo = (dataset_json, spec, pretraining, seed)
    if memo not in _MEMORY:
        key = json.dumps(
            {
                "clients": dataset_key(DatasetConfig(**json.loads(dataset_json))),
                "whole": public_table_key(dataset_json)[0],
                "spec": asdict(spec),
                "pretraining": asdict(pretraining),
                "seed": seed,
            },
            sort_keys=True,
        )
        here = Path(__file__).resolve().parent
        code = [here / f for f in ("pretrain.py", "model.py", "training.py", "preprocess.py")]

        def build() -> tuple[dict[str, np.ndarray], dict[str, object]]:
            params = train_on_public(dataset_json, prep, spec, pretraining, seed)
            return {k: v.numpy() for k, v in params.items()}, {"rows": pretraining.rows}

        arrays, _ = cached_arrays("tabdiff-pretrain", key, code, build)
        if len(_MEMORY) >= 4:
            _MEMORY.pop(next(iter(_MEMORY)))
        _MEMORY[memo] = {k: np.array(v) for k, v in arrays.items()}
    return {k: torch.from_numpy(v.copy()) for k, v in _MEMORY[memo].items()}


def train_on_public(
    dataset_json: str,
    prep: TablePreprocessor,
    spec: DiffusionSpec,
    pretraining: Pretraining,
    seed: int,
) -> dict[str, torch.Tensor]:
    """Pretrain (uncached): ``epochs`` of Adam over the public rows from the seed's initial
    model."""
    torch.set_num_threads(1)
    ids = public_row_ids(dataset_json, pretraining.rows)
    frame = public_table(dataset_json).train.iloc[ids].reset_index(drop=True)
    num, codes = prep.encode(frame)
    num_t = torch.from_numpy(num.astype(np.float32))
    codes_t = torch.from_numpy(codes)
    model = build_model(spec, seed)
    params = model_params(model)
    protocol = Protocol(
        "fedavg", pretraining.batch_size, pretraining.lr, pretraining.epochs, "adam"
    )
    gen = torch.Generator().manual_seed(seed * 1_000_003 + PRETRAIN_SALT)
    plan = batch_plan(len(ids), protocol, gen)
    batches = [onehot_rows(num_t[i], codes_t[i], spec.cat_sizes) for i in plan]
    latents = [sample_latents(spec, params, len(i), gen) for i in plan]
    new = local_update(model, params, batches, latents, protocol)
    return {k: v.detach().contiguous() for k, v in new.items()}
