"""The run-level DP audit: canaries inserted into the run itself, scored from what the server
received (``dp.epsilon_audit``) and from the final model only (``dp.epsilon_audit_final``).

One run, many canaries, each included with probability 1/2 by a coin only the auditor knows
(Steinke, Nasr & Jagielski 2023); a canary is a random direction ``u`` in the model's parameter
space, drawn afresh for every round from (run seed, unit, canary, round), so the server can score
it and a canary's contribution changes from round to round (noise reused across rounds then
cancels in the round-centred statistic). Per DP path (docs/methods/dp-audit.md):

- ``dp-sgd`` (``DpSgdCanaries``): every client's local dataset gets ``canaries`` extra slots,
  sampled by the run's own data loader (Opacus' Poisson sampling) like any example; when a slot
  is drawn its per-example gradient is set, before Opacus clips and noises it, to ``100 C u``
  (canary in) or to zero (out: the same as absent). The canaries are in the trained model. On
  the per-sample path (tabdiff) ``DpSgd.privatize`` adds an in-canary's gradient to a step with
  the rate the accountant records.
- ``local-dp`` (``LocalDpCanaries``): canary clients whose update ``100 C (+-h u + ...)`` goes out
  through the defense's own mods (``LocalDp.mods()``, as the ClientApp builds them) every round;
  scored on each canary's own reply (what the server receives).
- ``central-dp`` (``CentralDpCanaries``): every round, a second release through the defense's own
  ``wrap_strategy`` (Flower's DP wrapper, server or client clipping, over FedAvg) of the round's
  real replies plus one slot per canary client (update ``100 C u`` in, zero out, sampled like a
  client), through the defense's client mods; scored on that release. The run's own model carries
  no canary.

Scores (higher: "more likely in"): ``sum`` = sum over rounds of the update's projection on that
round's ``u``; ``centred`` = the same after subtracting the unit's mean update over its rounds
(the statistic that exposes noise reused across rounds); ``paired`` (dp-sgd) = after subtracting
the mean of the round's other replies (same model, similar data: it removes most of the data's
own gradient, which otherwise drowns a canary in a small model); ``final`` = the final model minus the
initial one projected on the sum of the ``u``. The bound and the decision rule:
``clients/core/dp_audit.py: one_run_audit``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.common.constant import SType
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Strategy
from torch.utils.data import Dataset

from flowerbed.clients.core.dp_audit import DEFAULT_CONFIDENCE, OneRunResult, one_run_audit
from flowerbed.clients.core.wrapper import StrategyWrapper
from flowerbed.clients.defenses.flower_dp import AuditGrid, AuditProcess

if TYPE_CHECKING:
    from opacus.optimizers import DPOptimizer

    from flowerbed.clients.defenses import DefenseContext, RunWriter

PARTITION_KEY = "partition-id"
#: canary gradients and updates have norm ``CANARY * C``: clipping always acts on them, and a run
#: whose clipping is off or too loose lets them through 100 times larger
CANARY = 100.0
#: salts of the auditor's seeds (coins, directions, canary-client sampling, shadow noise)
COINS, DIRECTIONS, SAMPLING, NOISE = 51, 52, 53, 54
#: the canary clients of local and central DP form one unit (dp-sgd: one unit per partition)
CANARY_CLIENTS = 1_000_000
#: default number of canary clients (local and central DP)
CANARY_CLIENT_COUNT = 32

Layout = list[tuple[str, tuple[int, ...]]]


def canary_coins(seed: int, unit: int, count: int) -> np.ndarray:
    """Which of a unit's canaries are in: independent fair coins, the auditor's secret."""
    return np.random.default_rng([seed, COINS, unit]).random(count) < 0.5


def layout_of(arrays: Mapping[str, np.ndarray | torch.Tensor]) -> Layout:
    """The parameter layout canaries live in: floating-point arrays, sorted by name."""
    out = []
    for key in sorted(arrays):
        value = arrays[key]
        dtype = value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype
        if np.issubdtype(np.dtype(str(dtype).removeprefix("torch.")), np.floating):
            out.append((key, tuple(value.shape)))
    return out


def flat(arrays: Mapping[str, np.ndarray], layout: Layout) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k], np.float64).ravel() for k, _ in layout])


def directions(seed: int, unit: int, server_round: int, count: int, layout: Layout) -> np.ndarray:
    """``(count, d)`` unit vectors: canary i's direction in ``server_round``, random signs
    ``+-1 / sqrt(d)`` (Rademacher: a projection of isotropic noise on one is the same Gaussian as on
    an isotropic direction, and its bits cost a tenth of normal draws -- drawn for every client and
    round, on the client and again on the server)."""
    d = sum(int(np.prod(shape)) for _, shape in layout)
    packed = np.empty((count, (d + 7) // 8), np.uint8)
    for i in range(count):
        rng = np.random.default_rng([seed, DIRECTIONS, unit, i, server_round])
        packed[i] = np.frombuffer(rng.bytes(packed.shape[1]), np.uint8)
    out = np.unpackbits(packed, axis=1, count=d).astype(np.float64)
    out *= 2 / np.sqrt(d)
    out -= 1 / np.sqrt(d)
    return out


def unflat(vector: np.ndarray, layout: Layout) -> dict[str, np.ndarray]:
    out, start = {}, 0
    for key, shape in layout:
        size = int(np.prod(shape))
        out[key] = vector[start : start + size].reshape(shape)
        start += size
    return out


# -- the auditor's own Flower arrays ----------------------------------------------------------
class WireArray(Array):
    """A Flower ``Array`` holding exactly the bytes ``Array(ndarray)`` holds (``np.save``'s npy
    format), built from a cached header and read back as a copy of its bytes: ``np.save`` and
    ``np.load`` of every array of every canary client were most of the audit's cost. Only the
    messages the auditor builds carry these (the canary clients' model and trained arrays, the
    second release's copies of the real replies); the mods and wrappers run unchanged on them and
    build plain Arrays for what they output."""

    def numpy(self) -> np.ndarray:
        return decode(self)


@functools.lru_cache(maxsize=512)
def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The npy header ``np.save`` writes before an array of ``dtype`` and ``shape``."""
    zeros = np.zeros(shape, np.dtype(dtype))
    buffer = io.BytesIO()
    np.save(buffer, zeros, allow_pickle=False)
    data = buffer.getvalue()
    return data[: len(data) - zeros.nbytes]


def encode(values: np.ndarray) -> Array:
    """``Array(values)``'s bytes, without ``np.save``."""
    arr = np.asarray(values, order="C")  # (ascontiguousarray makes a 0-d array 1-d)
    shape = tuple(int(n) for n in arr.shape)
    data = _npy_header(arr.dtype.str, shape) + arr.tobytes()
    return WireArray(dtype=str(arr.dtype), shape=shape, stype=SType.NUMPY, data=data)


def decode(array: Array) -> np.ndarray:
    """``array.numpy()`` (a writable copy), without ``np.load`` when the bytes are the npy format
    of a C-ordered array of the declared dtype and shape (else Flower's own decoding)."""
    data, dtype = array.data, np.dtype(array.dtype)
    header = _npy_header(dtype.str, tuple(array.shape))
    if array.stype != SType.NUMPY or data[: len(header)] != header:
        return Array.numpy(array)
    return np.frombuffer(data, dtype, offset=len(header)).reshape(array.shape).copy()


def wire_record(arrays: Mapping[str, Array]) -> ArrayRecord:
    """An ArrayRecord keeping these Array objects (``ArrayRecord(dict)`` rebuilds plain ones)."""
    record = ArrayRecord()
    for key, array in arrays.items():
        record[key] = array
    return record


def rewired(record: ArrayRecord) -> ArrayRecord:
    """The same arrays (the same bytes, not copied) as ``WireArray``s."""
    return wire_record({k: _rewire(record[k]) for k in record})


def _rewire(array: Array) -> Array:
    return WireArray(
        dtype=array.dtype, shape=tuple(array.shape), stype=array.stype, data=array.data
    )


# -- scoring ------------------------------------------------------------------------------------
@dataclasses.dataclass
class UnitScores:
    """One unit's canaries (a client's canary examples, or the canary clients): their coins and
    the running sums the statistics need. An update is the unit's (``(d,)``, shared by its
    canaries) or one per canary (``(m, d)``: each canary client's own reply)."""

    included: np.ndarray
    sign: float
    plain: np.ndarray | None = None  # sum over rounds of <update_r, u_ir>
    directions: np.ndarray | None = None  # sum over rounds of u_ir
    updates: np.ndarray | None = None  # sum over rounds of update_r
    paired: np.ndarray | None = None  # sum over rounds of <update_r - reference_r, u_ir>
    diffs: np.ndarray | None = None  # sum over rounds of update_r - reference_r
    rounds: int = 0

    def observe(self, update: np.ndarray, dirs: np.ndarray, reference: np.ndarray | None = None) -> None:  # fmt: skip
        """Add a round: the unit's update(s), its canaries' directions, and optionally a
        reference update (the mean of the round's other clients: same model, similar data)."""
        if reference is not None:
            diff = self.sign * (dirs @ (update - reference))
            self.paired = diff if self.paired is None else self.paired + diff
            gap = update - reference
            self.diffs = gap if self.diffs is None else self.diffs + gap
        proj = self.sign * (dirs @ update if update.ndim == 1 else np.einsum("ij,ij->i", dirs, update))  # fmt: skip
        if self.plain is None or self.directions is None or self.updates is None:
            self.plain, self.directions, self.updates = proj, dirs.copy(), update.copy()
        else:  # in place: the (m, d) sum is the largest array of the audit
            self.plain = self.plain + proj
            self.directions += dirs
            self.updates += update
        self.rounds += 1

    def scores(self) -> dict[str, np.ndarray]:
        if self.plain is None or self.directions is None or self.updates is None:
            return {"sum": np.zeros(len(self.included)), "centred": np.zeros(len(self.included))}
        mean = self.updates / self.rounds
        shared = self.directions @ mean if mean.ndim == 1 else np.einsum("ij,ij->i", self.directions, mean)  # fmt: skip
        out = {"sum": self.plain, "centred": self.plain - self.sign * shared}
        if self.paired is not None and self.diffs is not None:
            out["paired"] = self.paired
            out["paired-centred"] = self.paired - self.sign * (self.directions @ (self.diffs / self.rounds))  # fmt: skip
        return out

    def final(self, change: np.ndarray) -> np.ndarray:
        if self.directions is None:
            return np.zeros(len(self.included))
        return self.sign * (self.directions @ change)


def audit_metrics(units: Iterable[UnitScores], delta: float, change: np.ndarray | None) -> dict[str, float]:  # fmt: skip
    """``dp.*`` metrics of the run-level audit from every unit's canaries."""
    units = list(units)
    if not units:
        return {}
    included = np.concatenate([u.included for u in units])
    stats = [u.scores() for u in units]
    names = [k for k in stats[0] if all(k in s for s in stats)]
    scores = {k: np.concatenate([s[k] for s in stats]) for k in names}
    seen = one_run_audit(scores, included, delta)
    out = _metrics(seen, "")
    if change is not None:
        final = one_run_audit({"final": np.concatenate([u.final(change) for u in units])}, included, delta)  # fmt: skip
        out.update(_metrics(final, "_final"))
    return out


def _metrics(result: OneRunResult, suffix: str) -> dict[str, float]:
    out = {f"epsilon_audit{suffix}": result.epsilon, f"epsilon_audit{suffix}_max": result.epsilon_max}  # fmt: skip
    if not suffix:
        out.update({"audit_canaries": float(result.canaries), "audit_guesses": float(result.guesses),
                    "audit_correct": float(result.correct)})  # fmt: skip
    return out


class CanaryAudit:
    """What a DP defense inserts into a run and how its canaries are scored (subclasses)."""

    def __init__(self, seed: int, delta: float) -> None:
        self.seed, self.delta = seed, delta
        self.units: dict[int, UnitScores] = {}
        self.layout: Layout | None = None

    def observe(self, server_round: int, sent: ArrayRecord, replies: Sequence[Message]) -> None:
        """Score what the server received in a training round (before it aggregates)."""

    def final_change(self, initial: ArrayRecord, final: ArrayRecord) -> np.ndarray | None:
        """The final model minus the initial one (None: this audit has no final-model view)."""
        layout = self.layout or layout_of(_numpy(initial))
        return flat(_numpy(final), layout) - flat(_numpy(initial), layout)

    def metrics(self, initial: ArrayRecord | None, final: ArrayRecord | None) -> dict[str, float]:
        change = None if initial is None or final is None else self.final_change(initial, final)
        return audit_metrics(self.units.values(), self.delta, change)


def _numpy(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: decode(arrays[k]) for k in arrays}


class DpSgdCanaries(CanaryAudit):
    """Canary examples in every client's training loop (``DpSgd.make_private``); each reply's
    update (reply - sent) is projected on the client's canary directions of that round. SGD
    steps against the gradient, so the sign is -1."""

    def __init__(self, seed: int, delta: float, per_client: int) -> None:
        super().__init__(seed, delta)
        self.per_client = per_client

    def observe(self, server_round: int, sent: ArrayRecord, replies: Sequence[Message]) -> None:
        before = _numpy(sent)
        self.layout = self.layout or layout_of(before)
        base = flat(before, self.layout)
        ok = [r for r in replies if not r.has_error() and "arrays" in r.content
              and "metrics" in r.content and PARTITION_KEY in r.content["metrics"]]  # fmt: skip
        updates = {int(cast(int, r.content["metrics"][PARTITION_KEY])): flat(_numpy(r.content.array_records["arrays"]), self.layout) - base
                   for r in ok}  # fmt: skip
        total = sum(updates.values())
        for unit, update in updates.items():
            if unit not in self.units:
                self.units[unit] = UnitScores(canary_coins(self.seed, unit, self.per_client), -1.0)
            dirs = directions(self.seed, unit, server_round, self.per_client, self.layout)
            others = (total - update) / (len(updates) - 1) if len(updates) > 1 else None
            self.units[unit].observe(update, dirs, others)


# -- dp-sgd: canary slots in the client's dataset -----------------------------------------------
class IndexedExamples(Protocol):
    """A client's training examples as a DataLoader indexes them (a ``TensorDataset``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]: ...


class _Clipped(Protocol):
    @property
    def clipping_norm(self) -> float: ...


class _LocalDpParams(_Clipped, Protocol):
    @property
    def sensitivity(self) -> float: ...


class LocalDpDefense(Protocol):
    """What the local-DP canary clients use of their defense (``local-dp``)."""

    @property
    def params(self) -> _LocalDpParams: ...

    def mods(self) -> list[Mod]: ...


class CentralDpDefense(Protocol):
    """What the central-DP canary clients use of their defense (``central-dp``)."""

    @property
    def params(self) -> _Clipped: ...

    @property
    def ctx(self) -> DefenseContext: ...

    def mods(self) -> list[Mod]: ...

    def wrap_strategy(self, strategy: Strategy, writer: RunWriter) -> Strategy: ...


class CanarySlots(Dataset):
    """A client's dataset plus ``count`` canary slots (index ``n + i``: canary i). A slot's input
    is a zero row of the data's shape with the first example's label; its per-example gradient is
    replaced before clipping (``plant``). ``last`` holds (batch position, canary) of the slots
    in the batch fetched last (``__getitems__``: one call per batch)."""

    def __init__(self, data: IndexedExamples, count: int) -> None:
        self.data, self.count = data, count
        # a zero input (floating tensors zeroed, labels and the rest as the first example's)
        self.filler = tuple(torch.zeros_like(t) if torch.is_tensor(t) and t.is_floating_point() else t
                            for t in data[0])  # fmt: skip
        self.last: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self.data) + self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        n = len(self.data)
        return self.data[index] if index < n else self.filler

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, ...]]:
        n = len(self.data)
        self.last = [(pos, int(i) - n) for pos, i in enumerate(indices) if i >= n]
        return [self[int(i)] for i in indices]


def canary_gradients(
    seed: int, unit: int, server_round: int, count: int, layout: Layout, clip: float,
) -> list[dict[str, torch.Tensor] | None]:  # fmt: skip
    """Each canary's per-example gradient this round: ``CANARY * clip * u`` if in, None if out."""
    coins = canary_coins(seed, unit, count)
    dirs = directions(seed, unit, server_round, count, layout)
    return [
        {k: torch.from_numpy(v * CANARY * clip) for k, v in unflat(dirs[i], layout).items()}
        if coins[i] else None
        for i in range(count)
    ]  # fmt: skip


def plant(optimizer: DPOptimizer, names: Mapping[int, str], slots: CanarySlots,
          grads: Sequence[dict[str, torch.Tensor] | None]) -> None:  # fmt: skip
    """Set the per-example gradients of the canary slots in the current batch (Opacus'
    ``grad_sample``, before the DP optimizer clips, sums and noises them)."""
    for p in optimizer.params:
        sample = getattr(p, "grad_sample", None)
        if sample is None or not isinstance(sample, torch.Tensor):
            continue
        name = names[id(p)]
        for pos, canary in slots.last:
            if pos >= sample.shape[0]:
                continue
            grad = grads[canary]
            sample[pos] = 0.0 if grad is None else grad[name].to(sample.dtype)


# -- local and central DP: canary clients -------------------------------------------------------
def through_mods(mods: Sequence[Mod], msg: Message, trained: Mapping[str, np.ndarray],
                 weight: float, node: int) -> Message:  # fmt: skip
    """A canary client's train reply (its ``trained`` arrays, in the sent record's key order)
    passed out through the defense's client ``mods`` (first listed innermost, as
    ``clients.runtime.handle_train``)."""

    def train(m: Message, _: Context) -> Message:
        arrays = wire_record(
            {k: encode(np.asarray(trained[k])) for k in m.content["arrays"].keys()}
        )
        metrics = MetricRecord({"num-examples": weight})
        return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=m)

    call: ClientAppCallable = train
    for mod in mods:
        call = (lambda mod_, next_: lambda m, c: mod_(m, c, next_))(mod, call)
    context = Context(run_id=0, node_id=node, node_config={PARTITION_KEY: -1},
                      state=RecordDict(), run_config={})  # fmt: skip
    return call(msg, context)


def _plus(arrays: Mapping[str, np.ndarray], update: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # fmt: skip
    return {k: (v + update[k]).astype(v.dtype) if k in update else v for k, v in arrays.items()}


def train_message(arrays: ArrayRecord, config: ConfigRecord, node: int) -> Message:
    return Message(RecordDict({"arrays": arrays, "config": config}), dst_node_id=node,
                   message_type="train")  # fmt: skip


class LocalDpCanaries(CanaryAudit):
    """``count`` canary clients that take part in every round (local DP promises epsilon per
    update, composed over the rounds); canary i's update has norm ``100 C`` and, once clipped to
    C, moves by ``+shift / 2`` (in) or ``-shift / 2`` (out) along that round's ``u`` (shift =
    min(C, sensitivity), what LocalDpMod's epsilon is calibrated for; the rest is along a second
    random direction). Each goes out through ``defense.mods()``; its reply is scored."""

    def __init__(self, seed: int, delta: float, count: int, defense: LocalDpDefense) -> None:
        super().__init__(seed, delta)
        self.count, self.defense = count, defense
        self.units[CANARY_CLIENTS] = UnitScores(canary_coins(seed, CANARY_CLIENTS, count), 1.0)

    def observe(self, server_round: int, sent: ArrayRecord, replies: Sequence[Message]) -> None:
        p = self.defense.params
        before = _numpy(sent)
        self.layout = self.layout or layout_of(before)
        unit = self.units[CANARY_CLIENTS]
        dirs = directions(self.seed, CANARY_CLIENTS, server_round, self.count, self.layout)
        fill = directions(self.seed, CANARY_CLIENTS + 1, server_round, self.count, self.layout)
        half = min(p.clipping_norm, p.sensitivity) / (2 * p.clipping_norm)
        mods, base, wire = self.defense.mods(), flat(before, self.layout), rewired(sent)
        got = np.empty_like(dirs)
        with _audit_rng(self.seed, NOISE, server_round):
            for i in range(self.count):
                other = fill[i] - (fill[i] @ dirs[i]) * dirs[i]
                other /= np.linalg.norm(other)
                sign = 1.0 if unit.included[i] else -1.0
                vec = (sign * half * dirs[i] + np.sqrt(1 - half**2) * other) * CANARY * p.clipping_norm  # fmt: skip
                msg = train_message(wire, ConfigRecord(), i + 1)
                reply = through_mods(mods, msg, _plus(before, unflat(vec, self.layout)), 1.0, i + 1)
                got[i] = flat(_numpy(reply.content.array_records["arrays"]), self.layout) - base
        unit.observe(got, dirs)

    def final_change(self, initial: ArrayRecord, final: ArrayRecord) -> np.ndarray | None:
        return None  # the canary clients' replies are not aggregated into the run's model


class CentralDpCanaries(CanaryAudit):
    """``count`` canary clients, each sampled into a round with the run's rate n / N; every
    round a second release of the round's real replies plus one slot per canary client (update
    ``100 C u`` if in and sampled, else zero, with the mean real weight) goes through the
    defense's own ``wrap_strategy`` (built for n + count sampled clients, so the noise on the
    sum is the configured sigma C) and client mods. The release (minus the sent model) is
    scored; ``final``: the sum of the releases (what a final model carrying them would)."""

    def __init__(
        self, seed: int, delta: float, count: int, defense: CentralDpDefense,
        rebuild: Callable[[int], CentralDpDefense],
    ) -> None:  # fmt: skip
        super().__init__(seed, delta)
        self.count, self.defense, self.rebuild = count, defense, rebuild
        self.units[CANARY_CLIENTS] = UnitScores(canary_coins(seed, CANARY_CLIENTS, count), 1.0)
        self.releases: np.ndarray | None = None

    def observe(self, server_round: int, sent: ArrayRecord, replies: Sequence[Message]) -> None:
        ok = [r for r in replies if not r.has_error() and "arrays" in r.content]
        if not ok:
            return
        p, ctx = self.defense.params, self.defense.ctx
        before = _numpy(sent)
        self.layout = self.layout or layout_of(before)
        unit = self.units[CANARY_CLIENTS]
        dirs = directions(self.seed, CANARY_CLIENTS, server_round, self.count, self.layout)
        rate = ctx.sampled_clients / ctx.num_clients
        sampled = np.random.default_rng([self.seed, SAMPLING, server_round]).random(self.count) < rate  # fmt: skip
        weights = [float(cast(int, r.content["metrics"].get("num-examples", 1))) for r in ok]
        weight = float(np.mean(weights))
        n = len(ok) + self.count
        shadow = self.rebuild(n)
        strategy = shadow.wrap_strategy(FedAvg(fraction_train=1.0, fraction_evaluate=0.0,
                                               min_train_nodes=n, min_available_nodes=n), _Discard())  # fmt: skip
        mods = shadow.mods()
        with _audit_rng(self.seed, NOISE, server_round):
            messages = list(strategy.configure_train(server_round, rewired(sent), ConfigRecord(), cast(Grid, AuditGrid(n))))  # fmt: skip
            copies = [_copy_reply(r, m) for r, m in zip(ok, messages, strict=False)]
            canaries = []
            for i, msg in enumerate(messages[len(ok) :]):
                live = bool(unit.included[i] and sampled[i])
                vec = dirs[i] * CANARY * p.clipping_norm if live else np.zeros(dirs.shape[1])
                trained = _plus(before, unflat(vec, self.layout)) if live else before
                canaries.append(through_mods(mods, msg, trained, weight, len(ok) + i + 1))
            arrays, _ = strategy.aggregate_train(server_round, copies + canaries)
        if arrays is None:
            return
        release = flat(_numpy(arrays), self.layout) - flat(before, self.layout)
        unit.observe(release, dirs)
        self.releases = release if self.releases is None else self.releases + release

    def final_change(self, initial: ArrayRecord, final: ArrayRecord) -> np.ndarray | None:
        return self.releases


def _copy_reply(reply: Message, to: Message) -> Message:
    """A copy of a real reply (the wrapper clips in place; the run's reply stays as received)."""
    arrays = rewired(reply.content.array_records["arrays"])  # the same bytes: Arrays are immutable
    metrics = MetricRecord(
        {"num-examples": cast(int, reply.content["metrics"].get("num-examples", 1))}
    )
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=to)


class _Discard:
    """A results writer that keeps nothing (the shadow release's accountant)."""

    def log(self, *_: object, **__: object) -> None:
        pass

    def drop_round(self, *_: object) -> None:
        pass


@contextlib.contextmanager
def _audit_rng(seed: int, salt: int, server_round: int) -> Iterator[None]:
    """NumPy's global generator (Flower's DP noise source) and Python's ``random`` (Flower's node
    sampling) seeded for the auditor's own draws, and restored: the run's draws are untouched."""
    state = random.getstate()
    random.seed(_seed(seed, salt, server_round))
    try:
        with AuditProcess(_seed(seed, salt, server_round)):
            yield
    finally:
        random.setstate(state)


def _seed(seed: int, salt: int, server_round: int) -> int:
    return int(np.random.SeedSequence([seed, salt, server_round]).generate_state(1)[0])


# -- the server's view -------------------------------------------------------------------------
class RunAudit(StrategyWrapper):
    """Sits where the attack's observer sits (outside the inner defenses, so it sees replies as
    received): remembers the arrays sent each round and hands the round's replies to every
    defense's ``CanaryAudit`` before the inner strategy aggregates them."""

    def __init__(self, inner: Strategy, audits: Sequence[CanaryAudit]) -> None:
        super().__init__(inner)
        self.audits = list(audits)
        self.sent: dict[int, ArrayRecord] = {}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):  # fmt: skip
        self.sent[server_round] = arrays
        return self.inner.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        sent = self.sent.pop(server_round, None)
        if sent is not None:
            for audit in self.audits:
                audit.observe(server_round, sent, replies)
        return self.inner.aggregate_train(server_round, replies)

    def metrics(self, initial: ArrayRecord | None, final: ArrayRecord | None) -> dict[str, float]:
        out: dict[str, float] = {}
        for audit in self.audits:
            out.update(audit.metrics(initial, final))
        return out


def find_run_audit(strategy: Strategy | None) -> RunAudit | None:
    """The ``RunAudit`` in a chain of strategy wrappers, if any."""
    while strategy is not None:
        if isinstance(strategy, RunAudit):
            return strategy
        strategy = strategy.__dict__.get("inner")
    return None


__all__ = ["DEFAULT_CONFIDENCE", "CanaryAudit", "RunAudit", "find_run_audit"]
