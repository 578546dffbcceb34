"""What ``flowerbed new KIND NAME`` writes for each kind (``apps/scaffold.py``): the module
skeleton (the method's ablation: identity, prior, no learning, FedAvg), its claim test that
fails until the method does what it claims, the TODO line and the command that runs it."""

DEFENSE = '''\
"""{name}: a flowerbed defense. Its client half is a Flower mod that rewrites the update each
client sends; a server half (``wrap_strategy(strategy, writer)`` with ``server_position``) is
optional. It gets ``self.params`` (its Params) and ``self.ctx`` (a DefenseContext: seed, rounds,
client counts), never the experiment config."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ArrayRecord
from flwr.clientapp.typing import Mod

from flowerbed.clients.core.params import param
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.defenses import DEFENSES, Defense, update_mod


@DEFENSES.register("{name}", "TODO: one line for `flowerbed list defenses`")
class {cls}(Defense):
    @dataclass
    class Params:
        clip: float = param(1.0, gt=0)  # TODO: your knobs, typed, each with a rule
        noise: float = param(0.1, ge=0)

    params: Params

    #: capabilities the workload must offer (flowerbed.clients.core.capabilities.Capability)
    needs = frozenset()

    def mods(self) -> list[Mod]:
        return [update_mod(self.transform)]

    def transform(self, sent: ArrayRecord, trained: ArrayRecord, config: RoundConfig) -> ArrayRecord:
        """What the server receives instead of ``trained`` (``config["partition-id"]`` and
        ``config["server-round"]`` seed per-client randomness).

        TODO: the method. The skeleton is the identity, so the claim test fails.
        """
        return trained
'''

DEFENSE_TEST = '''\
"""Claim test of the defense `{name}`: it changes what the server receives (the final global
model differs from the undefended run's) on every seed. TODO: assert the method's headline
against the ablation too (an attack's success falls; utility stays within a margin)."""

import numpy as np
import pytest

from flowerbed.apps.inline import run_inline
from flowerbed.server.experiment import load_experiment

TINY = ["engine=inline", "rounds=1", "clients.num=2", "dataset.max_rows=600"]


def final_model(tmp_path, seed, defenses):
    cfg = load_experiment(
        "quickstart", [*TINY, f"seed={{seed}}", f"output.dir={{tmp_path}}", f"defenses={{defenses}}"]
    )
    run_dir = run_inline(cfg)["run_dir"]
    with np.load(f"{{run_dir}}/model.npz") as arrays:
        return {{k: arrays[k] for k in arrays.files}}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_{module}_changes_what_the_server_receives(tmp_path, seed):
    plain = final_model(tmp_path / "plain", seed, "[]")
    defended = final_model(tmp_path / "defended", seed, "[{{name: {name}}}]")
    gap = max(float(np.abs(plain[k] - defended[k]).max()) for k in plain)
    assert gap > 1e-6, "the defense left the update unchanged"
'''

ATTACK = '''\
"""{name}: a flowerbed attack. flowerbed's observer (``flowerbed.attacks.observer.AttackObserver``)
wraps the server's strategy and hands each target client's reply (and the arrays it was sent) to
``invert`` before aggregation, in the rounds and for the clients its Params name (they extend
``ObservedParams``: ``target_clients``, ``rounds``); the attack sees nothing else and answers
anything with a ``seconds`` field (``flowerbed.attacks.protocols.Answer``). It gets
``self.params`` (its Params) and ``self.ctx`` (an AttackContext: seed, rounds, clients, the public model of the capability it
needs, the defenses' published mechanisms), never the experiment config. Ground truth enters only
the scorer, which flowerbed builds from a TruthSource and calls after the attack has answered.

The skeleton guesses the share of class-1 examples in the target clients' round data; it answers
with its prior (1 / number of classes), the floor an attack must beat.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flowerbed.attacks import ATTACKS
from flowerbed.attacks.common import Attack, ObservedParams
from flowerbed.attacks.truth import TruthSource
from flowerbed.clients.contracts import RoundData
from flowerbed.clients.core.capabilities import Capability


def guess(sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], classes: int) -> float:
    """The share of class-1 examples in the client's round data, from what the server received.

    TODO: the method (e.g. the output bias's update). The skeleton returns the prior.
    """
    return 1.0 / classes


@dataclass
class Share:
    """The answer for one reply (the observer reports its ``seconds``)."""

    share: float
    classes: int
    seconds: float = 0.0


class Scorer:
    """Ground truth: the client's round data, rebuilt through the server's workload after the
    attack answered; the errors of the guess and of the prior."""

    def __init__(self, truth: TruthSource) -> None:
        self.truth = truth

    def score(self, partition_id: int, server_round: int, sent: dict, rec: Share) -> dict[str, float]:
        data = self.truth.partition(partition_id)
        labels = self.truth.offer(RoundData).round_data(data, partition_id, server_round).y
        share = float((labels == 1).float().mean())
        return {{"error": abs(rec.share - share), "prior_error": abs(1.0 / rec.classes - share)}}


@ATTACKS.register("{name}", "TODO: one line for `flowerbed list attacks`")
class {cls}(Attack):
    @dataclass
    class Params(ObservedParams):  # target_clients, rounds: whose replies, which rounds
        pass  # TODO: your knobs, each with a rule (flowerbed.clients.core.params.param)

    params: Params

    #: what the workload must offer: a classifier whose round data the scorer can rebuild
    needs = frozenset({{Capability.MODEL_LOSS}})
    scorer = Scorer

    def invert(self, sent: dict[str, torch.Tensor], reply: dict[str, torch.Tensor], num_examples: int) -> Share:
        """What the server infers from one reply (the public model: ``self.ctx.replay.contract``)."""
        classes = self.ctx.replay.contract.schema.num_classes
        return Share(guess(sent, reply, classes), classes)
'''

ATTACK_TEST = '''\
"""Claim test of the attack `{name}`: its error is below its prior's on every seed (the skeleton,
which answers with the prior, fails)."""

import pytest

from flowerbed.apps.inline import run_inline
from flowerbed.server.experiment import load_experiment

TINY = ["engine=inline", "rounds=1", "clients.num=2", "dataset.max_rows=600"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_{module}_beats_its_prior(tmp_path, seed):
    cfg = load_experiment(
        "quickstart",
        [*TINY, f"seed={{seed}}", f"output.dir={{tmp_path}}", "attack.name={name}",
         "workload.params.local_epochs=1", "workload.params.round_examples=8"],
    )
    metrics = run_inline(cfg)["metrics"]
    assert metrics["attack.error"] < metrics["attack.prior_error"] - 0.01
'''

STRATEGY = '''\
"""{name}: a flowerbed strategy, a Flower (Message API) strategy built from the config.

The global model: Flower hands it to ``configure_train`` (``arrays``), which keeps it, so
``aggregate_train`` can work on each client's update (its reply minus the global model). Only
Flower's public API is used (``FedAvg``, ``ArrayRecord``, ``Array``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flowerbed.clients.core.params import param
from flowerbed.strategies import STRATEGIES
from flowerbed.strategies.context import StrategyEntry


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """ArrayRecord -> named NumPy arrays."""
    return {{key: array.numpy() for key, array in record.items()}}


def from_numpy(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """Named NumPy arrays -> ArrayRecord (what a strategy returns as the new global model)."""
    return ArrayRecord({{key: Array(np.ascontiguousarray(value)) for key, value in arrays.items()}})


class {cls}Strategy(FedAvg):
    """TODO: the method, on the clients' updates in ``aggregate_train``. The skeleton is FedAvg
    with a server learning rate (``server_lr`` = 1: FedAvg, its ablation)."""

    def __init__(self, server_lr: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.server_lr = server_lr
        self.global_model: ArrayRecord | None = None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.global_model = arrays  # the model this round's clients start from
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        mean, metrics = super().aggregate_train(server_round, replies)  # failed replies dropped
        if mean is None or self.global_model is None:
            return mean, metrics
        start = to_numpy(self.global_model)
        ok = [r for r in replies if not r.has_error()]
        updates = [{{k: v - start[k] for k, v in to_numpy(r.content["arrays"]).items()}} for r in ok]
        weights = [float(r.content["metrics"]["num-examples"]) for r in ok]
        # TODO: the method, on ``updates``; the skeleton's step is FedAvg's (their weighted mean)
        pairs = list(zip(weights, updates, strict=True))
        step = {{k: sum(w * u[k] for w, u in pairs) / sum(weights) for k in start}}
        return from_numpy(
            {{k: (start[k] + self.server_lr * step[k]).astype(start[k].dtype) for k in start}}
        ), metrics


@STRATEGIES.register("{name}", "TODO: one line for `flowerbed list strategies`")
class {cls}(StrategyEntry):
    #: capabilities of the workload it needs (``flowerbed.clients.core.capabilities``), checked
    #: when a config is resolved; their Protocols are reached through ``self.ctx.offer(...)``
    needs = frozenset()

    @dataclass
    class Params:
        server_lr: float = param(1.0, gt=0)  # TODO: your knobs, typed, each with a rule

    params: Params

    def strategy(self) -> FedAvg:
        """The Flower strategy that runs, from ``self.params`` (its typed params) and
        ``self.ctx`` (a narrow StrategyContext: seed, rounds, client sampling, workload)."""
        return {cls}Strategy(self.params.server_lr, **self.ctx.sampling.kwargs())
'''

STRATEGY_TEST = '''\
"""Claim test of the strategy `{name}`: it reaches a lower central loss than FedAvg, its
ablation, on every seed (the skeleton, which is FedAvg, fails)."""

import pytest

from flowerbed.apps.inline import run_inline
from flowerbed.server.experiment import load_experiment

TINY = ["engine=inline", "rounds=2", "clients.num=3", "dataset.max_rows=900"]


def loss(tmp_path, seed, strategy):
    cfg = load_experiment(
        "quickstart",
        [*TINY, f"seed={{seed}}", f"output.dir={{tmp_path}}", f"strategy.name={{strategy}}"],
    )
    return run_inline(cfg)["metrics"]["central.loss"]


# An accuracy headline. A robustness method asserts the same way under clients that lie (its
# accuracy above FedAvg's there, and within 0.01 of it without them); a privacy defense asserts
# attack.advantage below the undefended run's: docs/contributing.md, "Claim-test templates".
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_{module}_beats_fedavg(tmp_path, seed):
    assert loss(tmp_path / "m", seed, "{name}") < loss(tmp_path / "f", seed, "fedavg") - 1e-4
'''

WORKLOAD = '''\
"""{name}: a flowerbed workload, top to bottom: data (seeded, generated), model, local step,
metrics, registration. The skeleton is linear regression on generated data whose local step is
missing, so the claim test fails until ``local_step`` learns.

It gets ``self.params`` (its Params) and ``self.ctx`` (a WorkloadContext: seed, rounds, number of
clients, device, the shared data settings it ``reads``), never the experiment config."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from flowerbed.clients.core.params import param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import Workload, WORKLOADS

# -- 1. data -------------------------------------------------------------------------------------


def generate_client(experiment_seed: int, seed: int, params: {cls}.Params) -> tuple[np.ndarray, np.ndarray]:
    """A client's rows ``y = x @ w* + noise``: its own inputs (``seed``), the experiment's ``w*``."""
    w_star = np.random.default_rng([experiment_seed, 0]).normal(size=params.features)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(params.samples, params.features))
    return x, x @ w_star + 0.1 * rng.normal(size=params.samples)


# -- 2. model, 3. local step, 4. metrics ---------------------------------------------------------


def local_step(w: np.ndarray, x: np.ndarray, y: np.ndarray, lr: float, steps: int) -> np.ndarray:
    """TODO: the method (e.g. ``steps`` of gradient descent on the squared error)."""
    return w


def mse(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((x @ w - y) ** 2))


# -- 5. registration -----------------------------------------------------------------------------


@WORKLOADS.register("{name}", "TODO: one line for `flowerbed list workloads`")
class {cls}(Workload):
    @dataclass
    class Params:
        features: int = param(5, ge=1)  # TODO: your knobs, typed, each with a rule
        samples: int = param(64, ge=2)
        lr: float = param(0.1, gt=0)
        local_steps: int = param(5, ge=1)

    params: Params

    #: what attacks and defenses may rely on (flowerbed.clients.core.capabilities.Capability)
    offers = frozenset()

    def load_partition(self, partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
        seed = client_seed(self.ctx.seed, partition_id, 0)
        return generate_client(self.ctx.seed, seed, self.params)

    def init_arrays(self) -> ArrayRecord:
        return ArrayRecord({{"w": Array(np.zeros(self.params.features))}})

    def fit(
        self, arrays: ArrayRecord, data: tuple[np.ndarray, np.ndarray], config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        x, y = data
        w = local_step(arrays["w"].numpy(), x, y, self.params.lr, self.params.local_steps)
        return ArrayRecord({{"w": Array(w)}}), {{"num-examples": len(y), "loss": mse(w, x, y)}}

    def evaluate(self, arrays: ArrayRecord, data: tuple[np.ndarray, np.ndarray], config: RoundConfig) -> dict[str, float]:
        x, y = data
        return {{"num-examples": len(y), "mse": mse(arrays["w"].numpy(), x, y)}}

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        x, y = generate_client(self.ctx.seed, self.ctx.seed + 10_000, self.params)
        return {{"mse": mse(arrays["w"].numpy(), x, y)}}

'''

WORKLOAD_TEST = '''\
"""Claim test of the workload `{name}`: federated training lowers the central error well below
the untrained model's on every seed (the skeleton, whose local step does nothing, fails)."""

import pytest

from flowerbed.apps.inline import run_inline
from flowerbed.clients.workloads import build_workload
from flowerbed.server.experiment import load_experiment


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_{module}_learns(tmp_path, seed):
    experiment = tmp_path / "{module}.yaml"
    experiment.write_text("workload: {{name: {name}}}\\n")
    cfg = load_experiment(
        str(experiment),
        ["engine=inline", "rounds=3", "clients.num=3", f"seed={{seed}}", f"output.dir={{tmp_path}}"],
    )
    workload = build_workload(cfg)
    untrained = workload.server_evaluate(0, workload.init_arrays())["mse"]
    trained = run_inline(cfg)["metrics"]["central.mse"]
    assert trained < 0.5 * untrained
'''

TEMPLATES = {
    "defense": (DEFENSE, DEFENSE_TEST, "write `transform` (and a server half if it has one)."),
    "attack": (ATTACK, ATTACK_TEST, "write `guess` (what the server can infer from a reply)."),
    "strategy": (STRATEGY, STRATEGY_TEST, "write the method on `updates` in `aggregate_train`."),
    "workload": (WORKLOAD, WORKLOAD_TEST, "write `local_step`, then your data and model."),
}
RUN_LINES = {
    "defense": "flowerbed run quickstart --engine inline 'defenses=[{{name: {name}}}]'",
    "attack": "flowerbed run quickstart --engine inline attack.name={name}",
    "strategy": "flowerbed run quickstart --engine inline strategy.name={name}",
    "workload": "echo 'workload: {{name: {name}}}' > {module}.yaml && flowerbed run {module}.yaml --engine inline",
}
