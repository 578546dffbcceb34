"""Tabular datasets with a typed schema, and deterministic partitioning into clients.

Every dataset returns a :class:`Table`: train and test frames with the same columns and a schema
saying which columns are numeric, which categorical (with their vocabularies) and which is the label.
"""

from __future__ import annotations

import functools
import json
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.files import content_key
from flowerbed.clients.core.registry import Registry

DATASETS = Registry("dataset", (__name__,))


@dataclass(frozen=True)
class TableSchema:
    """What a server (and so an attacker) may know about a table: its columns and vocabularies."""

    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    categories: dict[str, tuple[str, ...]] = field(hash=False)
    label: str
    classes: tuple[str, ...]

    @property
    def features(self) -> tuple[str, ...]:
        return self.numeric + self.categorical


@dataclass(frozen=True)
class Table:
    train: pd.DataFrame
    test: pd.DataFrame
    schema: TableSchema


def data_dir() -> Path:
    """Where the bundled data lives: beside this module, else in the installed project."""
    here = Path(__file__).resolve().parent / "data"
    if (here / "adult.data.gz").is_file():
        return here
    try:  # a Flower FAB carries only .py/.yaml/...: fall back to the installed distribution
        dist = metadata.distribution("flowerbed")
        direct = dist.read_text("direct_url.json")
        if direct:
            url = json.loads(direct)["url"]
            root = Path(url.removeprefix("file://"))
            candidate = root / "clients" / "datasets" / "data"
            if candidate.is_dir():
                return candidate
        for file in dist.files or []:
            if str(file).endswith("clients/datasets/data/adult.data.gz"):
                return Path(str(file.locate())).parent
    except metadata.PackageNotFoundError:
        pass
    return here


def infer_schema(
    train: pd.DataFrame, label: str, numeric: list[str], categorical: list[str]
) -> TableSchema:
    categories = {c: tuple(sorted(train[c].astype(str).unique())) for c in categorical}
    classes = tuple(sorted(train[label].astype(str).unique()))
    return TableSchema(tuple(numeric), tuple(categorical), categories, label, classes)


def _clean(frame: pd.DataFrame, schema_cols: list[str], numeric: list[str], source: str):
    for col in numeric:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    bad = frame[schema_cols].isna().any(axis=1)
    return frame.loc[~bad].reset_index(drop=True), int(bad.sum())


# ---------------------------------------------------------------------------------------------
ADULT_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week",
    "native-country", "income",
]  # fmt: skip
ADULT_NUMERIC = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]


@DATASETS.register("adult", "UCI Adult census income (32,561 train / 16,281 test rows), bundled")
class AdultDataset:
    @staticmethod
    def load(cfg: dict[str, Any]) -> Table:
        return _adult()


@functools.lru_cache(maxsize=1)
def _adult() -> Table:
    def read(name: str, skip: int) -> pd.DataFrame:
        frame = pd.read_csv(
            data_dir() / name, header=None, names=ADULT_COLUMNS, skiprows=skip,
            skipinitialspace=True, na_values="?", dtype=str,
        )  # fmt: skip
        frame["income"] = frame["income"].str.rstrip(".")
        return _clean(frame, ADULT_COLUMNS, ADULT_NUMERIC, name)[0]

    train, test = read("adult.data.gz", 0), read("adult.test.gz", 1)
    categorical = [c for c in ADULT_COLUMNS[:-1] if c not in ADULT_NUMERIC]
    schema = infer_schema(train, "income", ADULT_NUMERIC, categorical)
    for col in categorical:  # drop test rows with categories the training split never saw
        test = test[test[col].isin(schema.categories[col])]
    return Table(train, test.reset_index(drop=True), schema)


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
class GermanDataset:
    @staticmethod
    def load(cfg: dict[str, Any]) -> Table:
        return _split(_german(), cfg)


@functools.lru_cache(maxsize=1)
def _german() -> tuple[pd.DataFrame, TableSchema]:
    frame = pd.read_csv(
        data_dir() / "german.data.gz", header=None, names=GERMAN_COLUMNS, sep=r"\s+", dtype=str
    )
    frame["credit"] = frame["credit"].map({"1": "good", "2": "bad"})
    frame = _clean(frame, GERMAN_COLUMNS, GERMAN_NUMERIC, "german")[0]
    categorical = [c for c in GERMAN_COLUMNS[:-1] if c not in GERMAN_NUMERIC]
    return frame, infer_schema(frame, "credit", GERMAN_NUMERIC, categorical)


def _split(data: tuple[pd.DataFrame, TableSchema], cfg: dict[str, Any]) -> Table:
    """A fixed (seed 0) stratified train/test split: the test set never depends on the run seed."""
    from sklearn.model_selection import train_test_split

    frame, schema = data
    source = Path(cfg["path"]).name if cfg.get("path") else cfg.get("name", "dataset")
    check_classes(frame[schema.label], schema.label, source)
    try:
        train, test = train_test_split(
            frame, test_size=cfg.get("test_fraction", 0.2), random_state=0,
            stratify=frame[schema.label],
        )  # fmt: skip
    except ValueError as exc:  # too few rows for the test fraction and the classes
        raise ConfigError(
            f"{source}: {len(frame)} rows cannot be split into train and test stratified by "
            f"'{schema.label}' ({str(exc).splitlines()[0]}); add rows or change "
            "dataset.test_fraction"
        ) from None
    return Table(train.reset_index(drop=True), test.reset_index(drop=True), schema)


def check_classes(labels: pd.Series, label: str, source: str) -> None:
    """A classification table needs two classes or more, each with two rows or more."""
    counts = labels.astype(str).value_counts()
    if len(counts) < 2:
        only = f" (only '{counts.index[0]}')" if len(counts) else ""
        raise ConfigError(
            f"{source}: label '{label}' has {len(counts)} class{only}; a classifier needs at "
            "least two (is dataset.label the right column?)"
        )
    small = counts[counts < 2]
    if len(small):
        raise ConfigError(
            f"{source}: class '{small.index[0]}' of label '{label}' has {int(small.iloc[0])} row; "
            "each class needs at least 2 rows for the stratified train/test split (add rows "
            "or remove that class)"
        )


def _sklearn_table(loader_name: str) -> tuple[pd.DataFrame, TableSchema]:
    import sklearn.datasets as skd

    bunch = getattr(skd, loader_name)(as_frame=True)
    frame = bunch.frame.copy()
    frame["target"] = [str(bunch.target_names[t]) for t in bunch.target]
    numeric = [c for c in frame.columns if c != "target"]
    frame[numeric] = frame[numeric].astype("float64")
    return frame, infer_schema(frame, "target", numeric, [])


for _name, _loader, _desc in [
    ("breast-cancer", "load_breast_cancer", "scikit-learn breast cancer (569 rows, 30 numeric)"),
    ("wine", "load_wine", "scikit-learn wine (178 rows, 13 numeric, 3 classes)"),
    ("iris", "load_iris", "scikit-learn iris (150 rows, 4 numeric, 3 classes)"),
]:

    def _make(loader: str = _loader) -> type:
        class SklearnDataset:
            @staticmethod
            def load(cfg: dict[str, Any]) -> Table:
                return _split(_sklearn_table(loader), cfg)

        return SklearnDataset

    DATASETS.register(_name, _desc)(_make())


@DATASETS.register("csv", "any CSV file with a declared schema (dataset.path/label/numeric/...)")
class CsvDataset:
    @staticmethod
    def load(cfg: dict[str, Any]) -> Table:
        path = cfg.get("path")
        if not path:
            raise ConfigError("dataset 'csv' needs dataset.path (a CSV file with a header row)")
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"dataset file not found: {path}")
        label, numeric, categorical = cfg.get("label"), cfg.get("numeric"), cfg.get("categorical")
        if not label:
            raise ConfigError("dataset 'csv' needs dataset.label (the name of the label column)")
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
        return _split((frame, infer_schema(frame, label, list(numeric), list(categorical))), cfg)


def read_csv_table(path: Path) -> pd.DataFrame:
    """A CSV with a header row and at least one data row, as strings; one-line errors."""
    try:
        with warnings.catch_warnings():  # a longer first row: pandas warns and drops fields
            warnings.simplefilter("error", pd.errors.ParserWarning)
            frame = pd.read_csv(path, dtype=str, skipinitialspace=True, index_col=False)
    except pd.errors.ParserWarning:
        raise ConfigError(
            f"{path.name}: a row has more fields than the header "
            "(every row needs as many fields as the header)"
        ) from None
    except pd.errors.EmptyDataError:
        raise ConfigError(
            f"{path.name} is empty (a CSV needs a header row and data rows)"
        ) from None
    except pd.errors.ParserError as exc:
        detail = str(exc).strip().splitlines()[-1]
        raise ConfigError(
            f"{path.name}: {detail.removeprefix('Error tokenizing data. C error: ')} "
            "(every row needs as many fields as the header)"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path.name} is not UTF-8 text ({exc.reason})") from None
    if frame.empty:
        raise ConfigError(f"{path.name} has a header but no data rows")
    return frame


def dataset_key(dataset_cfg: dict[str, Any]) -> str:
    """Cache key of a dataset config: its JSON plus the content digest of the file it reads."""
    return content_key({"dataset": dataset_cfg})


def load_table(dataset_cfg: dict[str, Any]) -> Table:
    """Load the configured table (cached per process; a rewritten file is read again)."""
    return _load_cached(dataset_key(dataset_cfg))


def table_from_key(key: str) -> Table:
    """The table of a :func:`dataset_key` (for caches of what is derived from a table)."""
    return _load_cached(key)


@functools.lru_cache(maxsize=8)
def _load_cached(key: str) -> Table:
    cfg = json.loads(key)["cfg"]["dataset"]
    table = DATASETS.get(cfg["name"]).load(cfg)
    if cfg.get("max_rows"):
        n = int(cfg["max_rows"])
        table = Table(table.train.iloc[:n].reset_index(drop=True), table.test, table.schema)
    if cfg.get("resample_rows"):
        table = Table(resample(table.train, int(cfg["resample_rows"])), table.test, table.schema)
    return table


def resample(train: pd.DataFrame, rows: int) -> pd.DataFrame:
    """``rows`` rows drawn with replacement from ``train`` by a fixed generator (seed 0), so a
    scale test can give 100,000 clients a training row each from a 30,000-row table; the same
    draw as the bare Flower baseline's (``benchmarks/bare_flower/bare_data.py``)."""
    picks = np.random.default_rng(0).integers(0, len(train), rows)
    return train.iloc[picks].reset_index(drop=True)
