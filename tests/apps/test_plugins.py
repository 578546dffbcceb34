"""Plug-ins for real: packages made by ``flowerbed new`` (tests/plugin_fixture.py), installed into
a private directory on PYTHONPATH, run by the ``flowerbed`` CLI on the inline and simulation
engines with the same metrics; ``flowerbed list`` shows their origin; a name registered twice is
one line naming both origins (exit 2); the defense acts (clipped and noised updates) and the
attack scores exactly its prior. The deployment engine runs them on the TLS federation of
tests/server/test_deploy.py (``flowerbed deploy up`` with the packages installed, one federation
for both), the Ray sweep cell is in tests/server/test_ray_sweep.py (its cluster), the docker image
in tests/deploy.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from flowerbed.apps.cli import app
from tests.cli_helpers import runner
from tests.plugin_fixture import cli, on_path, run_metrics


@pytest.fixture(scope="module")
def inline_metrics(plugin_site, tmp_path_factory):
    return run_metrics(plugin_site, tmp_path_factory.mktemp("inline") / "run", "--engine", "inline")


def test_list_shows_the_packages_origin(plugin_site):
    done = cli(plugin_site, "list", "--long")
    assert done.returncode == 0, done.stderr
    lines = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if "│" in line}
    assert "(from: flowerbed-clip-noise 0.1.0 (entry point))" in lines["clip-noise"]
    assert "(from: flowerbed-label-prior 0.1.0 (entry point))" in lines["label-prior"]
    assert "from:" not in lines["topk"]  # flowerbed's own


def test_a_name_registered_twice_is_one_line_naming_both(plugin_site, tmp_path):
    twin = tmp_path / "twin.py"
    twin.write_text(
        "from flowerbed.clients.defenses import DEFENSES, Defense\n\n\n"
        "@DEFENSES.register('clip-noise', 'a second clip-noise')\nclass Twin(Defense):\n    pass\n"
    )
    done = cli(plugin_site, "run", "quickstart", "--engine", "inline", f"plugins=[{twin}]",
               "defenses=[{name: clip-noise}]", "--out", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 2
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "defense 'clip-noise' registered twice" in line
    assert "flowerbed-clip-noise 0.1.0 (entry point)" in line and f"plugin {twin}" in line
    assert not (tmp_path / "run").exists()


def test_inline_run_attack_scores_its_prior_and_defense_changes_the_model(
    plugin_site, inline_metrics, tmp_path
):
    assert inline_metrics["attack.error"] == inline_metrics["attack.prior_error"] > 0
    plain = run_metrics(plugin_site, tmp_path / "plain", "--engine", "inline", "defenses=[]")
    assert plain["attack.error"] == plain["attack.prior_error"]  # the prior ignores the update
    assert plain["central.loss"] != inline_metrics["central.loss"]


def test_the_defense_clips_and_noises_each_update(plugin_site):
    with on_path(plugin_site):
        from flowerbed.clients.defenses import DEFENSES, DefenseContext

        cls = DEFENSES.get("clip-noise")
        assert DEFENSES.origin("clip-noise") == "flowerbed-clip-noise 0.1.0 (entry point)"
        rng = np.random.default_rng(0)
        sent = {"w": rng.normal(size=(50, 40)), "b": rng.normal(size=40)}
        trained = {k: v + rng.normal(size=v.shape) for k, v in sent.items()}  # norm ~ 45
        records = [ArrayRecord({k: Array(v[k]) for k in v}) for v in (sent, trained)]
        config = {"partition-id": 1, "server-round": 2}
        cfg = DefenseContext(seed=0, rounds=2, num_clients=2, sampled_clients=2, run_key="t")

        def update(clip: float, noise: float) -> np.ndarray:
            out = cls({"clip": clip, "noise": noise}, cfg).transform(*records, config)
            return np.concatenate([(out[k].numpy() - sent[k]).ravel() for k in ("w", "b")])

        clipped = update(0.5, 0.0)
        full = np.concatenate([(trained[k] - sent[k]).ravel() for k in ("w", "b")])
        assert np.linalg.norm(clipped) == pytest.approx(0.5, rel=1e-6)
        assert np.allclose(clipped / 0.5, full / np.linalg.norm(full))  # direction kept
        noise = update(0.5, 0.2) - clipped
        assert np.std(noise) == pytest.approx(0.1, rel=0.05)  # noise * clip, per entry
        assert np.array_equal(update(0.5, 0.2), update(0.5, 0.2))  # seeded per client and round
        assert np.allclose(update(1e3, 0.0), full)  # below the bound: untouched


def test_simulation_engine_gives_the_inline_metrics(plugin_site, inline_metrics, tmp_path):
    assert run_metrics(plugin_site, tmp_path / "sim", "--engine", "simulation") == inline_metrics


def test_a_client_process_imports_the_configs_plugin_files_first(plugin_site, tmp_path):
    """A ClientApp gets only the resolved config: it imports ``plugins`` before any lookup."""
    plugin = tmp_path / "halve.py"
    plugin.write_text(
        "from flowerbed.clients.defenses import DEFENSES, Defense\n\n\n"
        "@DEFENSES.register('halve', 'the update halved')\nclass Halve(Defense):\n    pass\n"
    )
    script = (
        "import json, sys\n"
        "from flowerbed.clients.runtime import client_experiment\n"
        "from flowerbed.clients.defenses import DEFENSES\n"
        "client_experiment(json.dumps({'plugins': [sys.argv[1]], 'output': {}}))\n"
        "print(DEFENSES.origin('halve'))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(plugin)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.strip() == f"plugin {plugin}"


def test_new_writes_a_package_per_kind_and_refuses_bad_input(tmp_path):
    """``flowerbed new`` by typer's runner in this process (as tests/apps/test_newcomer.py's
    ``new experiment``): the command does not read the installed packages, and five fresh
    interpreters cost ~15 s of the suite."""

    def new(*args: str):  # noqa: ANN202 - click's Result
        return runner.invoke(app, ["new", *args])

    for kind, group in (("workload", "workloads"), ("strategy", "strategies")):
        done = new(kind, f"my-{kind}", "--dir", str(tmp_path / kind))
        assert done.exit_code == 0, done.output
        pyproject = (tmp_path / kind / "pyproject.toml").read_text()
        assert f'[project.entry-points."flowerbed.{group}"]' in pyproject
        assert f'my-{kind} = "flowerbed_my_{kind}.my_{kind}:My{kind.capitalize()}"' in pyproject
        assert (tmp_path / kind / "tests" / f"test_my_{kind}.py").is_file()
    bad = new("defense", "Clip_Noise", "--dir", str(tmp_path / "bad"))
    assert bad.exit_code == 2 and "lower-case" in bad.stderr and not (tmp_path / "bad").exists()
    taken = new("workload", "again", "--dir", str(tmp_path / "workload"))
    assert taken.exit_code == 2 and "not empty" in taken.stderr
    kind = new("gizmo", "x", "--dir", str(tmp_path / "g"))
    assert kind.exit_code == 2 and "allowed: workload, attack, defense, strategy" in kind.stderr


def test_the_scaffolds_claim_test_fails_on_the_skeleton_and_passes_on_the_method(plugin_site):
    def claim_test(package: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "0]", "tests"],
            cwd=package, env=plugin_site.env(), capture_output=True, text=True, timeout=600,
        )  # fmt: skip

    skeleton = claim_test(plugin_site.attack_src)  # label-prior is the attack scaffold as written
    assert skeleton.returncode == 1 and "attack.prior_error" in skeleton.stdout, skeleton.stdout
    method = claim_test(plugin_site.defense_src)  # clip-noise: the defense scaffold, written
    assert method.returncode == 0, method.stdout[-2000:]


def test_the_attack_scaffold_has_the_attack_shape(plugin_site):
    """``flowerbed new attack``: the class subclasses ``Attack`` (``self.params``, ``self.ctx``),
    flowerbed's observer runs it and its scorer gets a ``TruthSource``; no config, no observer of
    its own."""
    module = plugin_site.attack_src / "src" / "flowerbed_label_prior" / "label_prior.py"
    text = module.read_text()
    assert "cfg" not in text and "StrategyWrapper" not in text
    assert "class LabelPrior(Attack):" in text and "self.ctx." in text
    assert "def __init__(self, truth: TruthSource)" in text


GRADIENT_STEPS = """
    for _ in range(steps):
        w = w - lr * 2 * x.T @ (x @ w - y) / len(y)
    return w
"""


def test_the_workload_scaffold_runs_on_its_params_and_context(tmp_path):
    """``flowerbed new workload``: the package's module (built from ``self.params`` and
    ``self.ctx``) runs federated in its claim test, which fails on the skeleton (no learning)
    and passes once ``local_step`` is written. The module is imported by name (no install)."""
    from flowerbed.apps.scaffold import new_package

    package = new_package("workload", "lin-reg", tmp_path / "lin-reg")
    module = package / "src" / "flowerbed_lin_reg" / "lin_reg.py"
    text = module.read_text()
    assert "cfg" not in text and "self.ctx.seed" in text

    def claim_test() -> subprocess.CompletedProcess:
        script = (
            "import sys, pytest\nimport flowerbed_lin_reg.lin_reg\n"
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-k', '0]', 'tests']))\n"
        )
        return subprocess.run(
            [sys.executable, "-c", script], cwd=package, capture_output=True, text=True,
            timeout=600, env={**os.environ, "PYTHONPATH": str(package / "src")},
        )  # fmt: skip

    skeleton = claim_test()
    assert skeleton.returncode == 1 and "assert trained < 0.5 * untrained" in skeleton.stdout, (
        skeleton.stdout[-2000:]
    )
    todo = '    """TODO: the method (e.g. ``steps`` of gradient descent on the squared error)."""\n    return w\n'
    assert todo in text, "the workload scaffold changed: update this test"
    module.write_text(text.replace(todo, GRADIENT_STEPS.lstrip("\n")))
    method = claim_test()
    assert method.returncode == 0, method.stdout[-2000:]


def test_a_strategy_on_updates_written_from_the_docs_runs_inline_and_in_simulation(tmp_path):
    """``flowerbed new strategy`` with its step line replaced by docs/contributing.md's block (the
    coordinate-wise median of the updates), loaded as a file plug-in: no private Flower name in
    the module; the same metrics on the inline and simulation engines, not FedAvg's."""
    import json
    import re

    from flowerbed.apps.scaffold import new_package
    from tests.plugin_fixture import FLOWERBED

    module = new_package("strategy", "median-step", tmp_path / "pkg") / "src" / "flowerbed_median_step" / "median_step.py"  # fmt: skip
    docs = (Path(__file__).parents[2] / "docs" / "contributing.md").read_text()
    block = docs.split("<!-- strategy-example")[1].split("```python\n")[1].split("```")[0]
    text = module.read_text()
    step = next(line for line in text.splitlines(keepends=True) if line.strip().startswith("step = "))  # fmt: skip
    module.write_text(text.replace(step, block))
    assert not re.search(r"\._[a-z]", module.read_text())  # Flower's public API only

    run = ["quickstart", f"plugins=[{module}]", "rounds=2", "clients.num=3",
           "dataset.max_rows=600", "output.plots=false"]  # fmt: skip

    def inline(strategy: str) -> dict:  # in this process: no second interpreter to start
        from flowerbed.apps.inline import run_inline
        from flowerbed.server.experiment import load_experiment

        cfg = load_experiment(run[0], [*run[1:], f"strategy.name={strategy}", "engine=inline",
                                       f"output.dir={tmp_path / strategy}"])  # fmt: skip
        return _no_times(run_inline(cfg)["metrics"])

    out = tmp_path / "simulation"
    done = subprocess.run(
        [FLOWERBED, "run", *run, "strategy.name=median-step", "--engine", "simulation",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    median = inline("median-step")
    assert _no_times(json.loads((out / "summary.json").read_text())["metrics"]) == median
    assert median["central.loss"] != inline("fedavg")["central.loss"]


def _no_times(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith("time.")}
