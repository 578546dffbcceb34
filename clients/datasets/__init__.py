"""Tabular datasets with a typed schema, and deterministic partitioning into clients.

Every dataset returns a :class:`Table`: train and test frames with the same columns and a schema
saying which columns are numeric, which categorical (with their vocabularies) and which is the label.
Each dataset is registered in a module named after it (``adult.py``, ``german.py``, ``csv.py``,
``breast_cancer.py``, ``wine.py``, ``iris.py``); this module holds the registry, the table types
and what they share (cleaning, the fixed stratified split, the scikit-learn loader, the cache).

One contract, as every component kind: a dataset subclasses :class:`Dataset`, built as
``cls(params, ctx)`` from its typed ``Params`` (the ``dataset.*`` keys it reads, each field with a
rule) and a :class:`DatasetContext`; ``load()`` returns the :class:`Table`. It never sees the
experiment config: :func:`build_dataset` makes both from the config's ``dataset`` section.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd

from flowerbed.clients.core.component import Component, P
from flowerbed.clients.core.config import DatasetConfig
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.files import content_key
from flowerbed.clients.core.params import check_rules, param
from flowerbed.clients.core.registry import Registry

DATASETS: Registry[Dataset] = Registry("dataset", (__name__,))


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


@dataclass(frozen=True)
class DatasetContext:
    """What a dataset knows besides its ``Params``: its registered ``name`` (what its errors
    call the table when no file names it) and ``data_dir``, where bundled data files live."""

    name: str
    data_dir: Path


#: the keys of the config's ``dataset`` section a dataset's ``Params`` may declare
SECTION_KEYS = frozenset(f.name for f in dataclasses.fields(DatasetConfig)) - {"name"}


class Dataset(Component[DatasetContext, P]):
    """Base class of a registered dataset: ``Dataset(params, ctx)`` and ``load() -> Table``.

    ``Params`` declares the ``dataset.*`` keys the dataset reads (a subset of the section's:
    ``path``, ``label``, ``numeric``, ``categorical``, ``test_fraction``), each with a rule;
    ``max_rows`` and ``resample_rows`` apply to every dataset after ``load`` (:func:`load_table`).
    """

    Context = DatasetContext
    built_by = "build_dataset(section) builds one from a config"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        params = cls.__dict__.get("Params")
        if params is not None and dataclasses.is_dataclass(params):
            unknown = sorted({f.name for f in dataclasses.fields(params)} - SECTION_KEYS)
            if unknown:
                raise TypeError(
                    f"{cls.__name__}.Params field '{unknown[0]}' is not a key of the dataset "
                    f"section (allowed: {', '.join(sorted(SECTION_KEYS))})"
                )

    def __init__(self, params: P | Mapping[str, object] | None, ctx: DatasetContext) -> None:
        """``params``: this dataset's ``Params``, or its fields as a mapping (rules checked here);
        ``ctx``: its context (``build_dataset(section)`` makes both from a config)."""
        super().__init__(params, ctx)
        check_rules(self.params, "dataset")

    def load(self) -> Table:
        """The table: train and test frames with their schema."""
        raise NotImplementedError


@dataclass
class SplitParams:
    """A dataset split by :func:`split_table`: the share of rows held out for testing."""

    test_fraction: float = param(0.2, gt=0, lt=1)


def build_dataset(section: DatasetConfig) -> Dataset:
    """The dataset of a resolved config's ``dataset`` section: its registered class, built from
    the section's keys its ``Params`` declares and its context."""
    cls = DATASETS.get(section.name)
    keys = [f.name for f in dataclasses.fields(cls.Params)]
    params = cls.Params(**{k: getattr(section, k) for k in keys})
    return cls(params, DatasetContext(section.name, data_dir()))


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


def clean_frame(frame: pd.DataFrame, schema_cols: list[str], numeric: list[str], source: str):
    for col in numeric:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    bad = frame[schema_cols].isna().any(axis=1)
    return frame.loc[~bad].reset_index(drop=True), int(bad.sum())


def split_table(data: tuple[pd.DataFrame, TableSchema], test_fraction: float, source: str) -> Table:  # fmt: skip
    """A fixed (seed 0) stratified train/test split: the test set never depends on the run seed.
    ``source`` names the table in errors (the file, else the dataset)."""
    from sklearn.model_selection import train_test_split

    frame, schema = data
    check_classes(frame[schema.label], schema.label, source)
    try:
        train, test = train_test_split(
            frame, test_size=test_fraction, random_state=0,
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


def sklearn_table(loader_name: str) -> tuple[pd.DataFrame, TableSchema]:
    import sklearn.datasets as skd

    bunch = getattr(skd, loader_name)(as_frame=True)
    frame = bunch.frame.copy()
    frame["target"] = [str(bunch.target_names[t]) for t in bunch.target]
    numeric = [c for c in frame.columns if c != "target"]
    frame[numeric] = frame[numeric].astype("float64")
    return frame, infer_schema(frame, "target", numeric, [])


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


def dataset_key(dataset: DatasetConfig) -> str:
    """Cache key of a dataset config: its JSON plus the content digest of the file it reads."""
    return content_key({"dataset": dataclasses.asdict(dataset)})


def key_section(key: str) -> DatasetConfig:
    """The dataset section a :func:`dataset_key` was made of."""
    return DatasetConfig(**json.loads(key)["cfg"]["dataset"])


def load_table(dataset: DatasetConfig) -> Table:
    """Load the configured table (cached per process; a rewritten file is read again)."""
    return _load_cached(dataset_key(dataset))


def table_from_key(key: str) -> Table:
    """The table of a :func:`dataset_key` (for caches of what is derived from a table)."""
    return _load_cached(key)


@functools.lru_cache(maxsize=8)
def _load_cached(key: str) -> Table:
    dataset = key_section(key)
    table = build_dataset(dataset).load()
    if dataset.max_rows:
        n = int(dataset.max_rows)
        table = Table(table.train.iloc[:n].reset_index(drop=True), table.test, table.schema)
    if dataset.resample_rows:
        table = Table(resample(table.train, int(dataset.resample_rows)), table.test, table.schema)
    return table


def resample(train: pd.DataFrame, rows: int) -> pd.DataFrame:
    """``rows`` rows drawn with replacement from ``train`` by a fixed generator (seed 0), so a
    scale test can give 100,000 clients a training row each from a 30,000-row table; the same
    draw as the bare Flower baseline's (``benchmarks/bare_flower/bare_data.py``)."""
    picks = np.random.default_rng(0).integers(0, len(train), rows)
    return train.iloc[picks].reset_index(drop=True)
