"""Engines: quickstart learns, failures are injected and survived, inline == simulation."""

import os
import uuid
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from flwr.serverapp import Grid

from flowerbed.apps.inline import InlineGrid, run_inline
from flowerbed.clients.core.config import Engine


def test_quickstart_beats_majority_by_five_points(inline_cfg):
    summary = run_inline(inline_cfg("quickstart"))
    metrics = summary["metrics"]
    assert metrics["central.accuracy"] >= metrics["central.majority_accuracy"] + 0.05
    assert summary["failures"] == 0


def test_failure_injection_run_completes_and_reports(inline_cfg):
    summary = run_inline(inline_cfg("quickstart", "clients.failure_rate=0.3", "rounds=3"))
    per_round = summary["failures_per_round"]
    assert len(per_round) == 3 and sum(per_round) == summary["failures"] > 0
    assert all(f < 10 for f in per_round)
    assert summary["metrics"]["central.accuracy"] > summary["metrics"]["central.majority_accuracy"]


def test_same_seed_same_result_and_seed_matters(inline_cfg):
    small = ("rounds=1", "clients.num=4", "dataset.max_rows=2000")
    a = run_inline(inline_cfg("quickstart", *small))["metrics"]
    b = run_inline(inline_cfg("quickstart", *small))["metrics"]
    c = run_inline(inline_cfg("quickstart", *small, "seed=1"))["metrics"]
    assert a["central.accuracy"] == b["central.accuracy"]
    assert a["central.loss"] != c["central.loss"]


def test_fraction_sampling_and_dirichlet(inline_cfg):
    summary = run_inline(
        inline_cfg(
            "quickstart",
            "clients.num=20",
            "clients.fraction=0.25",
            "rounds=2",
            "clients.partitioner=dirichlet",
            "clients.alpha=0.3",
        )  # fmt: skip
    )
    assert summary["metrics"]["central.accuracy"] > 0.7


def _strip_timing(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith("time.")}


def _sampled_as_configured(summary: dict, num: int, fraction: float, min_clients: int) -> None:
    """Flower's rule: max(int(fraction * N), min_clients) nodes per round, distinct partitions."""
    expected = max(int(fraction * num), min(min_clients, num))
    per_round = summary["train_partitions"]
    assert len(per_round) == summary["rounds"]
    for partitions in per_round:
        assert len(partitions) == len(set(partitions)) == expected, per_round
        assert all(0 <= p < num for p in partitions), per_round


def test_sampling_is_by_partition_on_every_engine(inline_cfg, monkeypatch):
    """Same seed, clients.fraction=0.3 of 10: every engine trains ceil(0.3 * 10) = 3 clients per
    round, and inline (node ids 1000..1009) and a simulation run (fresh random 64-bit node ids on
    Ray) sample the same partitions, so their metrics are equal. (One simulation run: a second
    one, which the test ran before, only drew other random node ids.)"""
    from flowerbed.server.engines.simulation import run_simulation
    from flowerbed.server.results import default_run_dir

    cfg = inline_cfg(
        "quickstart", "rounds=2", "clients.num=10", "clients.fraction=0.3", "dataset.max_rows=2000"
    )
    inline = run_inline(cfg)
    assert (Path(inline["run_dir"]) / "model.npz").is_file()
    _sampled_as_configured(inline, 10, 0.3, 2)
    assert inline["train_partitions"][0] != inline["train_partitions"][1]  # re-sampled per round
    cfg = replace(cfg, engine=Engine.simulation)
    tag = uuid.uuid4().hex  # inherited by every process the engine starts
    monkeypatch.setenv("FLOWERBED_TEST_TAG", tag)
    runs = [run_simulation(cfg, default_run_dir(cfg))]
    for simulated in runs:
        assert simulated["train_partitions"] == inline["train_partitions"]
        assert _strip_timing(simulated["metrics"]) == pytest.approx(
            _strip_timing(inline["metrics"]), abs=1e-6
        )
    leftovers = []
    for proc in psutil.process_iter(["pid"]):
        try:
            mine = proc.environ().get("FLOWERBED_TEST_TAG") == tag and proc.pid != os.getpid()
            if mine and proc.status() != "zombie":
                leftovers.append(proc.cmdline()[:2])
        except (psutil.Error, OSError):
            continue
    assert not leftovers, f"the simulation engine left processes running: {leftovers}"


class AskingGrid(Grid):
    """The inline Grid without its partition table: the runner has to ask the nodes."""

    def __init__(self, inner: InlineGrid) -> None:
        self.inner = inner
        self.queries = 0

    def set_run(self, run):  # noqa: ANN001
        self.inner.set_run(run)

    @property
    def run(self):
        return self.inner.run

    def create_message(self, *args, **kwargs):
        return self.inner.create_message(*args, **kwargs)

    def get_node_ids(self):
        return list(reversed(self.inner.get_node_ids()))

    def push_messages(self, messages):
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids):
        return self.inner.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.queries += sum(m.metadata.message_type == "query" for m in messages)
        return self.inner.send_and_receive(messages, timeout=timeout)


def test_nodes_that_must_be_asked_give_the_same_sample(inline_cfg, tmp_path):
    from flowerbed.apps.client_app import app as client_app
    from flowerbed.server.runner import run_experiment

    cfg = inline_cfg(
        "quickstart", "rounds=2", "clients.num=10", "clients.fraction=0.3", "dataset.max_rows=2000"
    )
    native = run_inline(cfg)
    grid = AskingGrid(InlineGrid(client_app, 10))
    asked = run_experiment(grid, cfg, tmp_path / "asked")
    assert grid.queries == 10  # one query per node, once
    assert asked["train_partitions"] == native["train_partitions"]
    assert _strip_timing(asked["metrics"]) == _strip_timing(native["metrics"])


def test_simulation_nodes_map_to_partitions_in_flowers_registration_order(
    monkeypatch, flower_simulation
):
    """Flower's own simulation registration (``vce_api._register_nodes``) on its in-memory link
    state and Grid: the runner reads node i -> partition i from the state's node table, for
    thousands of nodes, without asking any node, and keeps nothing per node in the ServerApp."""
    from flowerbed.server import grid as grid_plumbing

    _, grid, flowers_mapping = flower_simulation(3000)

    def asked(grid, node_ids, timeout=600.0):  # noqa: ANN001
        raise AssertionError(f"{len(node_ids)} nodes were asked")

    monkeypatch.setattr(grid_plumbing, "ask_partitions", asked)
    ordered = grid_plumbing.OrderedGrid(grid, lambda *_: None, by_partition=True)
    node_ids = ordered.get_node_ids()
    assert node_ids == sorted(flowers_mapping, key=flowers_mapping.__getitem__)
    assert ordered.partitions == {}  # read from Flower's node table on each call, not copied
    assert ordered.get_node_ids() == node_ids
    last = node_ids[-1]
    assert ordered.partition_of(last) == flowers_mapping[last] == 2999
