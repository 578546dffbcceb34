"""One installable package: the wheel holds `flowerbed` only, with every subpackage and the presets."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"apps", "server", "strategies", "attacks", "clients", "configs"}


def _declared() -> set[str]:
    return set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )


def test_every_package_in_the_tree_is_declared():
    found = set()
    for top in MAPPED:
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT).parts
            found.add(".".join(("flowerbed", *rel)))
    assert found <= _declared(), f"add to [tool.setuptools] packages: {sorted(found - _declared())}"


def test_wheel_installs_one_top_level_package_with_presets_and_data(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    wheel = zipfile.ZipFile(next(tmp_path.glob("flowerbed-*.whl")))
    names = wheel.namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {
        "flowerbed"
    }
    presets = {Path(n).stem for n in names if n.startswith("flowerbed/configs/experiments/")}
    assert presets == {p.stem for p in (ROOT / "configs" / "experiments").glob("*.yaml")}
    assert "flowerbed/clients/datasets/data/adult.data.gz" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "flowerbed = flowerbed.apps.cli:main" in wheel.read(entry).decode()


def test_readme_preset_table_is_generated_from_the_presets():
    from flowerbed.apps.listing import preset_table

    readme = (ROOT / "README.md").read_text()
    start, end = "<!-- presets:start -->\n", "<!-- presets:end -->"
    block = readme[readme.index(start) + len(start) : readme.index(end)]
    assert block.strip() == preset_table().strip(), (
        "README preset table is stale: paste `flowerbed list experiments --markdown`"
    )
