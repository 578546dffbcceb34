"""The workload contract's device: from the assigned resources to where the tensors live."""

import pytest
import torch
from flwr.app import RecordDict

from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.workloads import assigned_device, build_workload
from flowerbed.server.engines.simulation import federation_config
from flowerbed.server.experiment import load_experiment

SMALL = {
    "quickstart": ["dataset.max_rows=400", "clients.num=2"],
    "tabdiff-adult-mixed": [
        "dataset.max_rows=400", "clients.num=2", "workload.params.hidden=16",
        "workload.params.max_steps=1", "workload.params.batch_size=16",
    ],
}  # fmt: skip


def _cfg(name: str, *extra: str) -> dict:
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
    assert federation_config(cfg["clients"]) == (
        "num-supernodes=2 client-resources-num-cpus=2 client-resources-num-gpus=0.25"
    )


def test_clients_cpus_moved_with_a_clear_error():
    with pytest.raises(ConfigError, match=r"clients.cpus moved to clients.resources.cpus"):
        _cfg("quickstart", "clients.cpus=2")
    with pytest.raises(ConfigError, match=r"clients.resources.gpus must be >= 0"):
        _cfg("quickstart", "clients.resources.gpus=-1")
