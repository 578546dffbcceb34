"""``german``: UCI Statlog German Credit, bundled (``data/german.data.gz``)."""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

from flowerbed.clients.datasets import (
    DATASETS,
    Dataset,
    SplitParams,
    Table,
    TableSchema,
    clean_frame,
    infer_schema,
    split_table,
)

GERMAN_COLUMNS = [
    "checking", "duration", "credit-history", "purpose", "credit-amount", "savings", "employment",
    "installment-rate", "personal-status", "other-debtors", "residence-since", "property", "age",
    "other-installments", "housing", "existing-credits", "job", "dependents", "telephone",
    "foreign-worker", "credit",
]  # fmt: skip
GERMAN_NUMERIC = [
    "duration", "credit-amount", "installment-rate", "residence-since", "age",
    "existing-credits", "dependents",
]  # fmt: skip


@DATASETS.register("german", "UCI Statlog German Credit (1,000 rows, 7 numeric + 13 categorical)")
class GermanDataset(Dataset):
    Params = SplitParams
    params: SplitParams

    def load(self) -> Table:
        return split_table(_german(self.ctx.data_dir), self.params.test_fraction, self.ctx.name)


@functools.lru_cache(maxsize=1)
def _german(directory: Path) -> tuple[pd.DataFrame, TableSchema]:
    frame = pd.read_csv(
        directory / "german.data.gz", header=None, names=GERMAN_COLUMNS, sep=r"\s+", dtype=str
    )
    frame["credit"] = frame["credit"].map({"1": "good", "2": "bad"})
    frame = clean_frame(frame, GERMAN_COLUMNS, GERMAN_NUMERIC, "german")[0]
    categorical = [c for c in GERMAN_COLUMNS[:-1] if c not in GERMAN_NUMERIC]
    return frame, infer_schema(frame, "credit", GERMAN_NUMERIC, categorical)
