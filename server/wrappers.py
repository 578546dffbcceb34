"""The strategy a run drives, wrapped: the base strategy, defenses (inner, then outer), the
run-level DP audit, the attack's observer (with its narrow ``AttackContext`` and its scorer's
``TruthSource``), seeded node sampling and the metrics tap the results writer reads."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.app.typing import MetricRecordValues
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy, strategy_utils

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.common import Attack, AttackContext
from flowerbed.attacks.protocols import Answer, Scorer
from flowerbed.attacks.truth import TruthSource
from flowerbed.clients.core.capabilities import Capability, Needs, alternatives, offered
from flowerbed.clients.core.config import Experiment
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.datasets import load_table
from flowerbed.clients.defenses import (
    WIRE_BYTES,
    Defense,
    build_defenses,
    dense_bytes,
    mechanisms_of,
)
from flowerbed.clients.defenses.canaries import RunAudit
from flowerbed.clients.runtime import PARTITION_KEY
from flowerbed.clients.workloads import Workload
from flowerbed.server.grid import scalar
from flowerbed.server.model_views import model_view
from flowerbed.server.results import ResultsWriter
from flowerbed.server.robustness import detection_tap
from flowerbed.strategies.context import build_strategy as base_strategy
from flowerbed.strategies.robust_common import KEPT

SAMPLE_TRAIN, SAMPLE_EVALUATE = 11, 13  # salts of the per-round sampling seeds


class SeededSampling(StrategyWrapper):
    """Gives Flower's node sampling its own seeded ``random.Random`` for every round.

    The seed is a function of (experiment seed, round, train/evaluate), so the sample does not
    depend on what else draws from ``random`` in the process: Ray, earlier runs, and in a
    deployment Flower's own threads (heartbeat and retry jitter, which drew between a global
    ``random.seed`` and the sample and made a deployment sample other partitions than inline).
    With the Grid listing nodes in partition order, every engine samples the same partitions.
    Flower 1.42's strategies sample in ``strategy_utils.sample_nodes`` with that module's
    ``random``; it is swapped for the seeded instance while the round is configured.
    """

    def __init__(self, inner: Strategy, seed: int) -> None:
        super().__init__(inner)
        self.seed = seed

    def _sampled(
        self, salt: int, server_round: int, configure: Callable[[], Iterable[Message]]
    ) -> Iterable[Message]:
        seed = client_seed(self.seed, 0, server_round, salt=salt)
        random.seed(seed)  # strategies that draw from ``random`` themselves
        module = strategy_utils.random
        # Flower's strategy_utils samples with the module `random`; a seeded Random stands in
        strategy_utils.random = random.Random(seed)  # type: ignore[assignment]
        try:
            return configure()
        finally:
            strategy_utils.random = module

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):  # fmt: skip
        return self._sampled(SAMPLE_TRAIN, server_round, lambda: self.inner.configure_train(server_round, arrays, config, grid))  # fmt: skip

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):  # fmt: skip
        return self._sampled(SAMPLE_EVALUATE, server_round, lambda: self.inner.configure_evaluate(server_round, arrays, config, grid))  # fmt: skip


class MetricsTap(StrategyWrapper):
    """Records the aggregated train/evaluate metrics of each round for the results writer.

    It is the outermost wrapper, so it sees every client's reply as sent: ``comm`` holds the
    upload of the round (``wire-bytes`` of a compressing defense, else the dense array bytes),
    ``partitions`` the partition ids whose training replies came back, per round (the summary's
    ``train_partitions``: who was sampled, the same on every engine), ``kept`` those a selecting
    strategy let into the aggregate (the summary's ``kept_partitions``; the rest were dropped).
    """

    def __init__(self, inner: Strategy) -> None:
        super().__init__(inner)
        self.train: dict[int, dict[str, MetricRecordValues]] = {}
        self.evaluate: dict[int, dict[str, MetricRecordValues]] = {}
        self.dp: dict[int, dict[str, float]] = {}
        self.comm: dict[int, dict[str, float]] = {}
        self.partitions: dict[int, list[int]] = {}
        #: partition ids a selecting strategy let into the aggregate (``kept-partitions``), per round
        self.kept: dict[int, list[int]] = {}

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        ok = [r for r in replies if not r.has_error() and "metrics" in r.content]
        self.partitions[server_round] = sorted(
            int(scalar(r.content["metrics"][PARTITION_KEY])) for r in ok
            if PARTITION_KEY in r.content["metrics"]
        )  # fmt: skip
        epsilons = [
            float(scalar(r.content["metrics"]["epsilon"]))
            for r in ok
            if "epsilon" in r.content["metrics"]
        ]
        sizes = [
            float(scalar(r.content["metrics"][WIRE_BYTES])) if WIRE_BYTES in r.content["metrics"]
            else float(dense_bytes(r.content.array_records["arrays"]))
            for r in ok if "arrays" in r.content
        ]  # fmt: skip
        if sizes:
            self.comm[server_round] = {
                "upload_bytes": sum(sizes), "upload_bytes_per_client": sum(sizes) / len(sizes),
            }  # fmt: skip
        arrays, metrics = self.inner.aggregate_train(server_round, replies)
        if metrics is not None and KEPT in metrics:
            self.kept[server_round] = [int(p) for p in metrics[KEPT]]  # type: ignore[union-attr]
        hidden = ("epsilon", WIRE_BYTES)
        self.train[server_round] = {k: v for k, v in dict(metrics or {}).items() if k not in hidden}
        if epsilons:  # DP-SGD: the worst client's cumulative epsilon
            self.train[server_round]["epsilon_max"] = max(epsilons)
            self.dp[server_round] = {"epsilon": max(epsilons)}
        return arrays, metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        metrics = self.inner.aggregate_evaluate(server_round, replies)
        self.evaluate[server_round] = dict(metrics or {})
        return metrics


def attack_capabilities(experiment: Experiment, workload: Workload, needs: Needs) -> frozenset[Capability]:  # fmt: skip
    """What the workload offers (under its params) of the first alternative of ``needs`` it fits
    (resolution checked that one does)."""
    available, _ = offered(type(workload), experiment.workload.params)
    fitting = [alt for alt in alternatives(needs) if alt <= available]
    return frozenset(Capability(c) for c in (fitting[0] if fitting else ()))


def attack_context(
    experiment: Experiment, workload: Workload, needs: Needs,
    defenses: list[Defense] | None = None,
) -> AttackContext:  # fmt: skip
    """What the configured attack may know: the run's seed, rounds, clients and name, the public
    knowledge of the capability it runs on (the server's ``workload``'s model for a replay, or its
    model-release setup and the release defense's deployment: ``server/model_views.py``, a table
    keyed by capability) and the defenses' published mechanisms."""
    defenses = build_defenses(experiment) if defenses is None else defenses
    capabilities = attack_capabilities(experiment, workload, needs)
    return AttackContext(
        seed=experiment.seed, rounds=experiment.rounds, num_clients=experiment.clients.num,
        experiment=experiment.experiment, capabilities=capabilities,
        mechanisms=tuple(mechanisms_of(defenses)), **model_view(capabilities, workload, defenses),
    )  # fmt: skip


def truth_source(
    experiment: Experiment, workload: Workload, capabilities: frozenset[Capability] = frozenset()
) -> TruthSource:
    """Ground truth for the attack's scorer: the server's ``workload`` (it rebuilds a client's
    round data from (seed, partition, round)) and, where the workload reads one, the dataset's
    table."""
    table = load_table(experiment.dataset) if "dataset" in getattr(workload, "reads", ()) else None
    return TruthSource(experiment.seed, experiment.clients.num, experiment.experiment,
                       capabilities, workload, table)  # fmt: skip


def build_attack(
    experiment: Experiment, workload: Workload, defenses: list[Defense] | None = None
) -> tuple[Attack, Scorer[Answer] | None]:
    """The configured attack (its typed ``Params`` and ``AttackContext``, never the config) and
    its scorer (built from a ``TruthSource``: ground truth never reaches the attack)."""
    cls = ATTACKS.get(experiment.attack.name or "")
    ctx = attack_context(experiment, workload, cls.needs, defenses)
    attack = cls(experiment.attack.params, ctx)
    scorer = None
    if cls.scorer is not None:
        scorer = cls.scorer(truth_source(experiment, workload, ctx.capabilities))
    return attack, scorer


def build_strategy(experiment: Experiment, writer: ResultsWriter, workload: Workload) -> Strategy:
    """Base strategy (its typed params and a narrow context with the server's ``workload``),
    inner defense wrappers, the attack's observer, then outer (visibility) ones."""
    strategy = detection_tap(experiment, base_strategy(experiment, workload), writer)
    defenses = build_defenses(experiment)
    for defense in defenses:
        if defense.server_position == "inner":
            strategy = defense.wrap_strategy(strategy, writer)
    audits = [a for a in (d.canary_audit() for d in defenses) if a is not None]
    if audits:  # the run-level DP audit sees replies as received, like the observer
        strategy = RunAudit(strategy, audits)
    if experiment.attack.name:
        attack, scorer = build_attack(experiment, workload, defenses)
        strategy = attack.wrap(strategy, writer, scorer)
    for defense in defenses:
        if defense.server_position == "outer":
            strategy = defense.wrap_strategy(strategy, writer)
    return strategy
