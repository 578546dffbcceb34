"""Every registration lives in a module named after it (or in a package of that name)."""

from __future__ import annotations

from flowerbed.server.experiment import COMPONENTS

KINDS = ("workloads", "datasets", "strategies", "attacks", "defenses")

#: registrations still in a module not named after them: code other branches are changing now
#: (attacks/baselines.py and attacks/adaptive/ with the one attack shape, issue #37 part 4;
#: clients/workloads/routing.py with its split). Each one fixed must leave this list.
PENDING = {
    ("attacks", "analytic-fc"): "flowerbed.attacks.baselines",
    ("attacks", "dlg"): "flowerbed.attacks.baselines",
    ("attacks", "idlg"): "flowerbed.attacks.baselines",
    ("attacks", "inverting-gradients"): "flowerbed.attacks.baselines",
    ("attacks", "random-baseline"): "flowerbed.attacks.baselines",
    ("attacks", "tableak"): "flowerbed.attacks.baselines",
    ("workloads", "routing-mlp"): "flowerbed.clients.workloads.routing",
    ("workloads", "routing-kmeans"): "flowerbed.clients.workloads.routing",
}


def registrations() -> list[tuple[str, str, str]]:
    """(kind, name, module) of every registration flowerbed itself makes."""
    out = []
    for kind in KINDS:
        registry = getattr(COMPONENTS, kind)
        for name, cls in registry.items():
            if registry.is_builtin(name):  # not the test helpers registered at collection
                out.append((kind, name, cls.__module__))
    return out


def named_after(name: str, module: str) -> bool:
    """``fed-kmeans`` in ``...strategies.fed_kmeans``, ``goliath`` in the package ``...goliath``."""
    return module.rsplit(".", 1)[-1] == name.replace("-", "_")


def test_every_registration_is_in_a_module_named_after_it() -> None:
    found = registrations()
    assert len(found) > 50  # every kind discovered
    wrong = {(kind, name): module for kind, name, module in found if not named_after(name, module)}
    assert wrong == PENDING, "registrations in a module not named after them (or fixed: remove)"
    print(f"registrations in a module not named after them: {len(wrong)} of {len(found)}")


def test_no_module_holds_two_registrations() -> None:
    by_module: dict[str, list[str]] = {}
    for kind, name, module in registrations():
        if (kind, name) not in PENDING:
            by_module.setdefault(module, []).append(name)
    assert {m: n for m, n in by_module.items() if len(n) > 1} == {}


def test_a_lookup_by_name_imports_only_that_module() -> None:
    """A ClientApp for one method imports that method's module, not its neighbours'."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from flowerbed.strategies import STRATEGIES\n"
        "from flowerbed.clients.defenses import DEFENSES\n"
        "STRATEGIES.get('fedprox'); DEFENSES.get('topk')\n"
        "mods = sorted(m for m in sys.modules if m.startswith(('flowerbed.strategies.',"
        " 'flowerbed.clients.defenses.')))\n"
        "print(' '.join(mods))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    mods = done.stdout.split()
    assert "flowerbed.strategies.fedprox" in mods and "flowerbed.clients.defenses.topk" in mods
    for neighbour in ("fedadam", "fedavgm", "fed_kmeans", "fcm"):
        assert f"flowerbed.strategies.{neighbour}" not in mods
    assert "flowerbed.clients.defenses.quantize" not in mods
