"""FairTune market: posted price + truncated proper scoring rule for fine-tuned checkpoints.

Sellers fine-tune a shared base MLP (trained on scikit-learn digits) on their own domain and list
the checkpoint with a reported quality per buyer task. Domains are digits seen through a fixed
orthogonal "style" of the 64 pixels; styles come in families (nearby rotations), so a checkpoint
from the buyer's family is a good starting point and one from another family is not.

* true quality ``q_ij`` = measured accuracy of checkpoint i on buyer j's validation split;
* cost ``c_ij`` = measured SGD steps until buyer j's validation accuracy reaches a target, starting
  from checkpoint i (``c_base_j`` from the base model), capped at ``max_steps``;
* posted price ``pi(y) = share * saving(y)``: a share of the normalised cost saving read off a public
  calibration curve (isotonic fit of measured savings on measured quality) at the *verified* accuracy
  y of the sold checkpoint on a verification split the seller never sees;
* payment ``clip(pi(y) - kappa * ((r - y)^2 - y(1 - y)/(m - 1)), -L, pi_max)``: the quadratic term is
  the strictly proper (mean-eliciting) score, minus an unbiased estimate of Var(y) so an honest report
  is not charged for verification noise; the clip is limited liability (stake L) and budget cap.

Baseline: price on the *reported* quality, no verification (inflation dominates). Oracle: the buyer
knows every true cost. Strategic sellers best-respond over a report grid until a fixed point.
Federated: clients are sellers (checkpoint + reports in their own slot of the reply, so FedAvg's
mean is the stack of listings); the server verifies, allocates, pays and reports market metrics;
each round's strategic reports best-respond to the previous round's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from scipy.stats import binom
from sklearn.datasets import load_digits
from sklearn.isotonic import IsotonicRegression
from threadpoolctl import threadpool_limits
from torch import nn

from flowerbed.clients.core.params import choices, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext


# -- 1. data generator -----------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)


def _orthogonal(rng: np.random.Generator, d: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def _near_identity(rng: np.random.Generator, d: int, eps: float) -> np.ndarray:
    """A rotation at distance ~eps from the identity (Cayley transform of a small skew matrix)."""
    a = rng.standard_normal((d, d))
    skew = (a - a.T) / np.sqrt(2 * d) * eps
    eye = np.eye(d)
    return np.linalg.solve(eye + skew / 2, eye - skew / 2)


@dataclass
class Domain:
    """One style: x -> x @ rotation (centred pixels), with train/val/verify splits."""

    family: int
    rotation: np.ndarray
    splits: dict[str, tuple[np.ndarray, np.ndarray]]


def make_domains(
    seed: int,
    families: int,
    count: int,
    spread: tuple[float, float] = (0.3, 0.9),
    sizes: dict[str, int] | None = None,
) -> list[Domain]:
    """``count`` domains; domain k is in family ``k % families`` and rotated ``eps ~ U(spread)``
    away from its family's style."""
    sizes = sizes or {"train": 300, "val": 200, "verify": 300}
    x, y = _digits()
    mean = x.mean(0)
    rng = np.random.default_rng(seed)
    styles = [_orthogonal(rng, x.shape[1]) for _ in range(families)]
    domains = []
    for k in range(count):
        fam = k % families
        rot = styles[fam] @ _near_identity(rng, x.shape[1], rng.uniform(*spread))
        order = rng.permutation(len(y))
        splits, start = {}, 0
        for name, size in sizes.items():
            idx = order[start : start + size]
            splits[name] = (((x[idx] - mean) @ rot).astype(np.float32), y[idx])
            start += size
        domains.append(Domain(fam, rot, splits))
    return domains


# -- 2. model: a batch of small MLPs trained side by side ----------------------------------------
HIDDEN = 32


def init_mlp(
    seed: int, d_in: int = 64, hidden: int = HIDDEN, classes: int = 10
) -> dict[str, torch.Tensor]:
    """Parameters of one MLP as a dict of tensors (w1, b1, w2, b2); leaves torch's RNG alone."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        first, second = nn.Linear(d_in, hidden), nn.Linear(hidden, classes)
    return {
        "w1": first.weight.detach().clone(),
        "b1": first.bias.detach().clone(),
        "w2": second.weight.detach().clone(),
        "b2": second.bias.detach().clone(),
    }


def _forward(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Batched forward: params have a leading model axis P, x is (P, n, d)."""
    h = torch.relu(torch.baddbmm(params["b1"][:, None], x, params["w1"].transpose(1, 2)))
    return torch.baddbmm(params["b2"][:, None], h, params["w2"].transpose(1, 2))


def accuracy(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Accuracy of each of the P models on its own (P, n, d) data."""
    with torch.no_grad():
        return (_forward(params, x).argmax(-1) == y).float().mean(1).numpy()


def train_batch(
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    seed: int,
    lr: float = 0.05,
    batch: int = 32,
    val: tuple[torch.Tensor, torch.Tensor] | None = None,
    target: float = 1.0,
    eval_every: int = 5,
) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """SGD (momentum 0.9) on P models at once; returns the trained params and, when ``val`` is
    given, the first evaluated step at which each model's val accuracy reached ``target``
    (``steps`` if never: the cap)."""
    torch.set_num_threads(1)
    params = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    velocity = {k: torch.zeros_like(v) for k, v in params.items()}
    gen = torch.Generator().manual_seed(seed)
    num_models, n = y.shape
    reached = np.full(num_models, steps, dtype=np.int64)
    for step in range(steps + 1):
        if val is not None and step % eval_every == 0:
            hit = (accuracy(params, *val) >= target) & (reached == steps)
            reached[hit] = step
            if (reached < steps).all():
                break
        if step == steps:
            break
        idx = torch.randint(0, n, (batch,), generator=gen)
        logits = _forward(params, x[:, idx])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y[:, idx].reshape(-1)
        )
        grads = torch.autograd.grad(loss * num_models, list(params.values()))
        with torch.no_grad():  # plain momentum SGD (torch.optim's first import is slow)
            for (name, p), g in zip(params.items(), grads, strict=True):
                velocity[name].mul_(0.9).add_(g)
                p.sub_(lr * velocity[name])
    return {k: v.detach() for k, v in params.items()}, reached


def _stack(models: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([m[k] for m in models]) for k in models[0]}


def _split(domains: list[Domain], name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.from_numpy(np.stack([d.splits[name][0] for d in domains])),
        torch.from_numpy(np.stack([d.splits[name][1] for d in domains])),
    )


def pretrain_base(seed: int, steps: int = 400) -> dict[str, torch.Tensor]:
    """The shared base model: the MLP trained on un-styled (centred) digits."""
    pixels, y = _digits()
    x = torch.from_numpy(pixels - pixels.mean(0))[None]
    params = _stack([init_mlp(seed)])
    params, _ = train_batch(params, x, torch.from_numpy(y)[None], steps, seed)
    return {k: v[0] for k, v in params.items()}


def fine_tune_sellers(
    base: dict[str, torch.Tensor], domains: list[Domain], steps: int, seed: int
) -> dict[str, torch.Tensor]:
    """Each seller's checkpoint: the base fine-tuned on its own domain's train split (stacked)."""
    x, y = _split(domains, "train")
    params, _ = train_batch(_stack([base] * len(domains)), x, y, steps, seed)
    return params


# -- 3. measured market: qualities and fine-tuning costs -----------------------------------------
@dataclass
class MarketData:
    """Measured on real checkpoints: q, q_verify (S, J), cost (S, J), base_cost and base_q (J,)."""

    q: np.ndarray
    q_verify: np.ndarray
    cost: np.ndarray
    base_cost: np.ndarray
    base_q: np.ndarray
    m: int
    max_steps: int


def measure_market(
    checkpoints: dict[str, torch.Tensor],
    base: dict[str, torch.Tensor],
    buyers: list[Domain],
    seed: int,
    target: float = 0.9,
    max_steps: int = 400,
    eval_every: int = 2,
) -> MarketData:
    """Quality of every checkpoint on every buyer's val/verify split, and SGD steps to ``target``
    val accuracy on the buyer's train split from each checkpoint and from the base."""
    sellers = checkpoints["w1"].shape[0]
    models = [{k: v[i] for k, v in checkpoints.items()} for i in range(sellers)] + [base]
    pairs = [(i, j) for i in range(sellers + 1) for j in range(len(buyers))]
    params = _stack([models[i] for i, _ in pairs])
    by_pair = [buyers[j] for _, j in pairs]
    val, verify, train = _split(by_pair, "val"), _split(by_pair, "verify"), _split(by_pair, "train")
    q = accuracy(params, *val).reshape(sellers + 1, len(buyers))
    q_verify = accuracy(params, *verify).reshape(sellers + 1, len(buyers))
    _, reached = train_batch(
        params, *train, max_steps, seed, val=val, target=target, eval_every=eval_every
    )
    cost = reached.reshape(sellers + 1, len(buyers)).astype(float)
    return MarketData(
        q[:-1], q_verify[:-1], cost[:-1], cost[-1], q[-1], len(verify[1][0]), max_steps
    )


# -- 4. the mechanism, strategic sellers and metrics ---------------------------------------------
@dataclass
class Mechanism:
    """``kind``: fairtune (verified price + truncated score) or report-priced (no verification)."""

    kind: str = "fairtune"
    flat: float = 0.1
    share: float = 0.5
    kappa: float = 200.0
    stake: float = 1.0
    grid: float = 0.01


def saving_curve(data: MarketData) -> IsotonicRegression:
    """Public calibration: normalised cost saving as an increasing function of quality."""
    saving = 1.0 - data.cost / np.maximum(data.base_cost[None], 1.0)
    curve = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip")
    return curve.fit(np.concatenate([data.q.ravel(), data.base_q]), np.concatenate(
        [saving.ravel(), np.zeros_like(data.base_q)]
    ))  # fmt: skip


def payment(r: np.ndarray, y: np.ndarray, price: np.ndarray, mech: Mechanism, m: int) -> np.ndarray:
    """Seller's payment on a sale: FairTune's truncated score, or the baseline's price(r)."""
    if mech.kind == "report-priced":
        return price
    penalty = mech.kappa * ((r - y) ** 2 - y * (1 - y) / (m - 1))
    return np.clip(price - penalty, -mech.stake, mech.flat + mech.share)


def expected_payment(
    reports: np.ndarray, q: float, m: int, mech: Mechanism, curve: IsotonicRegression
) -> np.ndarray:
    """E_y[payment(r, y)] for each report r, y ~ Binomial(m, q)/m (the verification draw)."""
    ys = np.arange(m + 1) / m
    pmf = binom.pmf(np.arange(m + 1), m, q)
    if mech.kind == "report-priced":
        return mech.flat + mech.share * curve.predict(reports)
    price = mech.flat + mech.share * curve.predict(ys)
    pay = payment(reports[:, None], ys[None], price[None], mech, m)
    return pay @ pmf


def _win_share(r: np.ndarray, others: np.ndarray, threshold: float) -> np.ndarray:
    """Probability of being chosen with report r: highest report wins (ties split), the buyer buys
    only if the winning report promises a positive saving."""
    best = others.max() if len(others) else -np.inf
    ties = (np.isclose(others[:, None], r[None]).sum(0) if len(others) else 0) + 1
    win = np.where(r > best + 1e-9, 1.0, np.where(np.isclose(r, best), 1.0 / ties, 0.0))
    return win * (r > threshold)


def report_grid(mech: Mechanism) -> np.ndarray:
    return np.round(np.arange(0.0, 1.0 + 1e-9, mech.grid), 6)


def best_reports(
    q: np.ndarray,
    others: np.ndarray,
    current: np.ndarray,
    m: int,
    mech: Mechanism,
    curve: IsotonicRegression,
    table: np.ndarray | None = None,
) -> np.ndarray:
    """One seller's best response per buyer (J,) to the others' reports (S - 1, J); keeps the
    current report unless another grid point is strictly better. ``table`` (J, grid): expected
    payments, if already computed."""
    threshold = _buy_threshold(curve)
    grid = report_grid(mech)
    out = current.copy()
    for j in range(len(q)):
        pay = expected_payment(grid, q[j], m, mech, curve) if table is None else table[j]
        utility = _win_share(grid, others[:, j], threshold) * pay
        now = utility[np.argmin(np.abs(grid - current[j]))]
        best = int(np.argmax(utility))
        if utility[best] > now + 1e-9:
            out[j] = grid[best]
    return out


def best_response_equilibrium(
    data: MarketData, mech: Mechanism, curve: IsotonicRegression | None = None, sweeps: int = 30
) -> np.ndarray:
    """Reports (S, J) at the fixed point of sequential best responses over the report grid,
    starting from honest reports (rounded to the grid)."""
    curve = saving_curve(data) if curve is None else curve
    reports = np.round(data.q / mech.grid) * mech.grid
    grid = report_grid(mech)
    table = np.array(
        [[expected_payment(grid, q, data.m, mech, curve) for q in row] for row in data.q]
    )
    for _ in range(sweeps):
        before = reports.copy()
        for i in range(len(reports)):
            others = np.delete(reports, i, axis=0)
            reports[i] = best_reports(data.q[i], others, reports[i], data.m, mech, curve, table[i])
        if np.array_equal(before, reports):
            break
    return reports


def _buy_threshold(curve: IsotonicRegression) -> float:
    """Lowest report at which the calibration curve promises a positive saving."""
    qs = np.linspace(0, 1, 1001)
    positive = qs[curve.predict(qs) > 0]
    return float(positive[0]) - 1e-9 if len(positive) else 1.0


def market_outcome(
    data: MarketData,
    reports: np.ndarray,
    mech: Mechanism,
    seed: int = 0,
    curve: IsotonicRegression | None = None,
) -> dict[str, float]:
    """Allocate (highest report, ties at random), pay on the realised verification accuracy, and
    score the market: misreport rate, buyer cost reduction, welfare / oracle, seller profits."""
    rng = np.random.default_rng(seed)
    curve = saving_curve(data) if curve is None else curve
    threshold = _buy_threshold(curve)
    sellers, buyers = data.q.shape
    saving = data.base_cost[None] - data.cost  # steps saved by starting from checkpoint i
    profit, expected = np.zeros(sellers), np.zeros(sellers)
    welfare = 0.0
    for j in range(buyers):
        col = reports[:, j]
        top = np.flatnonzero(np.isclose(col, col.max()))
        winner = int(rng.choice(top))
        if col[winner] <= threshold:
            continue  # the buyer fine-tunes from base
        welfare += saving[winner, j]
        y = data.q_verify[winner, j]
        verified = col[winner] if mech.kind == "report-priced" else y
        price = mech.flat + mech.share * curve.predict(np.array([verified]))
        profit[winner] += float(payment(col[winner], y, price, mech, data.m)[0])
        expected[winner] += float(
            expected_payment(col[winner : winner + 1], data.q[winner, j], data.m, mech, curve)[0]
        )
    oracle = np.maximum(saving.max(0), 0).sum()
    return {
        "misreport_rate": float(np.mean(reports - data.q > 0.05)),
        "cost_reduction": float(welfare / data.base_cost.sum()),
        "welfare_vs_oracle": float(welfare / oracle) if oracle > 0 else 1.0,
        "oracle_cost_reduction": float(oracle / data.base_cost.sum()),
        "mean_seller_profit": float(profit.mean()),
        "min_expected_profit": float(expected.min()),
        "participation": float(np.mean(expected >= 0)),
    }


@functools.lru_cache(maxsize=4)
def build_market(
    seed: int = 0,
    families: int = 4,
    sellers_per_family: int = 3,
    buyers_per_family: int = 4,
    seller_steps: int = 300,
    target: float = 0.9,
    max_steps: int = 400,
    spread: tuple[float, float] = (0.3, 0.9),
    eval_every: int = 2,
) -> MarketData:
    """The whole measured market from one seed: base, seller checkpoints, buyer tasks, costs."""
    with threadpool_limits(1):
        count = families * (sellers_per_family + buyers_per_family)
        domains = make_domains(seed, families, count, spread)
    sellers = domains[: families * sellers_per_family]
    buyers = domains[families * sellers_per_family :]
    base = pretrain_base(seed)
    checkpoints = fine_tune_sellers(base, sellers, seller_steps, seed + 1)
    return measure_market(checkpoints, base, buyers, seed + 2, target, max_steps, eval_every)


# -- 5. registration -----------------------------------------------------------------------------
@dataclass
class LinearSchedule:
    """The posted saving schedule of the federated market: 0 below ``low``, 1 above ``high``.

    Posted before the market opens, so every node knows it without seeing anyone's checkpoint.
    """

    low: float = 0.3
    high: float = 0.9

    def predict(self, q: np.ndarray) -> np.ndarray:
        return np.clip((np.asarray(q, dtype=float) - self.low) / (self.high - self.low), 0.0, 1.0)


@functools.lru_cache(maxsize=4)
def _public(seed: int, families: int, count: int) -> tuple[dict[str, torch.Tensor], list[Domain]]:
    """Base model and domains: public given the seed (clients use only their own domain's train
    split and the buyers' validation splits; the verification splits stay on the server)."""
    with threadpool_limits(1):
        return pretrain_base(seed), make_domains(seed, families, count)


MechanismKind = choices("MechanismKind", ("fairtune", "report-priced"))


class SellerShard(TypedDict):
    """A seller's partition: its fine-tuned checkpoint, the quality it measures on each buyer's
    validation split and its accuracy on its own domain."""

    id: int
    ckpt: dict[str, torch.Tensor]
    q: np.ndarray
    own_acc: float


@WORKLOADS.register(
    "fairtune",
    "FairTune market: sellers list fine-tuned checkpoints + quality reports; server verifies and pays",
)
class FairTune(Workload):
    """Client i = seller i (family i % families); buyers are held-out domains on the server.

    Replies put the seller's checkpoint and reports in its own slot of stacked arrays with
    ``num-examples`` = 1, so FedAvg's mean is the stack of listings divided by the number of
    clients (every client must reply: fraction 1, no failures).
    """

    @dataclass
    class Params:
        families: int = param(2, ge=1)
        buyers_per_family: int = param(2, ge=1)
        seller_steps: int = param(200, ge=0)
        target: float = param(0.9, gt=0, le=1)
        max_steps: int = param(300, ge=1)
        mechanism: MechanismKind = MechanismKind("fairtune")
        kappa: float = param(200.0, gt=0)
        flat: float = param(0.1, ge=0)
        share: float = param(0.5, ge=0, le=1)
        strategic: bool = True

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        self.sellers = self.ctx.num_clients
        self.num_buyers = self.params.families * self.params.buyers_per_family
        self.base, domains = _public(
            self.ctx.seed, self.params.families, self.sellers + self.num_buyers
        )
        self.seller_domains, self.buyers = domains[: self.sellers], domains[self.sellers :]
        p = self.params
        self.mech = Mechanism(p.mechanism, flat=p.flat, share=p.share, kappa=p.kappa)
        self.curve = LinearSchedule()
        self.m = len(self.buyers[0].splits["verify"][1])

    def load_partition(self, partition_id: int, num_partitions: int) -> SellerShard:
        """The seller's checkpoint (fine-tuned once, deterministic) and its self-evaluated quality
        on each buyer's published validation split."""
        seed = client_seed(self.ctx.seed, partition_id, 0)
        ckpt = fine_tune_sellers(
            self.base, [self.seller_domains[partition_id]], self.params.seller_steps, seed
        )
        x, y = _split(self.buyers, "val")
        q = accuracy({k: v.expand(len(self.buyers), *v.shape[1:]) for k, v in ckpt.items()}, x, y)
        own = _split([self.seller_domains[partition_id]], "val")
        return {"id": partition_id, "ckpt": ckpt, "q": q, "own_acc": float(accuracy(ckpt, *own)[0])}

    def init_arrays(self) -> ArrayRecord:
        arrays = {k: torch.zeros(self.sellers, *v.shape) for k, v in self.base.items()}
        arrays["reports"] = torch.zeros(self.sellers, self.num_buyers, dtype=torch.float64)
        return ArrayRecord(arrays)

    def fit(
        self, arrays: ArrayRecord, data: SellerShard, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        """List the checkpoint with reports: honest, or the best response to last round's
        reports (all zero before round 1)."""
        i, q = data["id"], data["q"]
        previous = arrays["reports"].numpy() * self.sellers
        honest = np.round(q / self.mech.grid) * self.mech.grid
        if self.params.strategic:
            others = np.delete(previous, i, axis=0)
            reports = best_reports(q, others, honest, self.m, self.mech, self.curve)
        else:
            reports = honest
        reply = {k: torch.zeros(self.sellers, *v.shape[1:]) for k, v in data["ckpt"].items()}
        for k, v in data["ckpt"].items():
            reply[k][i] = v[0]
        reply["reports"] = torch.zeros(self.sellers, self.num_buyers, dtype=torch.float64)
        reply["reports"][i] = torch.from_numpy(reports)
        metrics = {
            "num-examples": 1,
            "misreport_rate": float(np.mean(reports - q > 0.05)),
            "mean_inflation": float(np.mean(reports - q)),
        }
        return ArrayRecord(reply), metrics

    def evaluate(self, arrays: ArrayRecord, data: SellerShard, config: RoundConfig):
        return {"num-examples": 1, "own_domain_accuracy": data["own_acc"]}

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        """The platform: verify every listing on the buyers' verification splits, measure the
        fine-tuning costs, allocate on the reports and pay."""
        if server_round == 0:
            return None
        stacked = {k: v.numpy() * self.sellers for k, v in arrays.items()}
        reports = np.round(stacked.pop("reports"), 6)
        checkpoints = {k: torch.from_numpy(v.astype(np.float32)) for k, v in stacked.items()}
        data = measure_market(
            checkpoints, self.base, self.buyers, self.ctx.seed + 2, self.params.target,
            self.params.max_steps,
        )  # fmt: skip
        return market_outcome(data, reports, self.mech, self.ctx.seed, self.curve)
