"""Near-linear Chamfer distance under l_p, 1 < p <= 2 (crude estimates + importance sampling).

``CH(A, B) = sum_{a in A} min_{b in B} ||a - b||_p``. Exact evaluation costs O(n^2 d). The estimator
(after Bakshi et al. 2023 / Feng & Indyk 2025, with the l_p paper's embeddings):

1. embed both sets l_p -> l_1 for the crude stage only: p-stable projections (Chambers-Mallows-Stuck)
   for p < 2, a Gaussian Toeplitz JL matrix applied by FFT (after random signs) for p = 2;
2. crude per-point estimates ``D_a``: a randomly shifted quadtree over the embedding; for each ``a`` the
   finest cell that also holds points of B gives candidates ``b'``, and ``D_a = min ||a - b'||_p``
   measured in the **original** space, so ``D_a >= opt_a`` always (min over ``repeats`` shifts);
3. importance sampling: draw T points with probability ``D_a / sum D``, compute their exact
   ``opt_a``; ``C = sum D * mean(opt_a / D_a)`` is unbiased, with relative variance
   ``<= sum D / CH - 1``. T is set from (epsilon, delta) by a pilot estimate of that variance.

The federated workload: clients hold generated point clouds; the server broadcasts a bank of
reference clouds; each client reports its Chamfer profile to the references (estimate, exact value on
a subsample, time) and the server builds a client-similarity matrix from the profiles.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict

from flowerbed.clients.core.params import param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.workloads import WORKLOADS, Workload

# -- 1. data generators ----------------------------------------------------------------------------


def make_clustered(
    n: int, d: int, rng: np.random.Generator, clusters: int = 20, spread: float = 0.15
) -> np.ndarray:
    """Gaussian mixture in R^d: ``clusters`` centres ~ N(0, I), points centre + spread * N(0, I)."""
    centres = np.random.default_rng(12345).standard_normal((clusters, d))  # shared across sets
    labels = rng.integers(clusters, size=n)
    return centres[labels] + spread * rng.standard_normal((n, d))


def add_outliers(
    points: np.ndarray, fraction: float, distance: float, rng: np.random.Generator
) -> np.ndarray:
    """Move a ``fraction`` of the points ``distance`` away along random directions (far outliers)."""
    points = points.copy()
    idx = rng.choice(len(points), max(1, int(round(fraction * len(points)))), replace=False)
    direction = rng.standard_normal((len(idx), points.shape[1]))
    points[idx] += distance * direction / np.linalg.norm(direction, axis=1, keepdims=True)
    return points


SHAPES = ("sphere", "torus", "cube", "blobs")


def make_shape(
    kind: str, n: int, d: int, rng: np.random.Generator, noise: float = 0.02
) -> np.ndarray:
    """A 3-D surface (sphere, torus, cube) or blobs, placed in R^d by a fixed orthonormal map."""
    if kind == "sphere":
        x = rng.standard_normal((n, 3))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    elif kind == "torus":
        u, v = rng.random((2, n)) * 2 * np.pi
        x = np.stack(
            [(1 + 0.4 * np.cos(v)) * np.cos(u), (1 + 0.4 * np.cos(v)) * np.sin(u), 0.4 * np.sin(v)],
            1,
        )
    elif kind == "cube":
        x = rng.random((n, 3)) * 2 - 1
        face = rng.integers(3, size=n)
        x[np.arange(n), face] = np.sign(rng.random(n) - 0.5)
    elif kind == "blobs":
        centres = np.array([[1, 0, 0], [-0.5, 0.87, 0], [-0.5, -0.87, 0], [0, 0, 1.0]])
        x = centres[rng.integers(4, size=n)] + 0.15 * rng.standard_normal((n, 3))
    else:
        raise ValueError(f"unknown shape '{kind}' (allowed: {', '.join(SHAPES)})")
    basis, _ = np.linalg.qr(np.random.default_rng(777).standard_normal((d, 3)))
    return x @ basis.T + noise * rng.standard_normal((n, d))


# -- 2. exact nearest-neighbour distances (baselines) ----------------------------------------------


def _sq_dists(q: torch.Tensor, b: torch.Tensor, b_sq: torch.Tensor) -> torch.Tensor:
    return ((q * q).sum(1, keepdim=True) + b_sq - 2.0 * q @ b.T).clamp_min_(0.0)


def nearest_l2(queries: np.ndarray, points: np.ndarray, chunk: int = 1024) -> np.ndarray:
    """Exact l_2 nearest-neighbour distance of every query: matmul trick, chunked (fp64).

    The winner's distance is recomputed directly, so no cancellation error reaches the result.
    """
    q_all, b = (
        torch.from_numpy(np.asarray(queries, np.float64)),
        torch.from_numpy(np.asarray(points, np.float64)),
    )
    b_sq = (b * b).sum(1)
    out = np.empty(len(q_all))
    for start in range(0, len(q_all), chunk):
        q = q_all[start : start + chunk]
        best = _sq_dists(q, b, b_sq).argmin(1)
        out[start : start + chunk] = (q - b[best]).norm(dim=1).numpy()
    return out


def nearest_lp_brute(
    queries: np.ndarray, points: np.ndarray, p: float, chunk: int = 256
) -> np.ndarray:
    """Exact l_p nearest-neighbour distances by brute force (``torch.cdist``), chunked."""
    q_all, b = (
        torch.from_numpy(np.asarray(queries, np.float64)),
        torch.from_numpy(np.asarray(points, np.float64)),
    )
    out = np.empty(len(q_all))
    for start in range(0, len(q_all), chunk):
        out[start : start + chunk] = (
            torch.cdist(q_all[start : start + chunk], b, p=p).amin(1).numpy()
        )
    return out


def nearest_lp(
    queries: np.ndarray, points: np.ndarray, p: float, chunk: int = 512, top: int = 8
) -> np.ndarray:
    """Exact l_p nearest-neighbour distances, 1 <= p <= 2, pruned by l_2 (still exact).

    For p <= 2, ``||x||_p >= ||x||_2``: after evaluating the ``top`` l_2-nearest candidates, any point
    whose l_2 distance exceeds the best l_p distance found cannot win, so l_p is evaluated only on the
    few points inside that l_2 ball (the l_2 distances come from one matmul).
    """
    if p == 2:
        return nearest_l2(queries, points, chunk)
    q_all, b = (
        torch.from_numpy(np.asarray(queries, np.float64)),
        torch.from_numpy(np.asarray(points, np.float64)),
    )
    b_sq = (b * b).sum(1)
    top = min(top, len(b))
    out = np.empty(len(q_all))
    for start in range(0, len(q_all), chunk):
        q = q_all[start : start + chunk]
        l2 = _sq_dists(q, b, b_sq).sqrt_()
        near = l2.topk(top, dim=1, largest=False).indices
        best = ((q[:, None, :] - b[near]).abs() ** p).sum(-1).amin(1) ** (1 / p)
        rows, cols = torch.nonzero(l2 <= best[:, None] * (1 + 1e-9) + 1e-12, as_tuple=True)
        dist = ((q[rows] - b[cols]).abs() ** p).sum(-1) ** (1 / p)
        best = best.scatter_reduce(0, rows, dist, reduce="amin")
        out[start : start + chunk] = best.numpy()
    return out


def chamfer_exact(a: np.ndarray, b: np.ndarray, p: float = 2.0, brute: bool = False) -> float:
    """Exact ``CH(A, B)``: matmul trick for p = 2, l_2-pruned (or brute-force) l_p otherwise."""
    if p == 2:
        return float(nearest_l2(a, b).sum())
    return float((nearest_lp_brute(a, b, p) if brute else nearest_lp(a, b, p)).sum())


# -- 3. embeddings l_p -> l_1 for the crude stage --------------------------------------------------


def symmetric_stable(alpha: float, size: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Standard symmetric alpha-stable variates (char. function exp(-|t|^alpha)), Chambers-Mallows-Stuck."""
    theta = rng.uniform(-np.pi / 2, np.pi / 2, size)
    w = rng.exponential(1.0, size)
    if alpha == 1:
        return np.tan(theta)
    return (
        np.sin(alpha * theta)
        / np.cos(theta) ** (1 / alpha)
        * (np.cos((1 - alpha) * theta) / w) ** ((1 - alpha) / alpha)
    )


def stable_mean_abs(alpha: float) -> float:
    """``E|X|`` of a standard symmetric alpha-stable variable, alpha > 1: ``(2/pi) Gamma(1 - 1/alpha)``."""
    return 2 / math.pi * math.gamma(1 - 1 / alpha)


@dataclass
class ToeplitzJL:
    """``F(x) = T (s * x) / sqrt(k)``: T a k x d Gaussian Toeplitz matrix, s random signs; by FFT.

    ``T_ij = g[i - j + d - 1]`` with ``g`` of length d + k - 1; ``E||F x||_2^2 = ||x||_2^2``. Gaussian
    rows are 2-stable, so ``||F x||_1`` is also proportional to ``||x||_2`` (the grids use l_1).
    """

    g: np.ndarray
    signs: np.ndarray
    k: int

    @classmethod
    def draw(cls, d: int, k: int, rng: np.random.Generator) -> ToeplitzJL:
        return cls(rng.standard_normal(d + k - 1), rng.choice([-1.0, 1.0], d), k)

    def matrix(self) -> np.ndarray:
        """The explicit k x d matrix (for checks)."""
        d = len(self.signs)
        i, j = np.arange(self.k)[:, None], np.arange(d)[None, :]
        return self.g[i - j + d - 1] * self.signs[None, :] / math.sqrt(self.k)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        d = len(self.signs)
        size = 1 << (2 * d + self.k - 2).bit_length()
        spectrum = np.fft.rfft(x * self.signs, size, axis=1) * np.fft.rfft(self.g, size)
        return np.fft.irfft(spectrum, size, axis=1)[:, d - 1 : d - 1 + self.k] / math.sqrt(self.k)


def lp_embedding(d: int, p: float, k: int, rng: np.random.Generator):  # noqa: ANN201
    """A map R^d -> R^k with ``E||F(x) - F(y)||_1 ~ ||x - y||_p`` (p-stable; Toeplitz JL for p = 2)."""
    if p == 2:
        jl = ToeplitzJL.draw(d, k, rng)
        scale = math.sqrt(math.pi / 2) / math.sqrt(k)  # E|N(0, 1)| = sqrt(2/pi)
        return lambda x: jl(x) * scale
    s = symmetric_stable(p, (d, k), rng) / (k * stable_mean_abs(p))
    return lambda x: x @ s


# -- 4. crude estimates and the estimator ----------------------------------------------------------


def crude_estimates(
    a: np.ndarray,
    b: np.ndarray,
    p: float,
    rng: np.random.Generator,
    k: int | None = None,
    repeats: int = 2,
    candidates: int = 2,
    max_levels: int = 40,
) -> np.ndarray:
    """Upper bounds ``D_a >= opt_a`` from randomly shifted nested grids over an l_p -> l_1 embedding.

    Per repeat: one random shift, cells halving from the data's extent; the finest level at which
    ``a``'s cell also holds B points gives up to ``candidates`` of them, measured exactly in l_p.
    O((n + m) (d k + levels log n)) time.
    """
    n, d = a.shape
    k = k or max(8, int(math.ceil(1.5 * math.log2(len(b) + 1))))
    best = np.full(n, np.inf)
    for _ in range(repeats):
        embed = lp_embedding(d, p, k, rng)
        fa, fb = embed(a), embed(b)
        low = np.minimum(fa.min(0), fb.min(0))
        width = float(max((fa.max(0) - low).max(), (fb.max(0) - low).max())) * 2 + 1e-300
        shift = rng.random(k) * width
        ga, gb = (fa - low + shift) / width, (fb - low + shift) / width
        mult = rng.integers(1, 2**62, size=k, dtype=np.int64) | 1
        cand = rng.integers(len(b), size=(n, candidates))  # fallback: random points of B
        active = np.arange(n)
        for level in range(max_levels):
            scale = float(2**level)
            key_b = (np.floor(gb * scale).astype(np.int64) * mult).sum(1)
            order = np.argsort(key_b, kind="stable")
            sorted_b = key_b[order]
            key_a = (np.floor(ga[active] * scale).astype(np.int64) * mult).sum(1)
            pos = np.searchsorted(sorted_b, key_a)
            found = sorted_b[np.minimum(pos, len(b) - 1)] == key_a
            if not found.any():
                break
            active, pos = active[found], pos[found]
            for c in range(candidates):
                nxt = np.minimum(pos + c, len(b) - 1)
                same = sorted_b[nxt] == sorted_b[pos]
                cand[active, c] = np.where(same, order[nxt], order[pos])
        dist = np.stack(
            [np.linalg.norm(a - b[cand[:, c]], ord=p, axis=1) for c in range(candidates)], 1
        ).min(1)
        best = np.minimum(best, dist)
    return best


@dataclass
class ChamferEstimate:
    estimate: float
    crude_sum: float  # sum of D_a (>= CH)
    samples: int  # T
    relative_variance: float  # pilot estimate of Var(opt/D) / E(opt/D)^2
    seconds: float


def _importance(
    crude: np.ndarray, a: np.ndarray, b: np.ndarray, p: float, t: int, rng: np.random.Generator
) -> np.ndarray:
    """T draws ~ D_a / sum D; returns the ratios ``opt_a / D_a`` (exact opt for each drawn point)."""
    idx = rng.choice(len(a), t, p=crude / crude.sum())
    uniq, inverse = np.unique(idx, return_inverse=True)
    opt = nearest_lp(a[uniq], b, p)
    return opt[inverse] / crude[idx]


def chamfer_estimate(
    a: np.ndarray,
    b: np.ndarray,
    p: float = 2.0,
    eps: float = 0.05,
    delta: float = 0.1,
    seed: int = 0,
    samples: int | None = None,
    pilot: int = 100,
    min_samples: int = 100,
    k: int | None = None,
) -> ChamferEstimate:
    """Unbiased estimate of ``CH(A, B)`` under l_p; T set so ``P(|err| > eps) ~<= delta`` (CLT).

    A pilot of ``pilot`` draws estimates the relative variance v of ``opt/D``; then
    ``T = z_{1 - delta/2}^2 v / eps^2`` fresh draws (so T is independent of them: no bias).
    ``samples`` fixes T instead.
    """
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    crude = crude_estimates(a, b, p, rng, k=k)
    total = float(crude.sum())
    if total == 0:
        return ChamferEstimate(0.0, 0.0, 0, 0.0, time.perf_counter() - started)
    var = float("nan")
    if samples is None:
        ratios = _importance(crude, a, b, p, pilot, rng)
        var = float(ratios.var(ddof=1) / max(ratios.mean(), 1e-300) ** 2)
        z = statistics.NormalDist().inv_cdf(1 - delta / 2)
        samples = int(min(max(min_samples, math.ceil(z * z * var / eps**2)), 50 * len(a)))
    ratios = _importance(crude, a, b, p, samples, rng)
    estimate = total * float(ratios.mean())
    return ChamferEstimate(estimate, total, samples, var, time.perf_counter() - started)


def chamfer_uniform(a: np.ndarray, b: np.ndarray, p: float, samples: int, seed: int = 0) -> float:
    """Ablation: uniform sampling ``n * mean(opt_a)`` with the same number of exact queries."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(len(a), size=samples)
    uniq, inverse = np.unique(idx, return_inverse=True)
    return float(len(a) * nearest_lp(a[uniq], b, p)[inverse].mean())


# -- 5. federated: Chamfer profiles to a broadcast reference bank ----------------------------------


def client_similarity(profiles: np.ndarray) -> np.ndarray:
    """Similarity ``exp(-||P_i - P_j||^2 / median)`` between clients' centred log-Chamfer profiles.

    Centring each log-profile removes a client's overall scale, leaving which references it is near.
    """
    logp = np.log(np.maximum(profiles, 1e-12))
    logp = logp - logp.mean(1, keepdims=True)
    sq = ((logp[:, None, :] - logp[None, :, :]) ** 2).sum(-1)
    off = sq[~np.eye(len(sq), dtype=bool)]
    scale = float(np.median(off)) if off.size and np.median(off) > 0 else 1.0
    return np.exp(-sq / scale)


def nearest_neighbour_agreement(similarity: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of clients whose most similar other client has the same label (shape family)."""
    sim = similarity.copy()
    np.fill_diagonal(sim, -np.inf)
    return float((labels[sim.argmax(1)] == labels).mean())


def _record(**arrays: np.ndarray) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


@dataclass
class ClientCloud:
    family: int  # index into SHAPES; the points are redrawn every round (a drifting sensor)


@WORKLOADS.register(
    "chamfer",
    "Near-linear l_p Chamfer (crude grids + importance sampling); client-similarity matrix",
)
class Chamfer(Workload):
    @dataclass
    class Params:
        p: float = param(1.5, gt=0)
        dim: int = param(16, ge=1)
        points: int = param(2000, ge=1)
        reference_points: int = param(2000, ge=1)
        eps: float = param(0.05, gt=0)
        delta: float = param(0.1, gt=0, lt=1)
        subsample: int = param(200, ge=1)
        noise: float = param(0.02, ge=0)
        check_exact: bool = True  # also compute exact CH (O(n^2 d)) to report the error

    params: Params

    def _references(self) -> np.ndarray:
        rng = np.random.default_rng(client_seed(self.ctx.seed, 10**6, 0))
        pr = self.params
        return np.stack([make_shape(s, pr.reference_points, pr.dim, rng, pr.noise) for s in SHAPES])

    def load_partition(self, partition_id: int, num_partitions: int) -> ClientCloud:
        """Client i holds a noisy, rescaled shape of family i mod 4 (non-IID by construction)."""
        return ClientCloud(partition_id % len(SHAPES))

    def _cloud(self, data: ClientCloud, partition_id: int, server_round: int) -> np.ndarray:
        rng = np.random.default_rng(client_seed(self.ctx.seed, partition_id, server_round))
        pr = self.params
        scale = 1.0 + 0.03 * rng.standard_normal()
        return scale * make_shape(SHAPES[data.family], pr.points, pr.dim, rng, pr.noise)

    def init_arrays(self) -> ArrayRecord:
        n = self.ctx.num_clients
        refs = self._references()
        return _record(reference=refs, profile=np.zeros((n, len(refs))), present=np.zeros(n))

    def fit(
        self, arrays: ArrayRecord, data: ClientCloud, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        """Chamfer(client -> each reference): estimate, exact on a subsample, exact (small n), time."""
        torch.set_num_threads(1)
        pid, rnd = int(config["partition-id"]), int(config["server-round"])
        refs = arrays["reference"].numpy()
        cloud = self._cloud(data, pid, rnd)
        pr = self.params
        profile = np.zeros(len(refs))
        errors, sub_errors, vs_sub, times, crude_ratio, exact_s = [], [], [], [], [], 0.0
        for j, ref in enumerate(refs):
            seed = client_seed(self.ctx.seed, pid, rnd, salt=j)
            est = chamfer_estimate(cloud, ref, pr.p, pr.eps, pr.delta, seed=seed)
            sub = np.random.default_rng(seed).choice(len(cloud), pr.subsample, replace=False)
            sub_value = len(cloud) / pr.subsample * float(nearest_lp(cloud[sub], ref, pr.p).sum())
            profile[j] = est.estimate / len(cloud)
            times.append(est.seconds)
            vs_sub.append(abs(est.estimate / sub_value - 1))
            crude_ratio.append(est.crude_sum / est.estimate)
            if pr.check_exact:
                started = time.perf_counter()
                exact = chamfer_exact(cloud, ref, pr.p)
                exact_s += time.perf_counter() - started
                errors.append(abs(est.estimate / exact - 1))
                sub_errors.append(abs(sub_value / exact - 1))
                crude_ratio[-1] = est.crude_sum / exact
        n = self.ctx.num_clients
        out_profile, present = np.zeros((n, len(refs))), np.zeros(n)
        out_profile[pid], present[pid] = profile, 1.0
        metrics = {
            "num-examples": len(cloud),
            "estimate_vs_subsample": float(np.mean(vs_sub)),
            "crude_ratio": float(np.mean(crude_ratio)),
            "estimate_s": float(np.sum(times)),
        }
        if errors:
            metrics["rel_error"] = float(np.mean(errors))
            metrics["rel_error_max"] = float(np.max(errors))
            metrics["subsample_rel_error"] = float(np.mean(sub_errors))
            metrics["exact_s"] = exact_s
        return _record(reference=refs, profile=out_profile, present=present), metrics

    def evaluate(
        self, arrays: ArrayRecord, data: ClientCloud, config: RoundConfig
    ) -> dict[str, float]:
        return {"num-examples": 1}

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        """Recover each client's profile (FedAvg weights cancel in profile / present) and compare."""
        if server_round == 0:
            return None
        present = arrays["present"].numpy()
        seen = present > 0
        if seen.sum() < 2:
            return None
        profiles = arrays["profile"].numpy()[seen] / present[seen, None]
        labels = np.arange(len(present))[seen] % len(SHAPES)
        sim = client_similarity(profiles)
        same = labels[:, None] == labels[None, :]
        off = ~np.eye(len(sim), dtype=bool)
        return {
            "similarity_nn_agreement": nearest_neighbour_agreement(sim, labels),
            "similarity_same_family": float(sim[same & off].mean()) if (same & off).any() else 0.0,
            "similarity_other_family": float(sim[~same].mean()) if (~same).any() else 0.0,
        }
