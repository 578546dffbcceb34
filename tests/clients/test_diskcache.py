"""The machine cache: built once under a lock, memory-mapped after, keyed by content."""

import json
import multiprocessing
import time

import numpy as np
import pytest

from flowerbed.clients.core import diskcache
from flowerbed.clients.core.diskcache import CACHE_ENV, cached_arrays


def _build(value: float = 1.0):
    return {"x": np.full((3, 2), value, np.float32), "y": np.arange(3)}, {"n": 3}


def _failing():
    raise AssertionError("built again: the cache was not read")


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    calls = []
    for _ in range(2):
        arrays, meta = cached_arrays("t", "k", [], lambda: calls.append(1) or _build())
    assert len(calls) == 2 and meta == {"n": 3} and not list(tmp_path.iterdir())


def test_second_read_is_mapped_from_disk_bit_for_bit(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    built, _ = _build(0.1)
    first, _ = cached_arrays("t", "k", [], lambda: _build(0.1))
    again, meta = cached_arrays("t", "k", [], _failing)
    assert meta == {"n": 3} and isinstance(again["x"], np.memmap)
    for name in built:
        assert again[name].dtype == built[name].dtype
        assert again[name].tobytes() == built[name].tobytes()
    again["x"][0, 0] = 42.0  # copy-on-write: this process only
    fresh, _ = cached_arrays("t", "k", [], _failing)
    assert fresh["x"][0, 0] == np.float32(0.1)


def test_the_key_and_the_files_it_depends_on_name_the_entry(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    data = tmp_path / "table.csv"
    data.write_text("a\n1\n")
    cached_arrays("t", "k", [data], lambda: _build(1.0))
    assert cached_arrays("t", "k", [data], _failing)[0]["x"][0, 0] == 1.0
    data.write_text("a\n2\n")  # same path, other bytes
    assert cached_arrays("t", "k", [data], lambda: _build(2.0))[0]["x"][0, 0] == 2.0
    assert cached_arrays("t", "other", [data], lambda: _build(3.0))[0]["x"][0, 0] == 3.0


def test_a_failed_build_leaves_nothing_and_the_next_caller_builds(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))

    def broken():
        return {"x": np.zeros(2), "bad": object()}, {}

    with pytest.raises(ValueError):
        cached_arrays("t", "k", [], broken)
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []
    assert cached_arrays("t", "k", [], _build)[1] == {"n": 3}


def _racer(root: str, log: str, start: float) -> None:
    import os

    os.environ[CACHE_ENV] = root
    time.sleep(max(0.0, start - time.time()))

    def slow():
        with open(log, "a") as fh:
            fh.write("built\n")
        time.sleep(1.0)
        return _build()

    diskcache.cached_arrays("t", "k", [], slow)


def test_processes_that_start_together_build_once(tmp_path):
    log = tmp_path / "builds.log"
    start = time.time() + 1.0
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_racer, args=(str(tmp_path / "c"), str(log), start)) for _ in range(3)]  # fmt: skip
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert log.read_text().splitlines() == ["built"]


def test_encoded_table_from_the_cache_is_the_built_one_without_reading_the_table(
    tmp_path, monkeypatch
):
    import flowerbed.clients.workloads.tabular_mlp as tm

    key = json.dumps({"name": "german"}, sort_keys=True)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    tm._encoded_table.cache_clear()
    plain = tm._encoded(key)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    tm._encoded_table.cache_clear()
    tm._encoded(key)  # builds the entry
    tm._encoded_table.cache_clear()
    monkeypatch.setattr(tm, "table_from_key", _failing)  # a new process: from disk only
    cached = tm._encoded(key)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert getattr(cached, name).tobytes() == getattr(plain, name).tobytes(), name
    assert cached.schema == plain.schema and cached.blocks == plain.blocks
    assert cached.encoder.mean.tobytes() == plain.encoder.mean.tobytes()
    assert cached.encoder.scale.tobytes() == plain.encoder.scale.tobytes()
    tm._encoded_table.cache_clear()
