"""The workload contract: what a workload receives (its Params and a WorkloadContext) and its
device, from the assigned resources to where the tensors live."""

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from flwr.app import RecordDict
from torch.utils.data import DataLoader, TensorDataset

from flowerbed.clients.core.config import Experiment
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.workloads import (
    WORKLOADS,
    ShuffledBatches,
    WorkloadContext,
    assigned_device,
    build_workload,
)
from flowerbed.server.engines.simulation import federation_config
from flowerbed.server.experiment import load_experiment

SMALL = {
    "quickstart": ["dataset.max_rows=400", "clients.num=2"],
    "tabdiff-adult-mixed": [
        "dataset.max_rows=400", "clients.num=2", "workload.params.hidden=16",
        "workload.params.max_steps=1", "workload.params.batch_size=16",
    ],
}  # fmt: skip


def _cfg(name: str, *extra: str) -> Experiment:
    return load_experiment(name, ["engine=inline", *SMALL[name], *extra])


def test_no_gpu_assigned_means_cpu():
    assert assigned_device(_cfg("quickstart")) == "cpu"


def test_an_assigned_gpu_without_cuda_is_one_line_naming_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"clients.resources.gpus=0.5 assigns a GPU") as err:
        assigned_device(_cfg("quickstart", "clients.resources.gpus=0.5"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_assigned_gpu_gives_the_workload_cuda(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = _cfg(name, "clients.resources.gpus=1")
    assert build_workload(cfg).device == "cuda"


@pytest.mark.parametrize("name", sorted(SMALL))
def test_fit_computes_on_the_workload_device(name):
    """On a CPU machine: a workload told to use the ``meta`` device fails on its first value
    read, which shows its tensors went where ``device`` says (on ``cpu`` it trains)."""
    cfg = _cfg(name)
    workload = build_workload(cfg)
    arrays, data = workload.init_arrays(), workload.load_partition(0, 2)
    config = {"partition-id": 0, "server-round": 1}
    trained, metrics = workload.fit(arrays, data, config, RecordDict())
    assert metrics["num-examples"] > 0
    assert all(a.numpy().dtype.kind == "f" for a in trained.values())  # CPU arrays travel
    workload.device = "meta"
    with pytest.raises(RuntimeError, match="meta"):
        workload.fit(arrays, data, config, RecordDict())


def test_clients_resources_map_to_flowers_client_resources():
    cfg = _cfg("quickstart", "clients.resources.cpus=2", "clients.resources.gpus=0.25")
    assert federation_config(cfg.clients) == (
        "num-supernodes=2 client-resources-num-cpus=2 client-resources-num-gpus=0.25"
    )


def test_clients_cpus_moved_with_a_clear_error():
    with pytest.raises(ConfigError, match=r"clients.cpus moved to clients.resources.cpus"):
        _cfg("quickstart", "clients.cpus=2")
    with pytest.raises(ConfigError, match=r"clients.resources.gpus must be >= 0"):
        _cfg("quickstart", "clients.resources.gpus=-1")


# -- what a workload receives: its Params and a WorkloadContext, never the experiment config ----
WORKLOADS_DIR = Path(__file__).resolve().parents[2] / "clients" / "workloads"
#: functions of clients/workloads/__init__.py that turn a config into a workload's inputs
CONTEXT_BUILDERS = {"assigned_device", "of", "build_workload"}


def _config_reads(path: Path) -> list[int]:
    """Lines of ``path`` that read an experiment config: ``cfg[...]``, ``cfg.get(...)`` or an
    attribute ``.cfg`` (``self.cfg``); in the package's ``__init__.py``, outside the functions
    that build a workload's inputs."""
    tree = ast.parse(path.read_text())
    allowed: list[range] = []
    if path == WORKLOADS_DIR / "__init__.py":
        allowed = [
            range(node.lineno, node.end_lineno + 1)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name in CONTEXT_BUILDERS
        ]
    lines = []
    for node in ast.walk(tree):
        named_cfg = isinstance(getattr(node, "value", None), ast.Name) and node.value.id == "cfg"
        if (
            (isinstance(node, ast.Attribute) and node.attr == "cfg")
            or (isinstance(node, ast.Subscript) and named_cfg)
            or (isinstance(node, ast.Attribute) and node.attr == "get" and named_cfg)
        ) and not any(node.lineno in r for r in allowed):
            lines.append(node.lineno)
    return lines


def test_no_workload_reads_the_experiment_config():
    """Every module of clients/workloads gets the run through ``self.ctx`` and its settings
    through ``self.params``; only ``WorkloadContext.of`` / ``build_workload`` see the config."""
    modules = sorted(WORKLOADS_DIR.rglob("*.py"))
    assert len(modules) >= len(WORKLOADS.names())
    readers = {
        str(p.relative_to(WORKLOADS_DIR)): lines for p in modules if (lines := _config_reads(p))
    }
    assert readers == {}, readers


def test_a_workload_refuses_the_experiment_config():
    cfg = _cfg("quickstart")
    cls = WORKLOADS.get("tabular-mlp")
    with pytest.raises(TypeError, match="takes its Params and a WorkloadContext, not Experiment"):
        cls(cfg.workload.params, cfg)
    with pytest.raises(TypeError):
        cls(cfg)  # the former constructor
    fields = dataclasses.asdict(cfg.workload.params)
    workload = cls(fields, WorkloadContext.of(cfg))  # a mapping is validated
    assert isinstance(workload.params, cls.Params) and workload.params.hidden == [64, 32]
    assert not hasattr(workload, "cfg")


def test_workload_context_of_a_config():
    cfg = _cfg(
        "quickstart", "seed=3", "rounds=4", "clients.num=5", "clients.partitioner=dirichlet",
        "clients.alpha=0.7", "defenses=[{name: topk, params: {fraction: 0.2}}]",
    )  # fmt: skip
    ctx = WorkloadContext.of(cfg)
    assert (ctx.seed, ctx.rounds, ctx.num_clients, ctx.device) == (3, 4, 5, "cpu")
    assert (ctx.partitioner, ctx.alpha, ctx.partition_by) == ("dirichlet", 0.7, None)
    assert [type(d).__name__ for d in ctx.defenses] == ["TopK"]
    assert ctx.defenses[0].params.fraction == 0.2 and ctx.defenses[0].ctx.num_clients == 5
    assert ctx.dataset == cfg.dataset and ctx.dataset.max_rows == 400
    assert json.loads(ctx.dataset_json) == dataclasses.asdict(cfg.dataset)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.dataset.max_rows = 1  # type: ignore[misc]  # read-only
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.seed = 4
    workload = build_workload(cfg)
    assert workload.ctx.seed == 3 and workload.defenses == list(workload.ctx.defenses)
    # a shared setting the workload does not declare in ``reads`` is withheld
    fcm = WorkloadContext.of(load_experiment("fcm-trig-evolving", ["engine=inline", "seed=2"]))
    assert (fcm.seed, fcm.num_clients) == (2, 5)
    assert (fcm.partitioner, fcm.alpha, fcm.partition_by, fcm.dataset) == (None,) * 4
    with pytest.raises(ConfigError, match="does not declare 'dataset'"):
        fcm.dataset_json  # noqa: B018


@pytest.mark.parametrize(
    ("n", "batch", "epochs"), [(100, 64, 1), (128, 64, 3), (7, 64, 2), (5, 1, 2)]
)
def test_shuffled_batches_are_the_data_loaders_bit_for_bit(n, batch, epochs):
    """fit_classifier's batches without a training defense: DataLoader's, and its generator is
    left where DataLoader leaves it (later passes and epochs draw the same)."""
    x, y = torch.randn(n, 3, dtype=torch.float64), torch.randint(0, 2, (n,))
    ours = ShuffledBatches(x, y, batch, torch.Generator().manual_seed(5))
    theirs = DataLoader(
        TensorDataset(x, y), batch_size=batch, shuffle=True,
        generator=torch.Generator().manual_seed(5),
    )  # fmt: skip
    for _ in range(epochs):
        a, b = list(ours), list(theirs)
        assert len(a) == len(b) == len(ours)
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb) and xa.dtype == xb.dtype
    assert torch.equal(ours.generator.get_state(), theirs.generator.get_state())
