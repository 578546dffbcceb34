"""``adult``: UCI Adult census income, bundled (``data/adult.*.gz``)."""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

from flowerbed.clients.datasets import (
    DATASETS,
    Dataset,
    Table,
    clean_frame,
    infer_schema,
)

ADULT_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week",
    "native-country", "income",
]  # fmt: skip
ADULT_NUMERIC = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]


@DATASETS.register("adult", "UCI Adult census income (32,561 train / 16,281 test rows), bundled")
class AdultDataset(Dataset):
    """Its own published train/test split: it reads no ``dataset.*`` key."""

    def load(self) -> Table:
        return _adult(self.ctx.data_dir)


@functools.lru_cache(maxsize=1)
def _adult(directory: Path) -> Table:
    def read(name: str, skip: int) -> pd.DataFrame:
        frame = pd.read_csv(
            directory / name, header=None, names=ADULT_COLUMNS, skiprows=skip,
            skipinitialspace=True, na_values="?", dtype=str,
        )  # fmt: skip
        frame["income"] = frame["income"].str.rstrip(".")
        return clean_frame(frame, ADULT_COLUMNS, ADULT_NUMERIC, name)[0]

    train, test = read("adult.data.gz", 0), read("adult.test.gz", 1)
    categorical = [c for c in ADULT_COLUMNS[:-1] if c not in ADULT_NUMERIC]
    schema = infer_schema(train, "income", ADULT_NUMERIC, categorical)
    for col in categorical:  # drop test rows with categories the training split never saw
        test = test[test[col].isin(schema.categories[col])]
    return Table(train, test.reset_index(drop=True), schema)
