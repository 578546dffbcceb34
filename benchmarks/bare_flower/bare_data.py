"""UCI Adult the plain way: pandas, standardised numerics, one-hot categoricals, IID shards."""

import functools

import numpy as np
import pandas as pd

COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week",
    "native-country", "income",
]  # fmt: skip
NUMERIC = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]


def _read(path: str, skip: int) -> pd.DataFrame:
    frame = pd.read_csv(path, header=None, names=COLUMNS, skiprows=skip, skipinitialspace=True,
                        na_values="?", dtype=str).dropna()  # fmt: skip
    frame["income"] = frame["income"].str.rstrip(".")
    return frame


@functools.cache  # once per process, as any Flower app whose clients share a process would
def load(data_dir: str, rows: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Encoded train/test; ``rows`` > 0: that many training rows drawn with replacement (seed 0),
    for more clients than Adult has rows (flowerbed's ``dataset.resample_rows``, same draw)."""
    adult, test = _read(f"{data_dir}/adult.data.gz", 0), _read(f"{data_dir}/adult.test.gz", 1)
    train = adult.iloc[np.random.default_rng(0).integers(0, len(adult), rows)] if rows else adult
    categorical = [c for c in COLUMNS[:-1] if c not in NUMERIC]
    x_num = train[NUMERIC].astype(float)
    mean, std = x_num.mean(), x_num.std(ddof=0)
    encoded = []
    for frame in (train, test):
        numeric = ((frame[NUMERIC].astype(float) - mean) / std).to_numpy()
        onehot = [
            (frame[c].to_numpy()[:, None] == np.array(sorted(adult[c].unique()))[None, :])
            for c in categorical
        ]
        encoded.append(np.hstack([numeric, *onehot]).astype(np.float32))
    y_train = (train["income"] == ">50K").to_numpy(np.int64)
    y_test = (test["income"] == ">50K").to_numpy(np.int64)
    return encoded[0], y_train, encoded[1], y_test


def partition(n: int, partition_id: int, num_partitions: int) -> np.ndarray:
    order = np.random.default_rng(0).permutation(n)
    return np.sort(np.array_split(order, num_partitions)[partition_id])
