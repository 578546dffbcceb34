"""Capability Protocols: a workload offering a capability without its members is refused when it
registers; code that needs one narrows the workload to its Protocol."""

import pytest

from flowerbed.clients.contracts import (
    PROTOCOLS,
    ModelLossOffer,
    TabularDiffusionOffer,
    check_offers,
    members,
    offer,
)
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.registry import Registry
from flowerbed.clients.workloads import WORKLOADS, ClassifierWorkload, Workload


def probe_registry() -> Registry[Workload]:
    """A registry with the workloads' check, so the probes stay out of ``WORKLOADS``."""
    return Registry("workload", ("flowerbed.clients.workloads",), "flowerbed.probes", check_offers)


def test_a_workload_offering_model_loss_without_its_members_is_refused_at_registration():
    with pytest.raises(ConfigError, match=r"^workload 'no-loss' .* offers model-loss but lacks "
                                          r"model_loss \(ModelLossOffer"):  # fmt: skip

        @probe_registry().register("no-loss", "offers model-loss, has no model_loss()")
        class NoLoss(ClassifierWorkload):  # round data from the base, model_loss missing
            offers = frozenset({Capability.MODEL_LOSS})

    with pytest.raises(ConfigError, match="lacks model, prep, protocol, spec"):

        @probe_registry().register("no-denoiser", "offers tabular-diffusion, has nothing")
        class NoDenoiser(Workload):
            offers = frozenset({Capability.TABULAR_DIFFUSION})


def test_a_workload_with_the_members_registers_and_narrows():
    @probe_registry().register("with-loss", "offers model-loss and has it")
    class WithLoss(ClassifierWorkload):
        offers = frozenset({Capability.MODEL_LOSS})

        def model_loss(self):  # noqa: ANN202
            return "the contract"

    workload = object.__new__(WithLoss)
    assert offer(workload, ModelLossOffer).model_loss() == "the contract"
    with pytest.raises(TypeError, match="does not provide TabularDiffusionOffer"):
        offer(workload, TabularDiffusionOffer)


def test_builtin_workloads_declare_the_members_of_what_they_offer():
    assert members(ModelLossOffer) == ["load_partition", "model_loss", "round_data"]
    assert set(PROTOCOLS) <= set(Capability)
    for name in ("digits-classifier", "filosofer"):  # registration ran the same check
        cls = WORKLOADS.get(name)
        assert {Capability.MODEL_LOSS, Capability.MODEL_RELEASE} & cls.offers
        check_offers(name, cls)
