"""CLI behaviour: every bad input is one line on stderr, exit 2, no run directory; a run whose
clients all fail exits 1 naming the first client error; internal errors show a short traceback;
show/list/eval/help work."""

import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil
import pytest
from typer.testing import CliRunner

from flowerbed.apps.cli import app
from flowerbed.clients.core.config import decode
from flowerbed.clients.runtime import should_fail
from flowerbed.clients.workloads import WORKLOADS
from flowerbed.clients.workloads.tabular_mlp import TabularMLP
from flowerbed.server.processes import free_port, stop_group
from tests.cli_helpers import one_line_exit_2, run_cli

runner = CliRunner()


_run, _one_line_exit_2 = run_cli, one_line_exit_2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["quickstart", "clients.nmu=3"], "unknown key 'clients.nmu'"),
        (["quickstart", "rounds=three"], "wrong type for 'rounds'"),
        (["quickstart", "workload.params.lr=fast"], "wrong type for 'workload.params.lr'"),
        (["quickstart", "workload.params.bogus=1"], "unknown key 'workload.params.bogus'"),
        (["no-such-experiment"], "unknown experiment 'no-such-experiment'"),
        (["quickstart", "strategy.name=fedsgdx"], "unknown strategy 'fedsgdx'"),
        (["quickstart", "clients.partitioner=zipf"], "(allowed: iid, dirichlet)"),
        (["quickstart", "workload.params.lr=-1"], "workload.params.lr must be > 0 (got -1.0)"),
        (["quickstart", "workload.params.batch_size=0"], "batch_size must be >= 1 (got 0)"),
        (["quickstart", "workload.params.hidden=[64,0]"], "every value of workload.params.hidden"),
        (["quickstart", "clients.fraction=1.5"], "clients.fraction must be in (0, 1]"),
        (["tabdiff-adult-mixed", "workload.params.regime=uniform"], "(allowed: gaussian, mixed)"),
        (["quickstart", "defenses=[{name: topk, params: {fraction: 2}}]"], "fraction must be in"),
        # an attack on a workload that cannot serve it: names the attack, the workload, the gap
        (
            ["quickstart", "attack.name=goliath"],
            "attack 'goliath' needs tabular-diffusion, which workload 'tabular-mlp' does not offer",
        ),
        (
            ["digits-classifier", "attack.name=analytic-fc", "workload.params.model=cnn"],
            "attack 'analytic-fc' needs linear-first-layer, which workload 'digits-classifier' does "
            "not offer here (model=cnn starts with a convolution)",
        ),
        (
            ["tabdiff-adult-mixed", "attack.name=analytic-fc"],
            "attack 'analytic-fc' needs linear-first-layer + model-loss, which workload 'tabdiff'",
        ),
        (
            ["fits", "attack.name=dlg"],
            "attack 'dlg' needs tabular-diffusion or model-loss, which workload 'fits' does not",
        ),
        (
            ["quickstart", "attack.name=model-stealing"],
            "attack 'model-stealing' needs model-release, which workload 'tabular-mlp' does not "
            "offer (workloads that do: filosofer)",
        ),
        # a strategy on a workload that cannot serve it (strategies declare needs too)
        (
            ["quickstart", "strategy.name=fcm"],
            "strategy 'fcm' needs concept-registry, which workload 'tabular-mlp' does not offer "
            "(workloads that do: fcm)",
        ),
        (
            ["routing-synthetic-kmeans", "strategy.name=fed-mlp"],
            "strategy 'fed-mlp' needs router-heads, which workload 'routing-kmeans' does not offer "
            "(workloads that do: routing-mlp)",
        ),
        (
            ["routing-synthetic-mlp", "strategy.name=fed-kmeans"],
            "strategy 'fed-kmeans' needs kmeans-statistics, which workload 'routing-mlp' does not",
        ),
        (
            ["quickstart", "strategy.name=tabdiff"],
            "strategy 'tabdiff' needs tabular-diffusion, which workload 'tabular-mlp' does not",
        ),
        # rules on every Params field: a check rule, Goliath's and the baselines' numbers
        (
            ["fcm-trig-evolving", "workload.params.data=nope"],
            "workload.params.data: unknown concept task 'nope' (allowed: ",
        ),
        (
            ["fcm-trig-evolving", "strategy.params.server_momentum=1"],
            "strategy.params.server_momentum must be in [0, 1) (got 1.0)",
        ),
        (
            ["fcm-trig-evolving", "strategy.params.server_lr=0"],
            "strategy.params.server_lr must be > 0 (got 0.0)",
        ),
        (
            ["tabdiff-adult-mixed", "attack.name=goliath", "attack.params.restarts=0"],
            "attack.params.restarts must be >= 1 (got 0)",
        ),
        (
            ["tabdiff-adult-mixed", "attack.name=dlg", "attack.params.latents=oracle"],
            "unknown value 'oracle' for 'attack.params.latents' (allowed: fixed, joint)",
        ),
    ],
)
def test_bad_config_is_one_line_exit_2_no_run_dir(tmp_path, args, needle):
    _one_line_exit_2(*_run(tmp_path, *args), needle)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("rounds: [1,\n", "is not valid YAML"),
        ("- rounds\n- 5\n", "the top level must be a mapping"),
        ("", "is empty"),
        ("rounds: ${nope}\n", "exp.yaml"),
    ],
)
def test_bad_yaml_file(tmp_path, text, needle):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    _one_line_exit_2(*_run(tmp_path, str(path)), needle)


def _csv(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text)
    return [
        "quickstart", "dataset.name=csv", f"dataset.path={path}", "dataset.label=y",
        "dataset.numeric=[a]", "dataset.categorical=[b]",
    ]  # fmt: skip


ROWS = "".join(f"{i},{'xy'[i % 2]},{'yes' if i % 3 else 'no'}\n" for i in range(12))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "t.csv is empty"),
        ("a,b,y\n", "has a header but no data rows"),
        ("a,b,y\n" + ROWS + "1,x,yes,extra\n", "(every row needs as many fields as the header)"),
        ("a,b,y\n1,x,yes,extra\n" + ROWS, "a row has more fields than the header"),
        ("a,b,y\n" + ROWS + "5,x,maybe\n", "class 'maybe' of label 'y' has 1 row"),
        ("a,b,y\n" + ROWS.replace("yes", "no"), "label 'y' has 1 class (only 'no')"),
        ("a,b,y\n1.0,x,yes\nnan,y,no\n2.0,x,no\n", "NaN or non-numeric value in 'a' (line 3)"),
    ],
)
def test_bad_csv(tmp_path, text, needle):
    _one_line_exit_2(*_run(tmp_path, *_csv(tmp_path, text)), needle)


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("rows", "clients.num=20 leaves 11 of 20 clients without a training row: dataset 'csv' "
                 "has 9 training rows (iid partitioner: at most 9 clients)"),
        ("dirichlet", "without a training row: dataset 'csv' has 9 training rows (dirichlet"),
        ("adult", "clients.num=100000 leaves 69838 of 100000 clients without a training row: "
                  "dataset 'adult' has 30162 training rows"),
        ("digits", "without a training row: workload 'digits-classifier' has"),
        ("out-file", "is a file (give a directory: new or empty)"),
        ("attack-rounds", "attack.params.rounds [5, 10] outside 1..2 (rounds=2): never attacked"),
        ("attack-rounds-0", "attack.params.rounds [0] outside 1..3"),
        ("targets", "attack.params.target_clients [3] outside 0..1 (clients.num=2)"),
    ],
)  # fmt: skip
def test_inputs_that_cannot_run_are_refused_before_anything_starts(tmp_path, case, needle):
    """More clients than rows (a 12-row table, 9 of them training rows), a client count far
    beyond the data, ``--out`` naming a file, attacked rounds or targets that do not exist: one
    line, exit 2, no run directory (and the file named by --out untouched)."""
    small = _csv(tmp_path, "a,b,y\n" + ROWS)
    args = {
        "rows": [*small, "clients.num=20"],
        "dirichlet": [
            *small,
            "clients.num=8",
            "clients.partitioner=dirichlet",
            "clients.alpha=0.1",
        ],
        "adult": ["quickstart", "clients.num=100000"],
        "digits": ["digits-classifier", "clients.num=5000"],
        "out-file": ["quickstart"],
        "attack-rounds": ["inversion-digits", "rounds=2"],
        "attack-rounds-0": ["inversion-digits", "rounds=3", "attack.params.rounds=[0]"],
        "targets": ["goliath-adult-mixed", "clients.num=2", "attack.params.target_clients=[0,3]"],
    }[case]
    out = tmp_path / "out"
    if case == "out-file":
        out.write_text("keep me")
    result = runner.invoke(app, ["run", *args, "--engine", "inline", "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    if case == "out-file":
        assert out.read_text() == "keep me"
    else:
        assert not out.exists()


def test_a_run_of_very_many_client_calls_is_warned_with_the_estimate(inline_cfg):
    from flowerbed.apps.preflight import load_warning

    assert load_warning(inline_cfg("quickstart", "clients.num=20")) is None
    warning = load_warning(inline_cfg("quickstart", "clients.num=30000", "rounds=5"))
    assert warning.startswith("clients.num=30000, 5 rounds: 300,000 client calls"), warning
    assert ">= 0.8 h" in warning
    sampled = load_warning(inline_cfg("quickstart", "clients.num=30000", "rounds=5",
                                      "clients.fraction=0.01", "clients.fraction_evaluate=0"))  # fmt: skip
    assert sampled is None  # 300 per round


def test_missing_dataset_file(tmp_path):
    args = [
        "quickstart",
        "dataset.name=csv",
        f"dataset.path={tmp_path}/nope.csv",
        "dataset.label=y",
    ]
    _one_line_exit_2(*_run(tmp_path, *args), "dataset file not found")


def test_unreachable_superlink(tmp_path):
    args = ["quickstart", "clients.num=2", "deployment.insecure=true"]
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["run", *args, "--engine", "deployment", "--superlink", f"127.0.0.1:{free_port()}",
              "--out", str(out)],
    )  # fmt: skip
    _one_line_exit_2(result, out, "could not connect to the SuperLink")


def test_superlink_with_another_ca(tmp_path):
    """A real TLS SuperLink whose certificate another CA signed: one line naming TLS and the fix."""
    for name in ("ours", "theirs"):
        done = runner.invoke(
            app, ["deploy", "certs", "--nodes", "0", "--certs", str(tmp_path / name),
                  "--keys", str(tmp_path / "keys")],
        )  # fmt: skip
        assert done.exit_code == 0, done.output
    theirs = tmp_path / "theirs"
    port = free_port()
    bin_dir = Path(sys.executable).parent
    link = subprocess.Popen(
        [str(bin_dir / "flower-superlink"), "--host", "127.0.0.1", "--port", str(port),
         "--database", str(tmp_path / "state.db"),
         "--ssl-ca-certfile", str(theirs / "ca.crt"),
         "--ssl-certfile", str(next(theirs.glob("*server.pem"))),
         "--ssl-keyfile", str(next(theirs.glob("*server.key")))],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "FLWR_HOME": str(tmp_path / "flwr")},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        from flowerbed.server.processes import wait_for_port

        wait_for_port(port, link.pid, timeout=120)
        out = tmp_path / "out"
        result = runner.invoke(
            app, ["run", "quickstart", "clients.num=2", "--engine", "deployment",
                  "--superlink", f"127.0.0.1:{port}",
                  "--root-certificates", str(tmp_path / "ours" / "ca.crt"), "--out", str(out)],
        )  # fmt: skip
        _one_line_exit_2(result, out, "TLS: the SuperLink at")
        assert "--root-certificates" in result.stderr
    finally:
        stop_group(link.pid)
        link.wait()


def test_internal_error_is_a_short_traceback_exit_1(tmp_path, monkeypatch):
    import flowerbed.apps.preflight as preflight

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(preflight, "preflight", broken)
    result, out = _run(tmp_path, "quickstart")
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "internal error (KeyError)" in result.stderr.strip().splitlines()[-1]
    assert "╭" not in result.stderr and "locals" not in result.stderr  # no Rich locals panels
    assert len(result.stderr.splitlines()) < 40


@WORKLOADS.register("test-always-fails", "tabular MLP whose local training always raises")
class AlwaysFails(TabularMLP):
    def fit(self, arrays, data, config, state):
        raise ValueError(f"no usable rows on client {config['partition-id']}")


def test_round_without_a_successful_reply_exits_1_with_the_client_error(tmp_path):
    result, out = _run(tmp_path, "quickstart", "workload.name=test-always-fails", "clients.num=3")
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert re.search(
        r"round 1: all 3 training replies failed; first error: node \d+ \(partition 0\): "
        r"ValueError: no usable rows on client 0",
        lines[0],
    ), lines[0]
    assert not (out / "summary.json").exists()


def test_injected_failures_of_a_whole_round_keep_the_run_going(tmp_path):
    rate, num = 0.8, 3
    base = decode({"clients": {"failure_rate": rate}})
    seed = next(
        s for s in range(200)
        if all(should_fail(replace(base, seed=s), p, 1) for p in range(num))
    )  # fmt: skip
    result, out = _run(
        tmp_path, "quickstart", f"clients.failure_rate={rate}", f"clients.num={num}", "rounds=2",
        f"seed={seed}", "dataset.max_rows=600",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failures_per_round"][0] == num
    assert "failed replies: " in result.stdout and "round 1: 3" in result.stdout


def test_csv_dataset_runs_show_reprints_and_eval_reloads_the_model(tmp_path):
    csv = tmp_path / "t.csv"
    rows = ["a,b,y"] + [f"{i % 7},{'xy'[i % 2]},{'yes' if i % 7 > 3 else 'no'}" for i in range(200)]
    csv.write_text("\n".join(rows) + "\n")
    result, out = _run(
        tmp_path, "quickstart", "dataset.name=csv", f"dataset.path={csv}", "dataset.label=y",
        "dataset.numeric=[a]", "dataset.categorical=[b]", "clients.num=3", "rounds=2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "report.md", "curves.png"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and "central.accuracy" in summary["metrics"]
    assert len(summary["round_s"]) == 2 and summary["startup_s"] >= 0
    assert "failed replies: none" in result.stdout
    shown = runner.invoke(app, ["show", str(out)])
    assert shown.exit_code == 0 and "central.accuracy" in shown.output

    from flowerbed.apps import load_model

    model = load_model(out)
    assert model and all(isinstance(v, np.ndarray) for v in model.values())
    assert set(np.load(out / "model.npz").files) == set(model)
    again = runner.invoke(app, ["eval", str(out)])
    assert again.exit_code == 0, again.output
    accuracy = f"{summary['metrics']['central.accuracy']:.4g}"
    assert re.search(rf"central\.accuracy\s*│\s*{re.escape(accuracy)}", again.stdout), again.stdout


def test_eval_of_a_directory_without_a_model(tmp_path):
    result = runner.invoke(app, ["eval", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a finished run directory" in result.stderr


def test_list_attacks_shows_the_workloads_each_runs_on():
    from flowerbed.attacks import ATTACKS
    from flowerbed.clients.core.registry import BUILTIN

    result = runner.invoke(app, ["list", "attacks"])
    assert result.exit_code == 0
    rows: dict[str, str] = {}
    descriptions: dict[str, str] = {}
    name = ""
    for line in result.output.splitlines():  # a row may wrap over several lines
        cells = [c.strip() for c in line.strip("│").split("│")]
        if len(cells) == 3:
            name = cells[0] or name
            rows[name] = " ".join([rows.get(name, ""), cells[2]])
            descriptions[name] = " ".join([descriptions.get(name, ""), cells[1]])
    assert "on: tabdiff" in rows["goliath"] and "tabular-mlp" not in rows["goliath"]
    # flowerbed's own entries carry no origin (test helpers registered by other test modules,
    # imported at collection, do)
    own = [n for n in descriptions if n in ATTACKS.names() and ATTACKS.origin(n) == BUILTIN]
    assert "goliath" in own and not [n for n in own if "(from:" in descriptions[n]]
    for name in ("dlg", "idlg", "inverting-gradients", "random-baseline"):
        assert all(w in rows[name] for w in ("tabdiff", "tabular-mlp", "digits-classifier")), name
    assert "digits-classifier, tabular-mlp" in rows["analytic-fc"]


def test_list_strategies_shows_the_workloads_each_runs_on():
    result = runner.invoke(app, ["list", "strategies"])
    assert result.exit_code == 0
    rows = {}
    for line in result.output.splitlines():
        cells = [c.strip() for c in line.strip("│").split("│")]
        if len(cells) == 3 and cells[0]:
            rows[cells[0]] = cells[2]
    assert rows["fcm"] == "on: fcm" and rows["fed-kmeans"] == "on: routing-kmeans"
    assert rows["fed-mlp"] == "on: routing-mlp" and rows["fedavg"] == "on: any workload"


def test_list_kinds():
    result = runner.invoke(app, ["list", "workloads"])
    assert result.exit_code == 0 and "tabular-mlp" in result.output
    bad = runner.invoke(app, ["list", "gizmos"])
    assert bad.exit_code == 2 and "allowed:" in bad.output


def test_superlink_option_merges_with_other_deployment_overrides(tmp_path, monkeypatch):
    """`--superlink` sets one key of `deployment`; `deployment.insecure=true` beside it stays."""
    import flowerbed.apps.engines as engines

    seen = []

    def capture(experiment, run_dir, on_round=None, on_status=None):  # the Engine protocol
        seen.append(experiment)
        raise SystemExit(0)

    monkeypatch.setattr(engines, "get_engine", lambda name: capture)
    ca = tmp_path / "ca.crt"
    ca.write_text("not used")
    runner.invoke(
        app,
        ["run", "quickstart", "deployment.insecure=true", "deployment.node_timeout_s=7",
         "--engine", "deployment", "--superlink", "10.1.2.3:8000", "--root-certificates", str(ca),
         "--out", str(tmp_path / "out")],
    )  # fmt: skip
    deployment = seen[0].deployment
    assert deployment.superlink == "10.1.2.3:8000"
    assert deployment.insecure is True
    assert deployment.node_timeout_s == 7
    assert deployment.root_certificates == str(ca.resolve())


@pytest.mark.parametrize(
    ("command", "help_text"),
    [
        (["run"], "preset name (flowerbed list experiments)"),
        (["run"], "dotlist overrides"),
        (["show"], "a run directory"),
        (["eval"], "a finished run directory"),
        (["list"], "one of: experiments"),
        (["sweep"], "sweep YAML"),
    ],
)
def test_help_documents_positional_arguments(command, help_text):
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert help_text in result.output, result.output


def test_command_to_first_progress_line_imports_little():
    """What the CLI imports before it can draw: no torch, no Flower, no pandas."""
    code = (
        "import sys, flowerbed.apps.cli, flowerbed.apps.progress;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'flwr', 'pandas'}))"
    )
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    assert time.perf_counter() - started < 30  # generous: the machine may be loaded


def test_process_start_is_this_process_start():
    from flowerbed.apps.cli.process import process_start

    age = time.time() - process_start()
    assert 0 < age < time.time() - psutil.Process().create_time() + 1.5


@pytest.mark.parametrize("verbose", [True, False], ids=["-v", "quiet"])
def test_flowers_log_goes_to_the_run_log_and_to_the_console_only_with_v(tmp_path, verbose):
    """Flower's own warnings (fraction_evaluate 0) and round lines are in RUN_DIR/flower.log;
    on the console (where the progress display is) only with -v, and then once."""
    done = subprocess.run(
        [sys.executable, "-m", "flowerbed.apps.cli", "run", "quickstart", "rounds=1",
         "clients.num=2", "clients.fraction_evaluate=0", "--engine", "inline",
         "--out", str(tmp_path / "run"), *(["-v"] if verbose else [])],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "run" / "flower.log").read_text()
    assert "fraction_evaluate is set to 0.0" in log and "[ROUND 1/1]" in log, log
    shown = done.stderr.count("fraction_evaluate is set to 0.0"), done.stderr.count("[ROUND 1/1]")
    assert shown == ((1, 1) if verbose else (0, 0)), done.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--ray", "not an address"], "--ray address 'not an address' not understood (allowed: local, auto"),
        (["--cpus-per-cell", "2"], "--cpus-per-cell needs --ray"),
        (["--cell-timeout", "60"], "--cell-timeout needs --ray"),
        (["--ray", "--cpus-per-cell", "0"], "--cpus-per-cell must be > 0"),  # --ray alone: local
        (["--ray", "auto", "--gpus-per-cell", "-1"], "--gpus-per-cell must be >= 0"),
        (["--ray", "--cell-timeout", "0"], "--cell-timeout must be > 0 seconds"),
    ],
)  # fmt: skip
def test_bad_sweep_options_are_one_line_exit_2(tmp_path, args, needle):
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", "quickstart-lr", "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists()
