"""Every preset's headline (its YAML's ``claim``) holds: ``metric`` lands ``above`` or ``below``
its bound (a metric of the same run, a number, or ``{metric, overrides}``: the metric of the same
preset run with those overrides, an ablation arm), shifted by ``margin``. Checked by an inline run
at the claim's small ``overrides``, or covered by the named claim ``test`` (the method's claim
test, which asserts the same side at its own small settings). ``page`` is the method page that
names the preset and the metric; a ``hard`` claim (one that does not hold at the preset's own
settings) is documented there as a hard setting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flowerbed.apps.inline import run_inline
from flowerbed.clients.core.config import load_preset, preset_names
from flowerbed.server.experiment import load_experiment

ROOT = Path(__file__).resolve().parents[1]
CLAIMED = preset_names()


def _side(claim: dict) -> tuple[str, object]:
    sides = [s for s in ("above", "below") if claim.get(s) not in (None, "")]
    assert len(sides) == 1, f"claim needs exactly one of above/below: {claim}"
    return sides[0], claim[sides[0]]


def _run(preset: str, overrides: list[str], tmp_path: Path) -> dict[str, float]:
    cfg = load_experiment(preset, ["engine=inline", "output.plots=false",
                                   f"output.dir={tmp_path}", *overrides])  # fmt: skip
    return run_inline(cfg)["metrics"]


def _bound(preset: str, claim: dict, metrics: dict[str, float], tmp_path: Path) -> float:
    _, bound = _side(claim)
    if isinstance(bound, dict):  # the ablation arm: same preset, its overrides on top
        arm = _run(preset, [*claim["overrides"], *bound["overrides"]], tmp_path / "arm")
        value = arm[bound.get("metric", claim["metric"])]
    else:
        value = metrics[str(bound)] if str(bound) in metrics else float(bound)
    return value + float(claim.get("margin") or 0.0)


@pytest.mark.parametrize("preset", CLAIMED)
def test_every_preset_names_its_claim(preset: str) -> None:
    claim = load_preset(preset).get("claim") or {}
    assert claim.get("metric"), f"{preset}: no claim.metric"
    side, bound = _side(claim)
    if isinstance(bound, dict):
        assert bound.get("overrides"), f"{preset}: an ablation bound needs overrides"
    else:
        assert str(bound) != "", preset
    assert claim.get("overrides") or claim.get("test"), f"{preset}: neither overrides nor test"
    # the method page names the preset and the metric that shows its claim
    page = (ROOT / claim.get("page", "")).read_text() if claim.get("page") else ""
    assert f"`{preset}`" in page and claim["metric"] in page, f"{preset}: {claim.get('page')}"
    if claim.get("hard"):  # the headline does not hold here: the page says so, nothing runs
        lines = [x for x in page.splitlines() if f"`{preset}`" in x and "hard setting" in x]
        assert lines and not claim.get("overrides"), (
            f"{preset}: {claim['page']} says no hard setting"
        )
    if claim.get("test"):  # the claim test exists where the preset says
        path, _, name = claim["test"].partition("::")
        name = re.sub(r"\[.*\]$", "", name)
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), claim["test"]


@pytest.mark.parametrize(
    "preset", [p for p in CLAIMED if (load_preset(p).get("claim") or {}).get("overrides")]
)
def test_preset_headline_lands_on_its_side(preset: str, tmp_path: Path) -> None:
    claim = load_preset(preset)["claim"]
    metrics = _run(preset, claim["overrides"], tmp_path)
    value, bound = metrics[claim["metric"]], _bound(preset, claim, metrics, tmp_path)
    side, _ = _side(claim)
    assert (value > bound) if side == "above" else (value < bound), (preset, claim, value, bound)
