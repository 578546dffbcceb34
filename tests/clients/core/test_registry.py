"""Every registration lives in a module named after it (or in a package of that name)."""

from __future__ import annotations

from flowerbed.server.experiment import COMPONENTS

KINDS = ("workloads", "datasets", "strategies", "attacks", "defenses", "malicious")

#: registrations in a module not named after them (none left: each method has its module)
PENDING: dict[tuple[str, str], str] = {}


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


def _imported_after(lookups: str) -> list[str]:
    """The flowerbed modules a fresh interpreter holds after running ``lookups``."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from flowerbed.attacks import ATTACKS\n"
        "from flowerbed.clients.defenses import DEFENSES\n"
        "from flowerbed.clients.workloads import WORKLOADS\n"
        "from flowerbed.strategies import STRATEGIES\n"
        f"{lookups}\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('flowerbed.'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_a_lookup_by_name_imports_only_that_module() -> None:
    """A ClientApp for one method imports that method's module, not its neighbours'."""
    mods = _imported_after("STRATEGIES.get('fedprox'); DEFENSES.get('topk')")
    assert "flowerbed.strategies.fedprox" in mods and "flowerbed.clients.defenses.topk" in mods
    for neighbour in ("fedadam", "fedavgm", "fed_kmeans", "fcm"):
        assert f"flowerbed.strategies.{neighbour}" not in mods
    assert "flowerbed.clients.defenses.quantize" not in mods


def test_a_lookup_of_a_split_method_imports_only_its_module() -> None:
    """The baselines and the routers, once six and two registrations in one module each: a lookup
    imports the method's own module (and the shared code), not its former neighbours."""
    mods = _imported_after("ATTACKS.get('dlg'); WORKLOADS.get('routing-mlp')")
    assert "flowerbed.attacks.dlg" in mods and "flowerbed.clients.workloads.routing_mlp" in mods
    for neighbour in ("idlg", "inverting_gradients", "tableak", "random_baseline", "analytic_fc"):
        assert f"flowerbed.attacks.{neighbour}" not in mods
    assert "flowerbed.clients.workloads.routing_kmeans" not in mods
    assert "flowerbed.clients.workloads.routing.kmeans" not in mods
    assert "flowerbed.clients.workloads.fcm" not in mods  # no discovery of every workload
