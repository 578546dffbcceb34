"""``csv``: any CSV file with a declared schema (``dataset.path``, ``label``, ``numeric``, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.params import param
from flowerbed.clients.datasets import (
    DATASETS,
    Dataset,
    SplitParams,
    Table,
    infer_schema,
    read_csv_table,
    split_table,
)


def _check_columns_once(label: str, numeric: list[str], categorical: list[str]) -> None:
    """Each column in one role: the label only in ``dataset.label``, no column listed twice."""
    named = [("dataset.numeric", c) for c in numeric] + [("dataset.categorical", c) for c in categorical]  # fmt: skip
    for i, (key, column) in enumerate(named):
        if column == label or column in [c for _, c in named[:i]]:
            what = "the label" if column == label else "listed twice"
            raise ConfigError(
                f"column '{column}' in {key} is {what} (allowed: each column once, the label in "
                "dataset.label only)"
            )


def _named(value: str) -> str | None:
    """A file or column name is not blank."""
    return None if value.strip() else "a blank name (allowed: a file path or a column name)"


def _column_names(values: list[str]) -> str | None:
    """Every listed column has a name."""
    blank = [i for i, v in enumerate(values) if not str(v).strip()]
    return f"entry {blank[0]} is blank (allowed: the CSV header's column names)" if blank else None


@DATASETS.register("csv", "any CSV file with a declared schema (dataset.path/label/numeric/...)")
class CsvDataset(Dataset):
    @dataclass
    class Params(SplitParams):
        path: str | None = param(None, check=_named)  # the CSV file (a header row, then rows)
        label: str | None = param(None, check=_named)  # the label column
        numeric: list[str] = param(factory=list, check=_column_names)
        categorical: list[str] = param(factory=list, check=_column_names)

    params: Params

    def load(self) -> Table:
        given = self.params.path
        if not given:
            raise ConfigError("dataset 'csv' needs dataset.path (a CSV file with a header row)")
        path = Path(given)
        if not path.is_file():
            raise ConfigError(f"dataset file not found: {path}")
        label, numeric, categorical = (
            self.params.label,
            self.params.numeric,
            self.params.categorical,
        )
        if not label:
            raise ConfigError("dataset 'csv' needs dataset.label (the name of the label column)")
        _check_columns_once(label, list(numeric), list(categorical))
        frame = read_csv_table(path)
        columns = [*numeric, *categorical, label]
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise ConfigError(
                f"column '{missing[0]}' not in {path.name} (columns: {', '.join(frame.columns)})"
            )
        for col in numeric:
            values = pd.to_numeric(frame[col], errors="coerce")
            if values.isna().any() or not np.isfinite(values).all():
                row = int(np.flatnonzero(values.isna() | ~np.isfinite(values))[0]) + 2
                raise ConfigError(f"{path.name}: NaN or non-numeric value in '{col}' (line {row})")
            frame[col] = values.astype("float64")
        if frame[[*categorical, label]].isna().any().any():
            col = next(c for c in [*categorical, label] if frame[c].isna().any())
            row = int(np.flatnonzero(frame[col].isna())[0]) + 2
            raise ConfigError(
                f"{path.name}: empty value in categorical column '{col}' (line {row})"
            )
        frame = frame[columns]
        schema = infer_schema(frame, label, list(numeric), list(categorical))
        return split_table((frame, schema), self.params.test_fraction, path.name)
