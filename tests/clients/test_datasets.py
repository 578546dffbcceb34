"""Datasets: typed schemas and deterministic, disjoint, covering partitions."""

import dataclasses

import numpy as np
import pytest

from flowerbed.clients.core.config import DatasetConfig
from flowerbed.clients.datasets import load_table
from flowerbed.clients.datasets.partition import partition_indices


def test_adult_and_german_schemas():
    adult = load_table(DatasetConfig(name="adult"))
    assert len(adult.schema.numeric) == 6 and len(adult.schema.categorical) == 8
    assert len(adult.schema.categories["native-country"]) >= 40
    assert adult.schema.classes == ("<=50K", ">50K")
    assert not adult.train[list(adult.schema.features)].isna().any().any()
    german = load_table(DatasetConfig(name="german"))
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


@pytest.mark.parametrize("kind,alpha", [("iid", 0.5), ("dirichlet", 0.1), ("dirichlet", 2.0)])
def test_partitions_equal_flwr_datasets_partitioners(kind, alpha):
    """The numpy partitioner gives the rows flwr-datasets' partitioners give (seeded row order)."""
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner

    labels = np.random.default_rng(3).integers(0, 5, 2_003)
    for num, seed in ((1, 0), (7, 1), (20, 42)):
        order = np.random.default_rng(seed).permutation(len(labels))
        if kind == "iid":
            reference = IidPartitioner(num)
        else:
            reference = DirichletPartitioner(
                num, "label", alpha, min_partition_size=0, self_balancing=False, seed=seed
            )
        reference.dataset = Dataset.from_dict({"row": order, "label": labels[order]})
        for pid in range(num):
            expected = np.sort(np.asarray(reference.load_partition(pid)["row"]))
            got = partition_indices(labels, pid, num, kind, alpha, seed)
            assert np.array_equal(got, expected), (kind, num, seed, pid)


@pytest.mark.parametrize("name", ["adult", "german"])
def test_table_encoder_equals_scikit_learn(name):
    """Standardise + one-hot with numpy gives scikit-learn's ColumnTransformer features exactly."""
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    from flowerbed.clients.workloads.tabular_mlp import TableEncoder

    table = load_table(DatasetConfig(name=name))
    schema = table.schema
    vocabularies = [list(schema.categories[c]) for c in schema.categorical]
    reference = ColumnTransformer([
        ("num", StandardScaler(), list(schema.numeric)),
        ("cat", OneHotEncoder(categories=vocabularies, handle_unknown="ignore",
                              sparse_output=False), list(schema.categorical)),
    ])  # fmt: skip
    expected = reference.fit_transform(table.train[list(schema.features)])
    encoder = TableEncoder(schema).fit(table.train)
    assert np.array_equal(encoder.transform(table.train), expected)
    as_float32 = encoder.transform(table.train, np.float32)  # written straight into float32
    assert as_float32.dtype == np.float32 and np.array_equal(
        as_float32, expected.astype(np.float32)
    )
    unseen = table.test.head(5).copy()
    unseen.loc[unseen.index[0], schema.categorical[0]] = "never-seen"  # ignored, as in sklearn
    assert np.array_equal(encoder.transform(unseen), reference.transform(unseen))


def test_clientapp_process_imports_only_its_workload():
    """A ClientApp for quickstart loads one workload module and no sklearn / HF datasets."""
    script = (
        "import json, sys\n"
        "from flowerbed.clients import runtime\n"
        "cfg = json.load(open(sys.argv[1]))\n"
        "runtime._entry(json.dumps(cfg, sort_keys=True)).partition(0, 2)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('flowerbed.clients.workloads.'))\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'sklearn', 'scipy', 'datasets', 'flwr_datasets', 'matplotlib', 'opacus'})\n"
        "print(json.dumps([loaded, heavy]))\n"
    )
    import json
    import subprocess
    import sys
    import tempfile

    from flowerbed.clients.core.config import to_json
    from flowerbed.server.experiment import load_experiment

    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:
        fh.write(to_json(load_experiment("quickstart", ["clients.num=2"])))
        fh.flush()
        done = subprocess.run(
            [sys.executable, "-c", script, fh.name], capture_output=True, text=True, check=True
        )
    loaded, heavy = json.loads(done.stdout.splitlines()[-1])
    assert loaded == ["flowerbed.clients.workloads.tabular_mlp"]
    assert heavy == []


def test_resampled_rows_are_the_bare_flower_baselines_table():
    """``dataset.resample_rows`` draws training rows with replacement (seed 0), keeps the test
    split, and gives the very table the bare Flower baseline builds with ``rows`` (both arms of
    benchmarks/scale_memory.py train on the same data)."""
    import importlib.util
    from pathlib import Path

    from flowerbed.clients.datasets import data_dir
    from flowerbed.clients.workloads.tabular_mlp import TableEncoder

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bare_flower" / "bare_data.py"
    spec = importlib.util.spec_from_file_location("bare_data_under_test", path)
    bare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bare)

    adult = load_table(DatasetConfig(name="adult"))
    table = load_table(DatasetConfig(name="adult", resample_rows=40_000))
    assert len(table.train) == 40_000 > len(adult.train)
    assert table.train.duplicated().any() and table.test.equals(adult.test)
    again = load_table(DatasetConfig(name="adult", resample_rows=40_000))
    assert again is table  # cached per config

    x_bare, y_bare, _, _ = bare.load(str(data_dir()), 40_000)
    encoder = TableEncoder(table.schema).fit(table.train)
    np.testing.assert_allclose(encoder.transform(table.train), x_bare, atol=1e-5)
    labels = table.train[table.schema.label].astype(str).map(table.schema.classes.index)
    np.testing.assert_array_equal(labels.to_numpy(np.int64), y_bare)


def test_a_dataset_is_built_from_its_typed_params_and_context(tmp_path):
    """``Dataset(params, ctx)``: the ``dataset.*`` keys its ``Params`` declares, each with a rule
    (checked when it is built), and a ``DatasetContext``; a key outside the section is refused."""
    from dataclasses import dataclass

    from flowerbed.clients.core.errors import ConfigError
    from flowerbed.clients.datasets import Dataset, DatasetContext, build_dataset
    from flowerbed.clients.datasets.csv import CsvDataset

    csv = tmp_path / "t.csv"
    csv.write_text("a,y\n" + "".join(f"{i},{'pq'[i % 2]}\n" for i in range(10)))
    section = DatasetConfig(name="csv", path=str(csv), label="y", numeric=["a"], categorical=[],
                            test_fraction=0.2)  # fmt: skip
    dataset = build_dataset(section)
    assert isinstance(dataset, CsvDataset) and dataset.params.label == "y"
    assert dataset.ctx.name == "csv" and len(dataset.load().test) == 2
    with pytest.raises(ConfigError, match=r"^dataset\.numeric: entry 0 is blank"):
        build_dataset(dataclasses.replace(section, numeric=[" "]))
    with pytest.raises(ConfigError, match=r"^dataset\.test_fraction must be in \(0, 1\)"):
        build_dataset(dataclasses.replace(section, test_fraction=1.0))
    with pytest.raises(TypeError, match="DatasetContext"):
        CsvDataset({}, {"name": "csv"})
    with pytest.raises(TypeError, match="'rows' is not a key of the dataset section"):

        class Odd(Dataset):
            @dataclass
            class Params:
                rows: int = 3

    assert isinstance(build_dataset(DatasetConfig(name="adult")).ctx, DatasetContext)
