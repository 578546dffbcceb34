"""The attack's model view is a table keyed by capability, read through the capability's Protocol."""

from flowerbed.attacks.common import ModelLossReplay
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.defenses import DefenseContext
from flowerbed.clients.defenses.filosofer import ModelRelease
from flowerbed.clients.workloads import build_workload
from flowerbed.server.experiment import load_experiment
from flowerbed.server.model_views import MODEL_VIEWS, model_view


def test_each_capability_gives_its_view_and_a_release_defense_its_deployment(tmp_path):
    cfg = load_experiment("quickstart", ["clients.num=2", "dataset.max_rows=300", f"output.dir={tmp_path}"])  # fmt: skip
    workload = build_workload(cfg)
    assert list(MODEL_VIEWS) == [Capability.TABULAR_DIFFUSION, Capability.MODEL_LOSS,
                                 Capability.MODEL_RELEASE]  # fmt: skip
    view = model_view({Capability.MODEL_LOSS, Capability.PRIVATE_TRAINING}, workload, [])
    assert isinstance(view["replay"], ModelLossReplay) and set(view) == {"replay"}
    assert view["replay"].contract.schema.shape == workload.model_loss().schema.shape
    assert model_view({Capability.PRIVATE_TRAINING}, workload, []) == {}
    release = ModelRelease({}, DefenseContext(0, 1, 2, 2, "t"))
    assert MODEL_VIEWS[Capability.MODEL_RELEASE].__name__ == "_release"
    filosofer = build_workload(load_experiment("filosofer", [f"output.dir={tmp_path}"]))
    view = model_view({Capability.MODEL_RELEASE}, filosofer, [release])
    assert view["deploy"] == release.release and view["release"].hidden == filosofer.params.hidden
