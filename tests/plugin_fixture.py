"""Two plug-in packages made by ``flowerbed new``, installed into a private directory.

``clip-noise`` (a defense: the update clipped to an L2 norm, then Gaussian noise) is the scaffold
with its ``transform`` written; ``label-prior`` (an attack) is the attack scaffold as it comes: it
answers with its prior. They are built once per session with ``pip install --target`` (offline, no
build isolation: the project's setuptools) and put on ``PYTHONPATH`` of the processes under test.
``run_metrics`` is ``flowerbed run quickstart`` with both (tests/apps/test_plugins.py, and on the
TLS federation of tests/server/test_deploy.py, which ``flowerbed deploy up`` starts with them).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flowerbed.apps.scaffold import new_package

FLOWERBED = str(Path(sys.executable).parent / "flowerbed")
#: a quickstart run that uses both packages: the attack scores, the defense transforms updates
RUN = [
    "rounds=1", "clients.num=2", "dataset.max_rows=600", "attack.name=label-prior",
    "defenses=[{name: clip-noise, params: {clip: 0.5, noise: 0.01}}]", "output.plots=false",
]  # fmt: skip

CLIP_NOISE = '''
    def transform(self, sent: ArrayRecord, trained: ArrayRecord, config: RoundConfig) -> ArrayRecord:
        """The update clipped to L2 norm ``clip``, plus N(0, (noise * clip)^2) per entry."""
        import numpy as np
        from flwr.app import Array

        from flowerbed.clients.core.seeding import client_seed

        seed = client_seed(self.ctx.seed, int(config["partition-id"]),
                           int(config.get("server-round", 0)), salt=5)
        rng = np.random.default_rng(seed)
        delta = {k: trained[k].numpy().astype(np.float64) - sent[k].numpy() for k in trained}
        norm = float(np.sqrt(sum((d**2).sum() for d in delta.values())))
        scale = min(1.0, self.params.clip / max(norm, 1e-12))
        sigma = self.params.noise * self.params.clip
        return ArrayRecord({
            k: Array((sent[k].numpy() + d * scale + rng.normal(0.0, sigma, d.shape))
                     .astype(trained[k].numpy().dtype))
            for k, d in delta.items()
        })
'''
SKELETON = '''
    def transform(self, sent: ArrayRecord, trained: ArrayRecord, config: RoundConfig) -> ArrayRecord:
        """What the server receives instead of ``trained`` (``config["partition-id"]`` and
        ``config["server-round"]`` seed per-client randomness).

        TODO: the method. The skeleton is the identity, so the claim test fails.
        """
        return trained
'''


@dataclass(frozen=True)
class PluginSite:
    site: Path  # holds both packages and their dist-info (entry points)
    defense_src: Path
    attack_src: Path

    def env(self) -> dict[str, str]:
        """This process's environment with the packages on PYTHONPATH."""
        path = os.pathsep.join(p for p in (str(self.site), os.environ.get("PYTHONPATH")) if p)
        return {**os.environ, "PYTHONPATH": path}


def build(root: Path) -> PluginSite:
    defense = new_package("defense", "clip-noise", root / "clip-noise")
    module = defense / "src" / "flowerbed_clip_noise" / "clip_noise.py"
    text = module.read_text()
    assert SKELETON in text, "the defense scaffold changed: update tests/plugin_fixture.py"
    module.write_text(text.replace(SKELETON, CLIP_NOISE))
    attack = new_package("attack", "label-prior", root / "label-prior")
    site = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--target", str(site), str(defense),
         str(attack)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return PluginSite(site, defense, attack)


def cli(site: PluginSite, *args: str, cwd: Path | None = None, timeout: float = 300):
    """``flowerbed ARGS`` in a process that has the packages installed."""
    return subprocess.run(
        [FLOWERBED, *args], env={**site.env(), "COLUMNS": "250"}, capture_output=True,
        text=True, timeout=timeout, cwd=cwd,
    )  # fmt: skip


def run_metrics(site: PluginSite, out: Path, *args: str) -> dict:
    """The metrics (no timings) of ``flowerbed run quickstart`` with :data:`RUN` and ``args``."""
    done = cli(site, "run", "quickstart", *RUN, *args, "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    return {k: v for k, v in summary["metrics"].items() if not k.startswith("time.")}


@contextlib.contextmanager
def on_path(site: PluginSite) -> Iterator[None]:
    """The packages importable in this process for the block; the registries, ``sys.path`` and
    ``sys.modules`` are restored afterwards, so later tests see flowerbed's own entries only."""
    from flowerbed.server.experiment import COMPONENTS

    registries = [COMPONENTS.workloads, COMPONENTS.datasets, COMPONENTS.strategies,
                  COMPONENTS.attacks, COMPONENTS.defenses]  # fmt: skip
    for registry in registries:  # flowerbed's own modules registered before the snapshot (a
        registry.names()  # module first imported in the block would not register again)
    saved = [(dict(r._entries), dict(r._origins), set(r._loaded_points)) for r in registries]
    modules = set(sys.modules)
    sys.path.insert(0, str(site.site))
    try:
        yield
    finally:
        sys.path.remove(str(site.site))
        for name in set(sys.modules) - modules:
            if name.startswith(
                ("flowerbed_clip_noise", "flowerbed_label_prior", "flowerbed_plugin_")
            ):
                del sys.modules[name]
        for registry, (entries, origins, points) in zip(registries, saved, strict=True):
            registry._entries, registry._origins, registry._loaded_points = entries, origins, points
        from flowerbed.clients.core import plugins

        plugins._loaded.clear()
