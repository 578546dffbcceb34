"""Every preset's headline (its YAML's ``claim``: metric, the side it must land on) holds: run on
the inline engine at the claim's small ``overrides``, or covered by the named claim test (which
runs the method at its own small settings and asserts the same side)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flowerbed.apps.inline import run_inline
from flowerbed.clients.core.config import load_preset, preset_names
from flowerbed.server.experiment import load_experiment

ROOT = Path(__file__).resolve().parents[1]
#: presets whose claim is not written yet (a new preset must name its claim)
PENDING = {
    "acc-pp", "acv-graph", "arao", "chamfer", "concept-safety", "dsm", "fairtune",
    "fcm-dag6-schedule", "fcm-digits-evolving", "fcm-dot-partial", "fcm-trig-evolving",
    "filosofer", "fisher-memorisation", "fits", "flowleak", "fourier-contours", "gem",
    "goliath-adult-gaussian", "goliath-adult-mixed", "inversion-digits", "sensory-gating",
    "tabdiff-adult-gaussian", "tabdiff-adult-mixed", "tabdiff-german-mixed",
    "triangular-inversion", "two-rdm",
}  # fmt: skip
CLAIMED = [name for name in preset_names() if name not in PENDING]


def _bound(claim: dict, metrics: dict[str, float]) -> float:
    above = str(claim["above"])
    return metrics[above] if above in metrics else float(above)


def test_every_preset_names_its_claim() -> None:
    assert CLAIMED, "no preset declares a claim"
    for name in CLAIMED:
        claim = load_preset(name).get("claim") or {}
        assert claim.get("metric") and str(claim.get("above", "")) != "", name
        assert claim.get("overrides") or claim.get("test"), f"{name}: neither overrides nor test"
    assert not PENDING - set(preset_names()), PENDING - set(preset_names())


@pytest.mark.parametrize("preset", CLAIMED)
def test_preset_headline_lands_on_its_side(preset: str, tmp_path: Path) -> None:
    claim = load_preset(preset)["claim"]
    if claim.get("test"):  # the claim test exists where the preset says
        path, _, name = claim["test"].partition("::")
        name = re.sub(r"\[.*\]$", "", name)
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), claim["test"]
    if not claim.get("overrides"):
        return
    cfg = load_experiment(preset, ["engine=inline", "output.plots=false",
                                   f"output.dir={tmp_path}", *claim["overrides"]])  # fmt: skip
    metrics = run_inline(cfg)["metrics"]
    assert metrics[claim["metric"]] > _bound(claim, metrics), (claim, metrics)
