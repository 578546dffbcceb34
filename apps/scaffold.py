"""``flowerbed new workload|attack|defense|strategy NAME``: a small installable plug-in package.

The package registers one component through an entry point (``flowerbed.<kind>s``), so once it is
installed (``pip install -e .``) every flowerbed process finds it: the CLI, the ServerApp, every
ClientApp, Ray workers. It holds the module (typed ``Params``, ``offers``/``needs``), a claim test
that fails until the method does what it claims (the skeleton is the method's ablation: identity,
prior, no learning, FedAvg), and a README. docs/contributing.md walks through it.
"""

from __future__ import annotations

import re
from pathlib import Path

from flowerbed.apps.scaffold_templates import RUN_LINES, TEMPLATES
from flowerbed.clients.core.errors import ConfigError

KINDS = {"workload": "workloads", "attack": "attacks", "defense": "defenses",
         "strategy": "strategies"}  # fmt: skip
_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")

PYPROJECT = """\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "{kind} '{name}' for flowerbed"
requires-python = ">=3.11"
dependencies = ["flowerbed"]

# flowerbed finds the {kind} through this entry point: NAME = "module:Class"
[project.entry-points."flowerbed.{group}"]
{name} = "{package}.{module}:{cls}"

[tool.setuptools.packages.find]
where = ["src"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

README = """\
# {dist}: the flowerbed {kind} `{name}`

A flowerbed plug-in: `src/{package}/{module}.py` registers the {kind} `{name}`; the entry point
in `pyproject.toml` (`flowerbed.{group}`) lets every flowerbed process find it once the package
is installed.

```bash
pip install -e .                  # into the environment flowerbed runs in
flowerbed list {group}            # {name} ... from: {dist} 0.1.0 (entry point)
pytest                            # the claim test: fails until the method works
{run_line}
```

Without installing: name the module in a config, `plugins: [{package}.{module}]` (on
`PYTHONPATH`), or the file, `plugins: [./src/{package}/{module}.py]`.

What to do: {todo}

The claim test (`tests/test_{module}.py`) runs the method end to end on a tiny case and compares
it with its ablation; keep it failing on the skeleton and passing on the method, over >= 3 seeds.
Then break the mechanism by hand (a constant, a no-op) and see the test fail.
"""

INIT = '"""The flowerbed {kind} `{name}` (registered in `{module}.py`)."""\n'


def names(kind: str, name: str) -> dict[str, str]:
    """The names a package for ``name`` uses (distribution, import package, module, class)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown kind '{kind}' (allowed: {', '.join(KINDS)}, experiment)")
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"name '{name}' is not allowed: lower-case letters and digits, words joined by '-' "
            "(e.g. clip-noise)"
        )
    module = name.replace("-", "_")
    cls = "".join(part.capitalize() for part in name.split("-"))
    return {"kind": kind, "name": name, "group": KINDS[kind], "module": module, "cls": cls,
            "package": f"flowerbed_{module}", "dist": f"flowerbed-{name}"}  # fmt: skip


def _taken(kind: str, name: str) -> str | None:
    """Where ``name`` is registered already for ``kind`` (flowerbed, an installed package)."""
    from flowerbed.server.experiment import COMPONENTS

    registry = getattr(COMPONENTS, KINDS[kind])
    try:
        registry.get(name)
    except ConfigError:
        return None
    return registry.origin(name)


def new_package(kind: str, name: str, directory: Path | None = None) -> Path:
    """Write the package for ``kind`` ``name`` into ``directory`` (default ``./flowerbed-NAME``).

    Refuses a directory that exists and is not empty (nothing is overwritten).
    """
    values = names(kind, name)
    taken_by = _taken(kind, name)
    if taken_by is not None:
        raise ConfigError(
            f"{kind} '{name}' is already registered by {taken_by} (choose another name; "
            f"taken: flowerbed list {KINDS[kind]})"
        )
    root = (directory or Path(values["dist"])).resolve()
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ConfigError(f"{root} exists and is not empty (choose another --dir)")
    module_text, test_text, todo = TEMPLATES[kind]
    values["todo"] = todo
    values["run_line"] = RUN_LINES[kind].format(**values)
    files = {
        "pyproject.toml": PYPROJECT.format(**values),
        "README.md": README.format(**values),
        f"src/{values['package']}/__init__.py": INIT.format(**values),
        f"src/{values['package']}/{values['module']}.py": module_text.format(**values),
        f"tests/test_{values['module']}.py": test_text.format(**values),
    }
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def new_experiment(name: str, preset: str = "quickstart", directory: Path | None = None) -> Path:
    """Write ``NAME.yaml``: the preset's config (its ``claim`` section left out) with a header
    saying how to run and change it. Refuses to overwrite a file."""
    from flowerbed.clients.core.config import configs_dir, load_preset

    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"name '{name}' is not allowed: lower-case letters and digits, words joined by '-' "
            "(e.g. my-experiment)"
        )
    load_preset(preset)  # an unknown preset is one line naming the allowed ones
    path = ((directory or Path.cwd()) / f"{name}.yaml").resolve()
    if path.exists():
        raise ConfigError(f"{path} exists (choose another name or --dir)")
    lines = (configs_dir() / "experiments" / f"{preset}.yaml").read_text().splitlines()
    cut = next((i for i, line in enumerate(lines) if line.startswith("claim:")), len(lines))
    body = "\n".join(line for line in lines[:cut] if not line.startswith("description:"))
    header = (
        f"# {name}: a copy of the preset '{preset}'. Run it: flowerbed run {path.name}\n"
        "# Every key not written here takes its default; the smallest experiment is two lines,\n"
        "# e.g. `rounds: 2` and `clients: {num: 4}` (the quickstart MLP on UCI Adult).\n"
        f'description: "{name} (from {preset})"\n'
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + body.rstrip() + "\n")
    return path
