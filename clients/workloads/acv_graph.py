"""Approximate cross-validation for sparse Gaussian graphical-model structure learning.

Neighbourhood selection (Meinshausen & Buhlmann): one lasso path per node on a shared lambda grid,
edge (i, j) if either regression keeps the other variable (OR rule). A global lambda is picked by
summing a criterion over nodes. Criteria:

* ``alo``: approximate leave-one-out for the lasso, LOO residual ``r_i / (1 - H_ii)`` with the hat
  matrix of the active set. Cheap and accurate for prediction, but LOO is not selection-consistent:
  it over-selects and does not improve with n.
* ``acv``: leave-many-out approximate CV on the full-data support ``S_lambda`` (Shao 1993): OLS refits
  on S_lambda trained on ``n_c = n^{3/4}`` samples and validated on the rest, over random splits. No
  lasso refits (only Gram-matrix solves), and selection-consistent because ``n_c / n -> 0``.
* ``bic``, ``ebic``: ``n log(RSS/n) + |S| log n (+ 2 gamma |S| log(p - 1))`` on OLS refits.
* ``kfold``: exact K-fold CV with lasso refits (the expensive predictive reference).

Federated: clients hold samples of one graph, send per-lambda criterion pieces (normalised per
example, so FedAvg's example-weighted mean is the pooled criterion) and per-lambda support bitmaps
(so the mean is the edge frequency). The server picks lambda* on the summed criterion and
majority-votes the graph. No raw data leaves a client.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import networkx as nx
import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from sklearn.linear_model import lasso_path
from threadpoolctl import threadpool_limits

from flowerbed.clients.core.params import choices, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext

CRITERIA = ("alo", "acv", "bic", "ebic")


# -- 1. data generator -----------------------------------------------------------------------
def make_graph(kind: str, p: int, seed: int = 0) -> nx.Graph:
    """Edge structure: ``chain`` (path), ``hub`` (stars of 10 nodes) or ``scale-free`` (BA, m=1)."""
    if kind == "chain":
        return nx.path_graph(p)
    if kind == "hub":
        graph = nx.empty_graph(p)
        for start in range(0, p, 10):
            for leaf in range(start + 1, min(start + 10, p)):
                graph.add_edge(start, leaf)
        return graph
    if kind == "scale-free":
        return nx.barabasi_albert_graph(p, 1, seed=seed)
    raise ValueError(f"unknown graph kind {kind!r} (chain, hub, scale-free)")


def make_precision(graph: nx.Graph, strength: float = 0.45, seed: int = 0) -> np.ndarray:
    """Precision matrix with support = graph: off-diagonals ``-strength/sqrt(max degree)`` with a
    random sign (the chain keeps ``-strength``), unit diagonal, shifted to min eigenvalue >= 0.1."""
    p = graph.number_of_nodes()
    rng = np.random.default_rng(seed)
    theta = np.eye(p)
    chain = all(d <= 2 for _, d in graph.degree())
    for i, j in graph.edges():
        scale = 1.0 if chain else np.sqrt(max(graph.degree(i), graph.degree(j)))
        sign = -1.0 if chain else rng.choice([-1.0, 1.0])
        theta[i, j] = theta[j, i] = sign * strength / scale
    low = np.linalg.eigvalsh(theta)[0]
    if low < 0.1:
        theta += (0.1 - low) * np.eye(p)
    return theta


def sample_ggm(theta: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n draws from N(0, theta^-1)."""
    cov = np.linalg.inv(theta)
    return rng.multivariate_normal(np.zeros(len(theta)), (cov + cov.T) / 2, size=n)


def standardize(x: np.ndarray) -> np.ndarray:
    """Centre and scale columns to unit variance so one lambda grid serves every node."""
    x = x - x.mean(0)
    return x / x.std(0)


def default_lambdas(num: int = 30) -> np.ndarray:
    """Shared, decreasing grid on standardised data (lambda_max <= max |corr| <= 1)."""
    return np.geomspace(1.0, 0.01, num)


# -- 2. model: nodewise lasso paths -------------------------------------------------------------
def fast_path(others: np.ndarray, y: np.ndarray, lambdas: np.ndarray) -> np.ndarray:
    """Lasso path coefficients (p - 1, L); inputs are made contiguous here, so scikit-learn's
    per-call validation (its main cost at this size) is skipped."""
    _, coefs, _ = lasso_path(
        np.asfortranarray(others), np.ascontiguousarray(y), alphas=lambdas, max_iter=5000,
        tol=1e-4, check_input=False,
    )  # fmt: skip
    return coefs


def node_path(x: np.ndarray, j: int, lambdas: np.ndarray) -> np.ndarray:
    """Lasso path of node j on the others; coefficients (L, p - 1) in the order of ``lambdas``."""
    return fast_path(np.delete(x, j, axis=1), x[:, j], lambdas).T


def alo_residuals(xs: np.ndarray, y: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Approximate LOO residuals ``r_i / (1 - H_ii)``, H the hat matrix of the columns ``xs``.

    For the lasso, xs is the active set (the L1 term has no curvature there); for OLS on a fixed
    support it is the exact PRESS identity.
    """
    r = y - xs @ beta
    if xs.shape[1] == 0:
        return r
    q, _ = np.linalg.qr(xs)
    h = np.einsum("ij,ij->i", q, q)
    return r / np.maximum(1.0 - h, 1e-8)


def exact_loo_lasso(others: np.ndarray, y: np.ndarray, lambdas: np.ndarray) -> np.ndarray:
    """Exact LOO mean squared error per lambda: n lasso-path refits on n - 1 samples.

    The penalty is rescaled by n/(n-1) so the per-sample loss keeps the same weight against it
    (scikit-learn divides the loss by the sample count).
    """
    n = len(y)
    errors = np.zeros((n, len(lambdas)))
    keep = np.ones(n, dtype=bool)
    for i in range(n):
        keep[i] = False
        _, coefs, _ = lasso_path(
            others[keep], y[keep], alphas=lambdas * n / (n - 1), max_iter=5000, tol=1e-8
        )
        errors[i] = (y[i] - others[i] @ coefs) ** 2
        keep[i] = True
    return errors.mean(0)


def alo_lasso(others: np.ndarray, y: np.ndarray, lambdas: np.ndarray) -> np.ndarray:
    """ALO mean squared error per lambda from one lasso path."""
    _, coefs, _ = lasso_path(others, y, alphas=lambdas, max_iter=5000, tol=1e-8)
    out = np.zeros(len(lambdas))
    for k in range(len(lambdas)):
        support = np.flatnonzero(coefs[:, k])
        out[k] = np.mean(alo_residuals(others[:, support], y, coefs[support, k]) ** 2)
    return out


# -- 3. local step: per-lambda criteria for every node --------------------------------------------
def _ols_error(
    g_fit: np.ndarray, g_eval: np.ndarray, j: int, support: np.ndarray, ridge: float = 1e-10
) -> np.ndarray:
    """Squared-error sums on the 'eval' samples of the OLS of x_j on x_support fitted on 'fit'.

    Both are stacks of Gram matrices ``X^T X`` (B, p, p) over all p columns, one per split, so no
    design matrix is touched and all splits are solved in one batched call.
    """
    if len(support) == 0:
        return g_eval[:, j, j]
    block = np.ix_(np.arange(len(g_fit)), support, support)
    a = g_fit[block]
    a = a + ridge * np.trace(a, axis1=1, axis2=2)[:, None, None] / len(support) * np.eye(
        len(support)
    )
    beta = np.linalg.solve(a, g_fit[:, support, j][..., None])[..., 0]
    fitted = np.einsum("bs,bst,bt->b", beta, g_eval[block], beta)
    return g_eval[:, j, j] - 2 * np.einsum("bs,bs->b", beta, g_eval[:, support, j]) + fitted


def graph_criteria(
    x: np.ndarray,
    lambdas: np.ndarray,
    rng: np.random.Generator,
    n_splits: int = 20,
    train_exponent: float = 0.75,
    gamma: float = 0.5,
) -> dict[str, np.ndarray]:
    """Criteria summed over nodes per lambda (``alo``/``acv`` as per-sample means, ``bic``/``ebic``
    as totals) and ``supports``, the OR-rule adjacency per lambda (L, p, p) of the full-data paths.

    ``acv``: leave-(n - n_c)-out with ``n_c = n^train_exponent`` via OLS on the fixed support.
    """
    with threadpool_limits(1):  # tiny solves: BLAS threads only add contention
        return _graph_criteria(x, lambdas, rng, n_splits, train_exponent, gamma)


def _graph_criteria(
    x: np.ndarray,
    lambdas: np.ndarray,
    rng: np.random.Generator,
    n_splits: int,
    train_exponent: float,
    gamma: float,
) -> dict[str, np.ndarray]:
    x = standardize(x)
    n, p = x.shape
    num = len(lambdas)
    n_c = max(int(round(n**train_exponent)), 2)
    gram = x.T @ x
    train = np.stack([rng.permutation(n)[:n_c] for _ in range(n_splits)])
    g_train = np.einsum("bip,biq->bpq", x[train], x[train])
    g_val = gram[None] - g_train
    out: dict[str, np.ndarray] = {name: np.zeros(num) for name in CRITERIA}
    out["supports"] = np.zeros((num, p, p), dtype=bool)
    for j in range(p):
        coefs = node_path(x, j, lambdas)
        others = np.delete(np.arange(p), j)
        cache: dict[tuple[int, ...], tuple[float, float]] = {}
        for k in range(num):
            support = others[np.flatnonzero(coefs[k])]
            out["supports"][k, j, support] = True
            local = np.flatnonzero(coefs[k])
            out["alo"][k] += np.mean(alo_residuals(x[:, support], x[:, j], coefs[k, local]) ** 2)
            key = tuple(support)
            if key not in cache:
                held = _ols_error(g_train, g_val, j, support).sum()
                rss = _ols_error(gram[None], gram[None], j, support)[0]
                cache[key] = (held / (n_splits * (n - n_c)), rss)
            acv, rss = cache[key]
            out["acv"][k] += acv
            size = len(support)
            bic = n * np.log(max(rss, 1e-12) / n) + size * np.log(n)
            out["bic"][k] += bic
            out["ebic"][k] += bic + 2 * gamma * size * np.log(p - 1)
    out["supports"] = out["supports"] | out["supports"].transpose(0, 2, 1)
    return out


def exact_kfold_criterion(
    x: np.ndarray, lambdas: np.ndarray, rng: np.random.Generator, folds: int = 5
) -> np.ndarray:
    """Exact K-fold CV of the nodewise lassos (refits per fold), summed over nodes per lambda."""
    x = standardize(x)
    n, p = x.shape
    fold_of = rng.permutation(n) % folds
    total = np.zeros(len(lambdas))
    for j in range(p):
        others = np.delete(x, j, axis=1)
        for f in range(folds):
            train, test = fold_of != f, fold_of == f
            coefs = fast_path(others[train], x[train, j], lambdas)
            total += ((x[test, j][:, None] - others[test] @ coefs) ** 2).sum(0) / n
    return total


# -- 4. metrics -------------------------------------------------------------------------------------
def edge_f1(estimate: np.ndarray, truth: np.ndarray) -> float:
    """F1 of the estimated edge set (upper triangle of a boolean adjacency) against the truth."""
    upper = np.triu_indices(len(truth), 1)
    est, tru = estimate[upper].astype(bool), truth[upper].astype(bool)
    tp = np.sum(est & tru)
    if tp == 0:
        return 0.0
    return float(2 * tp / (est.sum() + tru.sum()))


def true_adjacency(theta: np.ndarray) -> np.ndarray:
    adj = np.abs(theta) > 1e-12
    np.fill_diagonal(adj, False)
    return adj


def select(criterion: np.ndarray, supports: np.ndarray) -> tuple[int, np.ndarray]:
    """Index of the minimising lambda (the larger lambda on ties) and its graph."""
    k = int(np.argmin(criterion))
    return k, supports[k]


def recovery_study(
    p: int = 30,
    n: int = 300,
    seed: int = 0,
    kind: str = "chain",
    strength: float = 0.45,
    kfold: bool = False,
    n_splits: int = 20,
) -> dict[str, float]:
    """F1 of the graph selected by each criterion on one fixed-seed GGM draw, plus timings."""
    rng = np.random.default_rng(seed)
    theta = make_precision(make_graph(kind, p, seed), strength, seed)
    x = sample_ggm(theta, n, rng)
    truth = true_adjacency(theta)
    lambdas = default_lambdas()
    start = time.perf_counter()
    crit = graph_criteria(x, lambdas, rng, n_splits=n_splits)
    result = {"time_criteria_s": time.perf_counter() - start}
    for name in CRITERIA:
        result[f"f1_{name}"] = edge_f1(select(crit[name], crit["supports"])[1], truth)
    if kfold:
        start = time.perf_counter()
        cv = exact_kfold_criterion(x, lambdas, rng)
        result["time_kfold_s"] = time.perf_counter() - start
        result["f1_kfold"] = edge_f1(select(cv, crit["supports"])[1], truth)
    return result


# -- 5. registration -----------------------------------------------------------------------------
GraphKind = choices("GraphKind", ("chain", "hub", "scale-free"))
Criterion = choices("Criterion", CRITERIA)


@WORKLOADS.register(
    "acv-graph",
    "Nodewise-lasso graph recovery; clients send per-lambda ACV criteria and support bitmaps",
)
class ACVGraph(Workload):
    """Clients hold samples of one GGM (the graph is fixed by the experiment seed)."""

    @dataclass
    class Params:
        p: int = param(20, ge=2)
        samples_per_client: int = param(60, ge=2)
        graph: GraphKind = GraphKind("chain")
        strength: float = param(0.45, gt=0)
        num_lambdas: int = param(30, ge=1)
        n_splits: int = param(20, ge=2)
        criterion: Criterion = Criterion("acv")

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        self.lambdas = default_lambdas(self.params.num_lambdas)
        self.theta = make_precision(
            make_graph(self.params.graph, self.params.p, self.ctx.seed), self.params.strength,
            self.ctx.seed,
        )  # fmt: skip
        self.truth = true_adjacency(self.theta)

    def load_partition(self, partition_id: int, num_partitions: int) -> np.ndarray:
        rng = np.random.default_rng(client_seed(self.ctx.seed, partition_id, 0))
        return sample_ggm(self.theta, self.params.samples_per_client, rng)

    def init_arrays(self) -> ArrayRecord:
        num, p = len(self.lambdas), self.params.p
        arrays = {name: torch.zeros(num, dtype=torch.float64) for name in CRITERIA}
        arrays["supports"] = torch.zeros(num, p, p, dtype=torch.float64)
        return ArrayRecord(arrays)

    def fit(
        self, arrays: ArrayRecord, data: np.ndarray, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        """Local criteria on the shared grid; per-example normalisation makes FedAvg's
        example-weighted mean equal the pooled (summed) criterion."""
        seed = client_seed(self.ctx.seed, config["partition-id"], config["server-round"])
        crit = graph_criteria(data, self.lambdas, np.random.default_rng(seed), self.params.n_splits)
        n = len(data)
        reply = {
            "alo": crit["alo"],
            "acv": crit["acv"],
            "bic": crit["bic"] / n,
            "ebic": crit["ebic"] / n,
            "supports": crit["supports"].astype(np.float64),
        }
        k, graph = select(reply[self.params.criterion], crit["supports"])
        metrics = {
            "num-examples": n,
            "local_f1": edge_f1(graph, self.truth),
            "local_lambda": float(self.lambdas[k]),
        }
        return ArrayRecord({key: torch.from_numpy(v) for key, v in reply.items()}), metrics

    def global_graph(self, arrays: ArrayRecord) -> tuple[int, np.ndarray]:
        """Server side: lambda* minimising the summed criterion, majority vote of client supports."""
        agg = {k: v.numpy() for k, v in arrays.items()}
        k = int(np.argmin(agg[self.params.criterion]))
        return k, agg["supports"][k] > 0.5

    def evaluate(self, arrays: ArrayRecord, data: np.ndarray, config: RoundConfig):
        """The client's own graph at the federated lambda*."""
        k, _ = self.global_graph(arrays)
        node_supports = graph_criteria(data, self.lambdas[k : k + 1], np.random.default_rng(0), 1)
        return {
            "num-examples": len(data),
            "f1_at_global_lambda": edge_f1(node_supports["supports"][0], self.truth),
        }

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        if server_round == 0:
            return None
        k, graph = self.global_graph(arrays)
        return {"global_f1": edge_f1(graph, self.truth), "global_lambda": float(self.lambdas[k])}
