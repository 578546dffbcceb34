"""The one attack shape (attacks/common.py): an attack gets its typed Params and an AttackContext,
never the experiment config; its replay follows the capability it runs on; ground truth reaches
only the scorer, never the attack's own object."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.common import AttackContext
from flowerbed.attacks.inversion.types import DiffusionReplay, InversionSettings, ModelLossReplay
from flowerbed.attacks.truth import TruthSource
from flowerbed.clients.core.capabilities import Capability
from flowerbed.clients.defenses import Quantisation
from flowerbed.clients.workloads import build_workload
from flowerbed.server.experiment import load_experiment
from flowerbed.server.wrappers import build_attack

ATTACK_SOURCES = Path(__file__).resolve().parents[2] / "attacks"
#: parameter names a config dict would arrive under
CONFIG_NAMES = {"cfg", "config", "experiment_config"}


def _config_parameters(tree: ast.AST) -> list[str]:
    """Parameters named like a config and typed as a mapping (or untyped)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in [*node.args.args, *node.args.kwonlyargs]:
                hint = ast.unparse(arg.annotation) if arg.annotation else ""
                if arg.arg in CONFIG_NAMES and (not hint or re.match(r"(dict|Mapping)\b", hint)):
                    found.append(f"{node.name}({arg.arg}: {hint or '?'})")
    return found


def test_no_attack_module_reads_or_takes_the_experiment_config() -> None:
    """Every module under attacks/: no ``cfg[`` / ``.cfg`` read, no ``["attack"]["params"]``, no
    parameter that takes a config dict (the runner builds the typed inputs, server/runner.py)."""
    modules = sorted(ATTACK_SOURCES.rglob("*.py"))
    assert len(modules) > 40, modules  # the whole package, subpackages included
    readers, takers = [], []
    for path in modules:
        text = path.read_text()
        if re.search(r"\bcfg\[|\.cfg\b|\[\"attack\"\]", text):
            readers.append(path.name)
        takers += [f"{path.name}: {p}" for p in _config_parameters(ast.parse(text))]
    assert readers == [] and takers == [], (readers, takers)


def _context(**changes) -> AttackContext:
    return AttackContext(seed=0, rounds=1, num_clients=2, experiment="t", **changes)


@pytest.mark.parametrize("name", ATTACKS.names())
def test_every_attack_refuses_a_config_dict(name: str) -> None:
    cls = ATTACKS.get(name)
    cfg = load_experiment("quickstart", ["engine=inline"])
    with pytest.raises(TypeError, match="AttackContext"):
        cls(cls.Params(), cfg)
    with pytest.raises(TypeError):
        cls(cfg, _context())  # the config in place of the params: not its fields
    assert cls(cls.Params(), _context()).ctx.seed == 0


def _built(preset: str, *overrides: str):
    cfg = load_experiment(preset, ["engine=inline", "clients.num=2", *overrides])
    workload = build_workload(cfg)
    return cfg, workload, *build_attack(cfg, workload)


def test_the_replay_follows_the_capability_the_attack_runs_on() -> None:
    """``dlg`` declares two alternatives: on tabular diffusion its context holds the denoiser's
    replay and Goliath's engine runs it, on a classifier the model-loss replay; one settings
    constant (``DLG``) either way. Mechanisms and the run's numbers come from the config."""
    from flowerbed.attacks.baseline_common import DLG
    from flowerbed.attacks.goliath import TabularInversion
    from flowerbed.attacks.inversion.attack import ModelLossAttack

    quantise = "defenses=[{name: quantize, params: {bits: 4}}]"
    cfg, workload, attack, scorer = _built("goliath-adult-mixed", "attack.name=dlg", "seed=3",
                                           "attack.params.target_clients=[1]", quantise)  # fmt: skip
    ctx = attack.ctx
    assert ctx.capabilities == {Capability.TABULAR_DIFFUSION} and attack.settings is DLG
    assert isinstance(ctx.replay, DiffusionReplay) and ctx.replay.model is workload.model
    assert (ctx.seed, ctx.rounds, ctx.num_clients, ctx.experiment) == (3, 2, 2, cfg.experiment)
    assert ctx.mechanisms == (Quantisation(4),) and ctx.release is None
    assert isinstance(attack.engine(), TabularInversion) and attack.params.target_clients == [1]
    assert attack.engine().settings.diffusion.lr == DLG.diffusion.lr
    _, _, attack, scorer = _built("quickstart", "attack.name=dlg")
    assert attack.ctx.capabilities == {Capability.MODEL_LOSS}
    assert isinstance(attack.ctx.replay, ModelLossReplay)
    assert isinstance(attack.engine(), ModelLossAttack) and attack.engine().settings.seed == 0
    assert attack.engine().settings.model_loss.lr == DLG.model_loss.lr
    assert scorer.source.capabilities == attack.ctx.capabilities


def _reachable(root: object, limit: int = 5000) -> list[object]:
    """Objects reachable from ``root`` through attributes, dataclass fields and containers (not
    into torch modules, tensors, arrays, tables or functions: the public model's internals)."""
    seen, out, stack = set(), [], [root]
    opaque = (torch.nn.Module, torch.Tensor, np.ndarray, str, bytes, int, float, type)
    while stack and len(out) < limit:
        obj = stack.pop()
        if id(obj) in seen or obj is None or callable(obj) or isinstance(obj, opaque):
            continue
        seen.add(id(obj))
        out.append(obj)
        if isinstance(obj, dict):
            stack += list(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack += list(obj)
        elif dataclasses.is_dataclass(obj):
            stack += [getattr(obj, f.name) for f in dataclasses.fields(obj)]
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("flowerbed.attacks"):
            stack += list(vars(obj).values())
    return out


@pytest.mark.parametrize(
    ("preset", "attack"),
    [("goliath-adult-mixed", "goliath"), ("quickstart", "dlg"),
     ("quickstart", "tableak-adaptive"), ("goliath-adult-mixed", "goliath-adaptive")],
)  # fmt: skip
def test_ground_truth_reaches_the_scorer_and_not_the_attack(preset: str, attack: str) -> None:
    """The runner builds the scorer from a TruthSource on the server's workload; neither that
    source nor the workload is reachable from the attack, before or after it wrapped the strategy
    with the scorer (the observer holds the scorer, the attack does not)."""
    from flowerbed.clients.core.wrapper import StrategyWrapper

    _, workload, built, scorer = _built(preset, f"attack.name={attack}")
    assert isinstance(scorer.source, TruthSource) and scorer.source.workload is workload
    observer = built.wrap(StrategyWrapper(None), None, scorer)
    assert observer.scorer is scorer
    for obj in _reachable(built):
        assert not isinstance(obj, TruthSource) and obj is not workload and obj is not scorer, obj
    for obj in _reachable(observer.hooks):  # the attack's engines as the observer runs them
        assert not isinstance(obj, TruthSource) and obj is not workload and obj is not scorer, obj


def test_one_settings_constant_covers_both_replays() -> None:
    """Every registered inversion's settings are one ``InversionSettings`` with both replays'
    sections; the budget params override the shared knobs (and the diffusion engine's own)."""
    from flowerbed.attacks.inversion.types import with_budget

    inversions = [n for n in ATTACKS.names() if hasattr(ATTACKS.get(n), "settings")]
    assert len(inversions) == 14, inversions
    for name in inversions:
        settings = ATTACKS.get(name).settings
        assert isinstance(settings, InversionSettings), name
    params = ATTACKS.get("dlg").Params(restarts=3, iterations=7, latents="fixed")
    budget = with_budget(ATTACKS.get("dlg").settings, params, seed=5)
    assert (budget.restarts, budget.iterations, budget.seed) == (3, 7, 5)
    assert budget.diffusion.latents == "fixed"
    zero = ATTACKS.get("tableak-adaptive").Params()  # restarts=0: the settings' own
    assert with_budget(ATTACKS.get("tableak-adaptive").settings, zero, 0).restarts == 2


def test_every_observing_attack_has_the_observed_params_and_one_observer() -> None:
    """The observer reads ``target_clients`` and ``rounds`` from every attack that attacks
    replies (all but the model-release ones, which steal the final global model): their Params
    extend ``ObservedParams``; every attack's ``wrap`` builds the one ``AttackObserver``."""
    from flowerbed.attacks.common import ObservedParams
    from flowerbed.attacks.observer import AttackObserver
    from flowerbed.clients.core.capabilities import alternatives

    for name in ATTACKS.names():
        cls = ATTACKS.get(name)
        releases = any(Capability.MODEL_RELEASE in alt for alt in alternatives(cls.needs))
        assert releases or issubclass(cls.Params, ObservedParams), name
    _, _, attack, scorer = _built("goliath-adult-mixed", "attack.name=goliath-adaptive")
    assert type(attack.wrap(None, None, scorer)) is AttackObserver
