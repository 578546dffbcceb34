"""Federated LLM routing benchmark: AUC of the accuracy-cost hull per router.

For each (seed, Dirichlet alpha, model coverage) on the synthetic benchmark (10 clients):
fed-mlp and fed-kmeans run through Flower (the registered strategies, the ClientApp, the
in-process grid); client-local and centralised routers are the same learners fitted on one client's
data / on the pooled data; oracle = argmax of the true utility; single = best mix of single models.
AUC is averaged over the clients' own test sets (local routers may only route to the models the
client evaluated); "norm" is (AUC - single) / (oracle - single) of those averages.

    python benchmarks/routing.py                       # 3 seeds x alpha {0.1, 1} x coverage {0.3, 0.7}
    python benchmarks/routing.py --seeds 0 --alphas 0.1 --coverages 0.3 --jobs 1
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flowerbed.apps.client_app import app as client_app  # noqa: E402
from flowerbed.clients.core.config import to_json  # noqa: E402
from flowerbed.clients.runtime import CONFIG_KEY  # noqa: E402
from flowerbed.clients.workloads import WORKLOADS  # noqa: E402
from flowerbed.clients.workloads.routing import (  # noqa: E402
    MLPConfig,
    RouterData,
    benchmark_for,
    fit_kmeans_router,
    fit_mlp_router,
    kmeans_predict,
    mlp_predict,
    ndch,
    pool,
    score_router,
)
from flowerbed.server.engines.inline import InlineGrid  # noqa: E402
from flowerbed.server.experiment import load_experiment  # noqa: E402
from flowerbed.server.runner import OrderedGrid  # noqa: E402
from flowerbed.strategies import STRATEGIES  # noqa: E402

CENTRAL_EPOCHS = 10  # pooled MLP: more epochs overfit (tuned on seed 0, alpha 0.1, coverage 0.3)
ROUTERS = ["fed-mlp", "central-mlp", "local-mlp", "fed-kmeans", "central-kmeans", "local-kmeans"]
ROUTERS += ["oracle", "single", "random"]


def run_federated(cfg: dict) -> ArrayRecord:
    """The registered strategy on the in-process grid with the flowerbed ClientApp."""
    random.seed(cfg["seed"])
    strategy = STRATEGIES.get(cfg["strategy"]["name"]).build(cfg)
    config = ConfigRecord({CONFIG_KEY: to_json(cfg)})
    result = strategy.start(
        grid=OrderedGrid(InlineGrid(client_app, cfg["clients"]["num"]), lambda r, n: None),
        initial_arrays=WORKLOADS.get(cfg["workload"]["name"])(cfg).init_arrays(),
        num_rounds=cfg["rounds"],
        train_config=config,
        evaluate_config=config,
    )
    return result.arrays


def _cfg(preset: str, seed: int, alpha: float, coverage: float, extra: list[str]) -> dict:
    overrides = [f"seed={seed}", f"clients.alpha={alpha}", f"workload.params.coverage={coverage}"]
    overrides += ["engine=inline", "clients.fraction_evaluate=0"]
    return load_experiment(preset, overrides + extra)


def run_setting(args: tuple[int, float, float, list[str]]) -> dict:
    """All routers on one (seed, alpha, coverage); per-client scores and global-test scores.
    The fourth item holds extra overrides of the MLP preset (e.g. ``rounds=20``)."""
    seed, alpha, coverage, mlp_extra = args
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    started = time.perf_counter()
    mlp_cfg = _cfg("routing-synthetic-mlp", seed, alpha, coverage, mlp_extra)
    km_cfg = _cfg("routing-synthetic-kmeans", seed, alpha, coverage, [])
    bench = benchmark_for(mlp_cfg)
    mp, kp = mlp_cfg["workload"]["params"], km_cfg["workload"]["params"]
    mlp_conf = MLPConfig(**{k: mp[k] for k in MLPConfig.__dataclass_fields__})
    epochs = mlp_cfg["rounds"] * mlp_conf.local_epochs
    iters = km_cfg["rounds"] - 1
    k, shrink = kp["clusters"], kp["shrinkage"]

    fed_mlp = WORKLOADS.get("routing-mlp")(mlp_cfg)
    fed_mlp_arrays = run_federated(mlp_cfg)
    fed_km = WORKLOADS.get("routing-kmeans")(km_cfg)
    fed_km_arrays = run_federated(km_cfg)
    pooled = pool(bench.train)
    central_mlp = fit_mlp_router(pooled, mlp_conf, CENTRAL_EPOCHS, seed)
    central_km = fit_kmeans_router(pooled, k, iters, shrink, seed)

    def predictors(client: int | None) -> dict:
        out = {
            "fed-mlp": lambda e: fed_mlp.predict(fed_mlp_arrays, e),
            "fed-kmeans": lambda e: fed_km.predict(fed_km_arrays, e),
            "central-mlp": lambda e: mlp_predict(central_mlp, e),
            "central-kmeans": lambda e: kmeans_predict(*central_km, e),
        }
        if client is not None:
            own = bench.train[client]
            local_mlp = fit_mlp_router(own, mlp_conf, epochs, seed + client)
            local_km = fit_kmeans_router(own, k, iters, shrink, seed + client)
            out["local-mlp"] = lambda e: mlp_predict(local_mlp, e)
            out["local-kmeans"] = lambda e: kmeans_predict(*local_km, e)
        return out

    per_client: dict[str, list[dict]] = {r: [] for r in ROUTERS}
    curves: dict[str, tuple] = {}
    for client in range(len(bench.test)):
        test = bench.test[client]
        for name, predict in predictors(client).items():
            allowed = bench.coverage[client] if name.startswith("local") else None
            score = score_router(*predict(test.emb), test, allowed=allowed)
            per_client[name].append({"auc": score.auc, "subopt": score.subopt})
            if client == 0:
                curves[name] = (score.costs.tolist(), score.accs.tolist())
            if name == "fed-kmeans":
                per_client["oracle"].append({"auc": score.oracle_auc, "subopt": 0.0})
                per_client["single"].append({"auc": score.single_auc, "subopt": np.nan})
                per_client["random"].append({"auc": random_auc(test), "subopt": np.nan})
    summary = {}
    for name, rows in per_client.items():
        summary[name] = {
            "auc": float(np.mean([r["auc"] for r in rows])),
            "subopt": float(np.mean([r["subopt"] for r in rows])),
        }
    test = bench.global_test
    for name, predict in predictors(None).items():
        score = score_router(*predict(test.emb), test)
        summary[name] |= {"global_auc": score.auc, "global_norm": score.auc_norm}
        curves[f"global:{name}"] = (score.costs.tolist(), score.accs.tolist())
    curves["oracle"] = _oracle_curve(bench.test[0])
    curves["single"] = (
        bench.test[0].cost_true.mean(0).tolist(),
        bench.test[0].p_true.mean(0).tolist(),
    )
    return {
        "seed": seed,
        "alpha": alpha,
        "coverage": coverage,
        "routers": summary,
        "curves": curves,
        "wall_s": time.perf_counter() - started,
    }


def random_auc(test: RouterData) -> float:
    """Uniformly random model per query (mixing with abstention along the hull)."""
    costs, accs = test.cost_true.mean(0), test.p_true.mean(0)
    c_lo, c_hi = float(costs.min()), float(costs.max())
    from flowerbed.clients.workloads.routing import hull_auc

    return hull_auc(np.array([costs.mean()]), np.array([accs.mean()]), c_lo, c_hi)


def _oracle_curve(test: RouterData) -> tuple[list, list]:
    score = score_router(test.p_true, test.cost_true, test)
    return score.costs.tolist(), score.accs.tolist()


def table(results: list[dict]) -> str:
    """Markdown: mean +- std over seeds of the client-averaged AUC, per (alpha, coverage)."""
    settings = sorted({(r["alpha"], r["coverage"]) for r in results})
    shown = ["fed-mlp", "central-mlp", "local-mlp", "fed-kmeans", "central-kmeans"]
    shown += ["local-kmeans", "oracle", "single", "random"]
    lines = ["| alpha | coverage | " + " | ".join(shown) + " |", "|---" * (len(shown) + 2) + "|"]
    norm_lines = list(lines)
    for alpha, coverage in settings:
        runs = [r for r in results if (r["alpha"], r["coverage"]) == (alpha, coverage)]
        cells, norm_cells = [], []
        for name in shown:
            auc = np.array([r["routers"][name]["auc"] for r in runs])
            lo = np.array([r["routers"]["single"]["auc"] for r in runs])
            hi = np.array([r["routers"]["oracle"]["auc"] for r in runs])
            norm = (auc - lo) / (hi - lo)
            cells.append(f"{auc.mean():.4f} ± {auc.std():.4f}")
            norm_cells.append(f"{norm.mean():.3f} ± {norm.std():.3f}")
        lines.append(f"| {alpha} | {coverage} | " + " | ".join(cells) + " |")
        norm_lines.append(f"| {alpha} | {coverage} | " + " | ".join(norm_cells) + " |")
    gaps = ["| alpha | coverage | router | fed vs central (% AUC) | fed - local (AUC) |"]
    gaps.append("|---|---|---|---|---|")
    for alpha, coverage in settings:
        runs = [r for r in results if (r["alpha"], r["coverage"]) == (alpha, coverage)]
        for kind in ("mlp", "kmeans"):
            fed = np.array([r["routers"][f"fed-{kind}"]["auc"] for r in runs])
            cen = np.array([r["routers"][f"central-{kind}"]["auc"] for r in runs])
            loc = np.array([r["routers"][f"local-{kind}"]["auc"] for r in runs])
            rel = 100 * (fed - cen) / cen
            gaps.append(
                f"| {alpha} | {coverage} | {kind} | {rel.mean():+.2f} ± {rel.std():.2f} | "
                f"{(fed - loc).mean():+.4f} ± {(fed - loc).std():.4f} |"
            )
    learned = ["fed-mlp", "central-mlp", "local-mlp", "fed-kmeans", "central-kmeans"]
    learned += ["local-kmeans"]
    sub = ["| alpha | coverage | " + " | ".join(learned) + " |", "|---" * (len(learned) + 2) + "|"]
    fed_central = ["fed-mlp", "central-mlp", "fed-kmeans", "central-kmeans"]
    glob = ["| alpha | coverage | " + " | ".join(fed_central) + " |"]
    glob.append("|---" * (len(fed_central) + 2) + "|")
    for alpha, coverage in settings:
        runs = [r for r in results if (r["alpha"], r["coverage"]) == (alpha, coverage)]

        def mean(name: str, key: str, runs: list = runs) -> float:
            return float(np.mean([r["routers"][name][key] for r in runs]))

        sub.append(
            f"| {alpha} | {coverage} | "
            + " | ".join(f"{mean(n, 'subopt'):.4f}" for n in learned)
            + " |"
        )
        glob.append(
            f"| {alpha} | {coverage} | "
            + " | ".join(
                f"{mean(n, 'global_auc'):.4f} ({mean(n, 'global_norm'):.2f})" for n in fed_central
            )
            + " |"
        )
    return "\n".join(
        ["AUC (client-averaged):", "", *lines, "", "Normalised AUC:", "", *norm_lines, "", *gaps]
        + ["", "Routing suboptimality (client-averaged, mean over seeds):", "", *sub]
        + ["", "Global test set, AUC (normalised), mean over seeds:", "", *glob]
    )


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in ROUTERS:
        if name not in result["curves"] or name == "random":
            continue
        costs, accs = result["curves"][name]
        if name == "single":
            ax.scatter(costs, accs, marker="x", color="k", label="single models")
            continue
        hx, hy = ndch(np.array(costs), np.array(accs))
        style = "--" if name.startswith("local") else ("-." if name.startswith("central") else "-")
        ax.plot(np.r_[hx, max(costs + [hx[-1]])], np.r_[hy, hy[-1]], style, label=name)
    ax.set_xlabel("mean cost per query ($ per 1k queries)")
    ax.set_ylabel("expected accuracy")
    ax.set_title(
        f"client 0 test set, alpha={result['alpha']}, coverage={result['coverage']}, "
        f"seed={result['seed']} (NDCH)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--coverages", type=float, nargs="+", default=[0.3, 0.7])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    parser.add_argument("--plot", type=Path, default=None, help="curves of the first setting")
    parser.add_argument("--mlp-rounds", type=int, default=None, help="override the MLP preset")
    parser.add_argument(
        "--mlp-set", nargs="*", default=[], help="dotlist overrides of the MLP preset"
    )
    parser.add_argument("--from-json", type=Path, default=None, help="re-print saved results")
    args = parser.parse_args()
    if args.from_json:
        results = json.loads(args.from_json.read_text())
        print(table(results))
        if args.plot:
            plot(results[0], args.plot)
        return
    extra = [] if args.mlp_rounds is None else [f"rounds={args.mlp_rounds}"]
    extra += args.mlp_set
    settings = [(s, a, c, extra) for a in args.alphas for c in args.coverages for s in args.seeds]
    started = time.perf_counter()
    results = []
    with Pool(args.jobs) as workers:
        for result in workers.imap(run_setting, settings):
            results.append(result)
            fed = {k: round(result["routers"][k]["auc"], 4) for k in ROUTERS}
            print(
                f"seed {result['seed']} alpha {result['alpha']} coverage {result['coverage']}:"
                f" {fed} ({result['wall_s']:.0f} s)",
                flush=True,
            )
    print(table(results))
    print(f"\n{len(settings)} settings in {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results))
    if args.plot:
        plot(results[0], args.plot)


if __name__ == "__main__":
    main()
