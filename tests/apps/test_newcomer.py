"""What a newcomer meets: ``flowerbed list`` compact by default (one line per kind, the hint
once), sweep presets, the tables with ``--long``, a file plug-in's entries with ``--plugin``;
``flowerbed new experiment NAME`` (a YAML that runs); the overrides a run used in ``show``,
report.md and the plot title."""

from typer.testing import CliRunner

from flowerbed.apps.cli import app

runner = CliRunner()


def test_list_is_one_line_per_kind_and_the_hint_once():
    result = runner.invoke(app, ["list"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    starts = [line.split(" (")[0] for line in lines if " (" in line and "): " in line]
    assert starts[:3] == ["experiments", "sweeps", "workloads"] and "engines" in starts
    assert len(lines) < 40, len(lines)  # the tables were ~250 lines
    assert sum("flowerbed list KIND" in line for line in lines) == 1
    assert "quickstart-lr" in result.output and "privacy-benchmark" in result.output


def test_list_sweeps_names_each_preset_with_its_first_sentence():
    result = runner.invoke(app, ["list", "sweeps"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert (
        "quickstart-lr" in result.output and "learning rate x partitioner x seed" in result.output
    )
    long = runner.invoke(app, ["list", "--long"], env={"COLUMNS": "200"})
    assert (
        long.output.count("come from outside flowerbed") == 1 and "on: any workload" in long.output
    )


def test_list_shows_a_file_plugins_entries(tmp_path):
    plugin = tmp_path / "my_defense.py"
    plugin.write_text(
        "from flowerbed.clients.defenses import DEFENSES, Defense\n\n\n"
        "@DEFENSES.register('listed-from-file', 'a defense in a file')\nclass Listed(Defense):\n"
        "    pass\n"
    )
    result = runner.invoke(
        app, ["list", "defenses", "--plugin", str(plugin)], env={"COLUMNS": "250"}
    )
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "listed-from-file" in line)
    assert f"(from: plugin {plugin})" in row


def test_new_experiment_writes_a_yaml_that_resolves_and_keeps_an_existing_one(tmp_path):
    from flowerbed.server.experiment import load_experiment

    done = runner.invoke(app, ["new", "experiment", "mine", "--dir", str(tmp_path)])
    assert done.exit_code == 0, done.output
    cfg = load_experiment(str(tmp_path / "mine.yaml"), ["rounds=1"])
    assert cfg.experiment == "mine" and cfg.workload.name == "tabular-mlp"
    assert "claim" not in (tmp_path / "mine.yaml").read_text()
    again = runner.invoke(app, ["new", "experiment", "mine", "--dir", str(tmp_path)])
    assert again.exit_code == 2 and "exists" in again.stderr
    two_lines = tmp_path / "two.yaml"
    two_lines.write_text("rounds: 2\nclients: {num: 4}\n")  # the README's smallest experiment
    assert load_experiment(str(two_lines)).clients.num == 4


def test_overrides_are_shown_by_show_report_and_plot_title():
    from flowerbed.apps.cli.render import summary_view
    from flowerbed.server.experiment import load_experiment
    from flowerbed.server.results import render_report, titled

    cfg = load_experiment("quickstart", ["rounds=2", "clients.num=4"])
    assert cfg.output.overrides == ["rounds=2", "clients.num=4"]
    assert titled(cfg) == "quickstart (rounds=2 clients.num=4)"
    summary = {"experiment": "quickstart", "engine": "inline", "seed": 0, "rounds": 2,
               "clients": 4, "wall_s": 1.0, "failures": 0, "metrics": {"central.accuracy": 0.8},
               "overrides": cfg.output.overrides}  # fmt: skip
    assert "overrides: `rounds=2 clients.num=4`" in render_report(summary, [])
    assert "overrides: rounds=2 clients.num=4" in str(summary_view(summary).renderables[1])


def test_a_dp_run_keeps_third_party_warnings_in_its_log_and_show_names_its_overrides(tmp_path):
    """Opacus' secure-RNG and torch's backward-hook warnings go to RUN_DIR/flower.log, not the
    terminal; ``show`` re-prints the overrides the run was started with."""
    import warnings

    from tests.cli_helpers import run_cli

    dp = "defenses=[{name: dp-sgd}]"
    with warnings.catch_warnings():
        warnings.simplefilter(
            "always"
        )  # shown again although an earlier test in this process saw it
        result, out = run_cli(tmp_path, "quickstart", dp, "rounds=1", "clients.num=2",
                              "dataset.max_rows=600", "output.plots=false")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Warning" not in result.stderr, result.stderr
    assert "Secure RNG turned off" in (out / "flower.log").read_text()
    shown = runner.invoke(app, ["show", str(out)], env={"COLUMNS": "250"})
    assert f"overrides: {dp} rounds=1 clients.num=2 dataset.max_rows=600" in shown.output
