"""Shared fixtures: quiet Flower logs, a tmp output dir, single-threaded torch; how the suite's
files are spread over the xdist workers (pyproject's ``-n 3``)."""

import logging

import pytest
import torch

torch.set_num_threads(1)
logging.getLogger("flwr").setLevel(logging.WARNING)

#: files that share one session fixture run on one worker (none at present: the two-node Ray
#: cluster is tests/server/test_ray_run.py's alone, so it and test_ray_sweep.py's local Ray run
#: on two workers side by side)
SHARED: dict[str, str] = {}
#: the longest groups (federations, Ray, plug-ins on every engine) are handed out first, so that
#: no worker starts one of them while the other has nothing left
LONGEST_FIRST = (
    "tests/server/test_deploy.py",
    "tests/server/test_ray_run.py",
    "tests/apps/test_plugins.py",
    "tests/server/test_ray_sweep.py",
    "tests/clients/test_dsm.py",
    "tests/server/test_engines.py",
    "tests/attacks/test_adaptive.py",
    "tests/clients/test_fcm.py",
)


def group_of(nodeid: str) -> str:
    """The xdist work unit of a test: its file, or the group of files sharing a fixture."""
    name = nodeid.split("::", 1)[0]
    return SHARED.get(name, name)


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with :func:`group_of` as the scope (its own ``loadgroup`` writes
    the group into ``item._nodeid``, which pytest 9 no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return FileGroups(config, log)


def pytest_collection_modifyitems(config, items):
    """The longest groups first (xdist hands the work units out in this order: pyproject's
    ``--no-loadscope-reorder``); the order of tests inside a file is kept."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))


@pytest.fixture
def inline_cfg(tmp_path):
    """Resolve a preset for the inline engine with output under tmp_path (no curves.png unless
    ``output.plots=true`` is asked for: tests read metrics, tests/apps/test_cli.py the plot)."""
    from flowerbed.server.experiment import load_experiment

    def make(name: str, *overrides: str) -> dict:
        base = ["engine=inline", f"output.dir={tmp_path}", "output.plots=false"]
        return load_experiment(name, [*base, *overrides])

    return make


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory):
    """Plug-in packages made by ``flowerbed new`` and installed into a private directory
    (tests/plugin_fixture.py), built once for every test that runs them."""
    from tests.plugin_fixture import build

    return build(tmp_path_factory.mktemp("plugins"))
