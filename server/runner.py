"""Drive one experiment on whatever Grid an engine provides; every engine calls this.

The composition root: the workload, the wrapped strategy (``server/wrappers.py``) on the
ordered Grid (``server/grid.py``), the results writer, the run-level audits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid

from flowerbed.clients import malicious
from flowerbed.clients.core.config import Experiment, to_json
from flowerbed.clients.core.errors import ConfigError, RunFailed
from flowerbed.clients.core.plugins import load_plugins
from flowerbed.clients.core.seeding import seed_everything
from flowerbed.clients.defenses import build_defenses
from flowerbed.clients.defenses.canaries import find_run_audit
from flowerbed.clients.runtime import CONFIG_KEY
from flowerbed.clients.workloads import Workload, build_workload
from flowerbed.server.grid import OrderedGrid
from flowerbed.server.results import ResultsWriter, RunExtras, Summary
from flowerbed.server.wrappers import MetricsTap, SeededSampling, build_strategy
from flowerbed.strategies.context import published_rule


def needs_partition_order(experiment: Experiment) -> bool:
    """Whether clients are sampled (then nodes must be listed in partition order)."""
    clients = experiment.clients
    return clients.fraction < 1 or 0 < (clients.fraction_evaluate or 0) < 1


def run_experiment(
    grid: Grid,
    experiment: Experiment,
    run_dir: Path,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
) -> Summary:
    """Run ``experiment`` to completion on ``grid``; returns the summary (also written to
    ``run_dir``).

    The final global model is saved as ``model.npz``; a run that cannot go on raises
    :class:`RunFailed` after writing its one-line cause to ``error.txt``.
    """
    load_plugins(experiment.plugins)  # outside code (resolution imported it; a cell may not have)
    writer = ResultsWriter(run_dir, experiment)
    try:
        return _run(grid, experiment, writer, on_round)
    except (RunFailed, ConfigError) as exc:
        writer.fail(exc)
        raise


def _run(
    grid: Grid,
    experiment: Experiment,
    writer: ResultsWriter,
    on_round: Callable[[int, dict[str, float]], None] | None,
) -> Summary:
    seed_everything(experiment.seed)
    workload = build_workload(experiment)
    strategy = build_strategy(experiment, writer, workload)
    strategy = MetricsTap(SeededSampling(strategy, experiment.seed))
    final_arrays: list[ArrayRecord] = []

    save_rounds = set(experiment.output.save_rounds)
    attack_scores = malicious.scorer(experiment, workload)  # malicious clients' success (ASR)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round in save_rounds:
            torch.save(arrays.to_torch_state_dict(), writer.run_dir / f"model.r{server_round}.pt")
        central = workload.server_evaluate(server_round, arrays) or {}
        if attack_scores is not None:
            central = {**central, **attack_scores(workload, arrays)}
        if server_round > 0:
            writer.log(server_round, "train", strategy.train.get(server_round, {}))
            writer.log(server_round, "eval", strategy.evaluate.get(server_round, {}))
            writer.log(server_round, "dp", strategy.dp.get(server_round, {}))
            writer.log(server_round, "comm", strategy.comm.get(server_round, {}))
        writer.log(server_round, "central", central)
        writer.round_done(server_round)
        final_arrays[:] = [arrays]
        if on_round is not None:
            on_round(server_round, writer.final)
        return MetricRecord({**central}) if central else None

    config = ConfigRecord({CONFIG_KEY: to_json(experiment), **published_to_clients(experiment)})
    initial_arrays = workload.init_arrays()
    by_partition = needs_partition_order(experiment)
    ordered = OrderedGrid(grid, writer.count_failures, by_partition=by_partition)
    strategy.start(
        grid=ordered,
        initial_arrays=initial_arrays,
        num_rounds=experiment.rounds,
        timeout=experiment.clients.timeout_s,  # a lost reply is a failure, not a hang
        train_config=config,
        evaluate_config=config,
        evaluate_fn=evaluate_fn,
    )
    if final_arrays:
        writer.save_model(final_arrays[0])
    if len(writer.dropped) == experiment.rounds:
        first = min(writer.dropped)
        raise RunFailed(
            f"every round was dropped, the model never changed (round {first}: "
            f"{writer.dropped[first]})"
        )
    run_audit = find_run_audit(strategy)
    final = final_arrays[0] if final_arrays else None
    audited = run_audit.metrics(initial_arrays, final) if run_audit is not None else {}
    writer.log(experiment.rounds, "dp", {**audit_defenses(experiment, workload), **audited})
    rounds = range(1, experiment.rounds + 1)
    extra: RunExtras = {"train_partitions": [strategy.partitions.get(r, []) for r in rounds]}
    if strategy.kept:  # a selecting strategy (Krum, FLAME, ...): whom it let in, per round
        extra["kept_partitions"] = [strategy.kept.get(r) for r in rounds]
    if experiment.malicious.name:
        extra["malicious_partitions"] = list(malicious.chosen(experiment))
    return writer.finish(extra)


def published_to_clients(experiment: Experiment) -> dict[str, str]:
    """What the server's protocol publishes to clients with each round: its aggregation rule
    (aggregator-aware malicious clients read it), sent only when malicious clients are set."""
    if not experiment.malicious.name:
        return {}
    rule = published_rule(experiment)
    return {} if rule is None else {malicious.AGGREGATION_KEY: rule.to_json()}


def audit_defenses(experiment: Experiment, workload: Workload) -> dict[str, float]:
    """Each DP defense's audit of its own code path (the step audit ``dp.epsilon_audit_step``, docs/methods/dp-sgd.md
    and flower-dp.md, "Auditing"), on the workload's private-training path, seeded by the run."""
    out: dict[str, float] = {}
    for defense in build_defenses(experiment):
        out.update(defense.audit(workload.private_training_path, experiment.seed))
    return out


def evaluate_saved(run_dir: Path) -> dict[str, float]:
    """The workload's server-side evaluation of a finished run's saved model (``model.npz``)."""
    from flwr.app import Array

    from flowerbed.clients.core.config import decode, load_config_file
    from flowerbed.server.experiment import COMPONENTS
    from flowerbed.server.results import MODEL_FILE, load_model

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file() or not (run_dir / MODEL_FILE).is_file():
        raise ConfigError(
            f"{run_dir} has no config.yaml and {MODEL_FILE} (not a finished run directory)"
        )
    written = load_config_file(run_dir / "config.yaml")
    plugins = written.get("plugins", [])  # the file, before anything is typed
    try:
        load_plugins(cast(list[str], plugins))
    except ConfigError as exc:
        raise ConfigError(
            f"plug-in missing: {run_dir} ran with plugins {plugins} ({exc})"
        ) from None
    experiment = decode(written, workloads=COMPONENTS.workloads, defenses=COMPONENTS.defenses)
    workload = build_workload(experiment)
    arrays = ArrayRecord({name: Array(value) for name, value in load_model(run_dir).items()})
    metrics = workload.server_evaluate(experiment.rounds, arrays)
    if not metrics:
        raise ConfigError(
            f"workload '{experiment.workload.name}' has no server-side evaluation "
            f"(load the arrays with flowerbed.apps.load_model('{run_dir}'))"
        )
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
