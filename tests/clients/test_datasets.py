"""Datasets: typed schemas and deterministic, disjoint, covering partitions."""

import numpy as np

from flowerbed.clients.datasets import load_table
from flowerbed.clients.datasets.partition import partition_indices


def test_adult_and_german_schemas():
    adult = load_table({"name": "adult", "test_fraction": 0.2})
    assert len(adult.schema.numeric) == 6 and len(adult.schema.categorical) == 8
    assert len(adult.schema.categories["native-country"]) >= 40
    assert adult.schema.classes == ("<=50K", ">50K")
    assert not adult.train[list(adult.schema.features)].isna().any().any()
    german = load_table({"name": "german", "test_fraction": 0.2})
    assert len(german.schema.numeric) == 7 and len(german.schema.categorical) == 13
    assert len(german.train) + len(german.test) == 1000


def test_partitions_deterministic_disjoint_covering():
    labels = np.array([i % 3 for i in range(300)])
    for kind in ("iid", "dirichlet"):
        parts = [partition_indices(labels, i, 5, kind, 0.5, seed=3) for i in range(5)]
        again = [partition_indices(labels, i, 5, kind, 0.5, seed=3) for i in range(5)]
        assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
        joined = np.concatenate(parts)
        assert len(joined) == len(set(joined)) == 300
    other = partition_indices(labels, 0, 5, "iid", seed=4)
    assert not np.array_equal(other, partition_indices(labels, 0, 5, "iid", seed=3))
