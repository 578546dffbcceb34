"""Defenses: DP-SGD accounting, compression mechanics, secure aggregation's visibility."""

import numpy as np
import pytest
from opacus.accountants import RDPAccountant

from flowerbed.apps.inline import run_inline
from flowerbed.attacks import ATTACKS
from flowerbed.attacks.common import Attack
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.defenses import DefenseContext
from flowerbed.clients.defenses.compression import quantize, topk

SEEN: dict[int, list] = {}


@ATTACKS.register("record-replies", "test helper: records what the observer position receives")
class RecordReplies(Attack):
    reads_aggregates = True  # it records whatever the observer position receives

    def wrap(self, strategy, writer, scorer):
        class Recorder(StrategyWrapper):
            def aggregate_train(self, server_round, replies):
                replies = list(replies)
                SEEN[server_round] = [
                    (int(r.content["metrics"]["partition-id"]), r.content["arrays"])
                    for r in replies
                ]
                return self.inner.aggregate_train(server_round, replies)

        return Recorder(strategy)


def _train_arrays(seen):
    return {pid: {k: v.numpy() for k, v in arrays.items()} for pid, arrays in seen}


def test_secagg_observer_gets_only_the_aggregate(inline_cfg):
    base = ["rounds=1", "clients.num=3", "dataset.max_rows=3000", "attack.name=record-replies"]
    SEEN.clear()
    run_inline(inline_cfg("quickstart", *base))
    individual = _train_arrays(SEEN[1])
    assert sorted(individual) == [0, 1, 2]
    SEEN.clear()
    run_inline(inline_cfg("quickstart", *base, "defenses=[{name: secagg}]"))
    assert len(SEEN[1]) == 1 and SEEN[1][0][0] == -1
    (aggregate,) = _train_arrays(SEEN[1]).values()
    key = next(iter(aggregate))
    assert all(not np.allclose(aggregate[key], arrays[key]) for arrays in individual.values())
    assert np.allclose(
        aggregate[key], np.mean([a[key] for a in individual.values()], axis=0), atol=0.05
    )


def test_dp_sgd_epsilon_equals_opacus_accountant_and_accumulates(inline_cfg):
    cfg = inline_cfg(
        "quickstart", "rounds=2", "clients.num=2", "dataset.max_rows=2000",
        "defenses=[{name: dp-sgd, params: {noise_multiplier: 1.1, max_grad_norm: 1.0, delta: 1e-5, audit_trials: 50}}]",
    )  # fmt: skip
    summary = run_inline(cfg)
    from flowerbed.server.results import read_history

    rows = [r for r in read_history(summary["run_dir"]) if r["scope"] == "train"]
    assert rows[1]["epsilon_max"] > rows[0]["epsilon_max"] > 0
    # the worst client's cumulative steps over both rounds, replayed in a fresh Opacus accountant
    steps, rate = int(rows[1]["dp_steps"]), rows[1]["dp_sample_rate"]
    accountant = RDPAccountant()
    for _ in range(steps):
        accountant.step(noise_multiplier=1.1, sample_rate=rate)
    # dp_steps is averaged over clients with equal data, so both clients took the same steps
    assert summary["metrics"]["dp.epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-6)


def test_dp_sgd_rejected_for_workload_without_private_training():
    from flowerbed.clients.core.errors import ConfigError
    from flowerbed.clients.workloads import WORKLOADS
    from flowerbed.server.experiment import load_experiment

    assert "private-training" not in WORKLOADS.get("flowleak").offers
    with pytest.raises(ConfigError, match="needs private-training, which workload 'flowleak'"):
        load_experiment("flowleak", ["defenses=[{name: dp-sgd}]"])


def test_topk_keeps_the_largest_fraction():
    rng = np.random.default_rng(0)
    deltas = {"a": rng.normal(size=(20, 10)), "b": rng.normal(size=50)}
    kept = topk(deltas, 0.1)
    flat = np.concatenate([v.ravel() for v in kept.values()])
    assert np.count_nonzero(flat) == 25
    everything = np.concatenate([v.ravel() for v in deltas.values()])
    assert np.abs(flat[flat != 0]).min() >= np.sort(np.abs(everything))[-25]


def test_quantize_levels_and_unbiased():
    rng = np.random.default_rng(1)
    deltas = {"w": rng.normal(size=4000)}
    q = quantize(deltas, 2, np.random.default_rng(2))["w"]
    assert len(np.unique(q)) <= 4
    assert abs(q.mean() - deltas["w"].mean()) < 0.05


AGGREGATES: dict[int, dict] = {}


@ATTACKS.register("record-aggregate", "test helper: records replies and the aggregate below")
class RecordAggregate(Attack):
    def wrap(self, strategy, writer, scorer):
        class Recorder(StrategyWrapper):
            def aggregate_train(self, server_round, replies):
                replies = list(replies)
                arrays, metrics = self.inner.aggregate_train(server_round, replies)
                AGGREGATES[server_round] = {
                    "replies": [_numpy(r.content["arrays"]) for r in replies],
                    "aggregate": _numpy(arrays),
                }
                return arrays, metrics

        return Recorder(strategy)


def _numpy(arrays) -> np.ndarray:
    return np.concatenate([v.numpy().ravel().astype(np.float64) for v in arrays.values()])


def test_central_dp_clips_updates_and_noises_the_aggregate(inline_cfg):
    """Flower's central DP (client clipping): what the curious server sees is clipped to C, the
    aggregate carries Gaussian noise of std sigma * C / n, and epsilon follows the accountant."""
    sigma, clip, n = 2.0, 0.05, 3
    cfg = inline_cfg(
        "quickstart", "rounds=1", f"clients.num={n}", "dataset.max_rows=3000",
        "attack.name=record-aggregate",
        f"defenses=[{{name: central-dp, params: {{noise_multiplier: {sigma}, "
        f"clipping_norm: {clip}, clipping: client, audit_trials: 100}}}}]",
    )  # fmt: skip
    from flowerbed.clients.workloads import build_workload

    sent = _numpy(build_workload(cfg).init_arrays())
    AGGREGATES.clear()
    summary = run_inline(cfg)
    seen = AGGREGATES[1]
    updates = [r - sent for r in seen["replies"]]
    assert all(np.linalg.norm(u) <= clip * (1 + 1e-4) for u in updates)
    assert max(np.linalg.norm(u) for u in updates) > clip * 0.99  # clipping was active
    noise = seen["aggregate"] - np.mean(seen["replies"], axis=0)
    assert np.std(noise) == pytest.approx(sigma * clip / n, rel=0.1)
    accountant = RDPAccountant()
    accountant.step(noise_multiplier=sigma, sample_rate=1.0)
    assert summary["metrics"]["dp.epsilon"] == pytest.approx(accountant.get_epsilon(1e-5))
    # one round at rate 1: the run's epsilon is the audited round's (tests/clients/test_dp_audit.py)
    assert summary["metrics"]["dp.epsilon_audit_step"] <= summary["metrics"]["dp.epsilon"]


def test_secagg_groups_reveal_only_group_sums(inline_cfg):
    base = ["rounds=1", "clients.num=4", "dataset.max_rows=3000", "attack.name=record-replies"]
    SEEN.clear()
    run_inline(inline_cfg("quickstart", *base))
    individual = _train_arrays(SEEN[1])
    SEEN.clear()
    run_inline(
        inline_cfg("quickstart", *base, "defenses=[{name: secagg, params: {group_size: 2}}]")
    )
    assert [pid for pid, _ in SEEN[1]] == [-1, -1]
    key = next(iter(individual[0]))
    for (_, arrays), members in zip(SEEN[1], ([0, 1], [2, 3]), strict=True):
        group = np.mean([individual[m][key] for m in members], axis=0)
        assert np.allclose(arrays[key].numpy(), group, atol=1e-5)
        assert all(not np.allclose(arrays[key].numpy(), individual[m][key]) for m in members)


def test_bytes_per_round_count_the_compressed_encoding(inline_cfg):
    """Dense replies cost their array bytes; top-k 8 bytes per kept entry (float32 value + int32
    index); b-bit quantisation b bits per entry plus each tensor's min and max."""
    base = ["rounds=1", "clients.num=2", "dataset.max_rows=2000"]

    def per_client(defenses: str) -> float:
        metrics = run_inline(inline_cfg("quickstart", *base, f"defenses={defenses}"))["metrics"]
        assert metrics["comm.upload_bytes"] == 2 * metrics["comm.upload_bytes_per_client"]
        return metrics["comm.upload_bytes_per_client"]

    from flowerbed.clients.workloads import build_workload

    cfg = inline_cfg("quickstart", *base)
    arrays = build_workload(cfg).init_arrays()
    sizes = [arrays[k].numpy().size for k in arrays]
    assert per_client("[]") == 4 * sum(sizes)
    kept = per_client("[{name: topk, params: {fraction: 0.1}}]")
    assert kept <= 8 * round(0.1 * sum(sizes)) and kept >= 0.9 * 8 * round(0.1 * sum(sizes))
    assert per_client("[{name: quantize, params: {bits: 4}}]") == sum(
        -(-n * 4 // 8) + 8 for n in sizes
    )


def test_defenses_publish_their_public_mechanism():
    """What defense-aware attacks adapt to, as typed data from each defense's own params."""
    from flowerbed.clients.defenses import (
        Aggregation,
        GaussianNoise,
        Quantisation,
        Sparsification,
        WeightFlipping,
    )
    from flowerbed.clients.defenses.central_dp import CentralDp
    from flowerbed.clients.defenses.dp_sgd import DpSgd
    from flowerbed.clients.defenses.filosofer import Filosofer
    from flowerbed.clients.defenses.local_dp import LocalDp
    from flowerbed.clients.defenses.quantize import Quantize
    from flowerbed.clients.defenses.secagg import SecAgg
    from flowerbed.clients.defenses.topk import TopK

    cfg = DefenseContext(seed=0, rounds=1, num_clients=2, sampled_clients=2, run_key="test")
    assert TopK({"fraction": 0.2}, cfg).mechanism() == [Sparsification(0.2)]
    assert Quantize({"bits": 3}, cfg).mechanism() == [Quantisation(3)]
    assert SecAgg({"group_size": 4}, cfg).mechanism() == [Aggregation(4, 2)]
    assert Filosofer({"rho": 0.05}, cfg).mechanism() == [WeightFlipping(0.05)]
    assert DpSgd({"noise_multiplier": 2.0, "max_grad_norm": 0.5}, cfg).mechanism() == [
        GaussianNoise(2.0, 0.5, "per-example", on_update=True)
    ]
    assert CentralDp({"noise_multiplier": 2.0}, cfg).mechanism() == [
        GaussianNoise(2.0, 1.0, "aggregate", on_update=False)
    ]
    (local,) = LocalDp({"clipping_norm": 2.0, "epsilon": 1.0}, cfg).mechanism()
    assert local.where == "update" and local.on_update and local.clipping_norm == 2.0
    assert local.noise_multiplier == pytest.approx(np.sqrt(2 * np.log(1.25e5)) / 2.0)


def test_defenses_get_a_typed_context_not_the_experiment_config():
    """A defense is built from its Params and a ``DefenseContext`` (seed, rounds, client counts);
    the experiment config is refused, and no defense module reads one by key."""
    import re
    from pathlib import Path

    from flowerbed.clients.core.config import decode
    from flowerbed.clients.defenses import DEFENSES, build_defenses
    from flowerbed.clients.defenses.topk import TopK

    with pytest.raises(TypeError, match="DefenseContext"):
        TopK({"fraction": 0.2}, {"seed": 0})
    # the package's __init__ builds the context from the config; the defenses never see it
    sources = Path(__file__).resolve().parents[2] / "clients" / "defenses"
    modules = [p for p in sources.glob("*.py") if p.name != "__init__.py"]
    assert len(modules) >= len(DEFENSES.names()) - 1
    readers = [p.name for p in modules if re.search(r"\bcfg\[|\.cfg\b", p.read_text())]
    assert readers == [], readers
    data = {"seed": 3, "rounds": 4, "clients": {"num": 10, "fraction": 0.3, "min_clients": 2},
            "defenses": [{"name": "quantize", "params": {"bits": 2}}], "output": {"dir": "x"}}  # fmt: skip
    cfg = decode(data, defenses=DEFENSES)
    (defense,) = build_defenses(cfg)
    assert defense.ctx == DefenseContext.of(cfg)
    assert (defense.ctx.seed, defense.ctx.rounds, defense.ctx.sampled_clients) == (3, 4, 3)
    assert "output" not in defense.ctx.run_key and defense.params.bits == 2


@pytest.fixture
def task_identity(monkeypatch):
    """A Message outside a run needs Flower's task identity (restored after the test)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1, raising=False)


def _train_reply(pid: int, arrays: dict, examples: int):
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

    content = RecordDict({
        "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
        "metrics": MetricRecord({"num-examples": examples, "partition-id": pid}),
    })  # fmt: skip
    return Message(content, dst_node_id=0, message_type="train")


@pytest.mark.parametrize("group_size", [0, 2, 3])
def test_secagg_server_view_never_equals_a_single_clients_update(group_size, task_identity):
    """What the strategy behind secure aggregation receives, for 5 clients' replies: no reply
    equals any single client's update; each is its members' example-weighted mean, and the
    members cover every client once, none alone."""
    from flowerbed.clients.defenses.secagg import MEMBERS_RECORD, AggregateOnlyView

    seen = []

    class Behind:
        def aggregate_train(self, server_round, replies):
            seen.extend(replies)
            return None, None

    rng = np.random.default_rng(0)
    updates = {p: {"w": rng.normal(size=(3, 4)), "b": rng.normal(size=4)} for p in range(5)}
    examples = {p: 10 + 7 * p for p in range(5)}
    view = AggregateOnlyView(Behind(), min_clients=2, group_size=group_size)
    view.aggregate_train(1, [_train_reply(p, u, examples[p]) for p, u in updates.items()])
    members = [list(r.content[MEMBERS_RECORD]["members"]) for r in seen]
    assert sorted(p for group in members for p in group) == list(range(5))
    for reply, group in zip(seen, members, strict=True):
        assert len(group) >= 2
        got = {k: reply.content["arrays"][k].numpy() for k in ("w", "b")}
        for p, update in updates.items():
            assert not all(np.allclose(got[k], update[k]) for k in got), (group_size, p)
        total = sum(examples[p] for p in group)
        for k in got:
            mean = sum(updates[p][k] * examples[p] for p in group) / total
            np.testing.assert_allclose(got[k], mean, rtol=1e-6)


def test_quantize_reply_is_decoded_from_the_bytes_it_counts(task_identity):
    """The quantize defense's client mod, as a run calls it: the reply's wire-bytes is the length
    of the encoding the client built, and the arrays the server gets are decoded from it."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

    from flowerbed.clients.defenses import WIRE_BYTES
    from flowerbed.clients.defenses.compression import decode_quantized, encode_quantized
    from flowerbed.clients.defenses.quantize import Quantize

    rng = np.random.default_rng(1)
    sent = {"w": rng.normal(size=(9, 5)).astype(np.float32), "b": np.zeros(3, np.float32)}
    trained = {k: (v + rng.normal(0, 0.1, v.shape)).astype(np.float32) for k, v in sent.items()}
    ctx = DefenseContext(seed=4, rounds=1, num_clients=2, sampled_clients=2, run_key="t")
    (mod,) = Quantize({"bits": 3}, ctx).mods()
    msg = Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in sent.items()}),
                              "config": ConfigRecord({"server-round": 2})}),
                  dst_node_id=0, message_type="train")  # fmt: skip
    context = Context(run_id=0, node_id=0, node_config={"partition-id": 1}, state=RecordDict(),
                      run_config={})  # fmt: skip
    reply = mod(msg, context, lambda m, c: _train_reply(1, trained, 9))
    deltas = {k: trained[k].astype(np.float64) - sent[k] for k in sent}
    payload = encode_quantized(deltas, 3, np.random.default_rng([4, 1, 2, 11]))
    assert reply.content["metrics"][WIRE_BYTES] == len(payload) == (8 + 17) + (8 + 2)
    decoded = decode_quantized(payload, {k: v.shape for k, v in sent.items()}, 3)
    for k in sent:
        np.testing.assert_allclose(reply.content["arrays"][k].numpy(), sent[k] + decoded[k],
                                   atol=1e-6)  # fmt: skip
        assert len(np.unique(np.round(decoded[k], 6))) <= 2**3  # at most 2^bits levels sent
