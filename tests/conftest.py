"""Shared fixtures: quiet Flower logs, a tmp output dir, single-threaded torch."""

import logging

import pytest
import torch

torch.set_num_threads(1)
logging.getLogger("flwr").setLevel(logging.WARNING)


@pytest.fixture
def inline_cfg(tmp_path):
    """Resolve a preset for the inline engine with output under tmp_path."""
    from flowerbed.server.experiment import load_experiment

    def make(name: str, *overrides: str) -> dict:
        return load_experiment(name, ["engine=inline", f"output.dir={tmp_path}", *overrides])

    return make


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory):
    """Plug-in packages made by ``flowerbed new`` and installed into a private directory
    (tests/plugin_fixture.py), built once for every test that runs them."""
    from tests.plugin_fixture import build

    return build(tmp_path_factory.mktemp("plugins"))
