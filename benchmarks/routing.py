"""Federated LLM routing benchmark: AUC of the accuracy-cost hull per router.

For each (seed, Dirichlet alpha, model coverage), on the synthetic benchmark or on an evaluation
table (``--table``; clients by Dirichlet topic mixtures, or ``--partition-by COLUMN``): fed-mlp and
fed-kmeans run through Flower (the registered strategies, the ClientApp, the in-process grid);
client-local and centralised routers are the same learners fitted on one client's data / on the
pooled data; personalised routers are the federated one adapted to each client's own evaluations;
oracle = argmax of the true utility; single = best mix of single models. AUC is averaged over the
clients' own test sets (local routers may only route to the models the client evaluated); "norm"
is (AUC - single) / (oracle - single) per seed; APGR is (AUC - cheapest model's accuracy) /
(best model's accuracy - cheapest model's accuracy).

    python benchmarks/routing.py                       # 3 seeds x alpha {0.1, 1} x coverage {0.3, 0.7}
    python benchmarks/routing.py --seeds 0 --alphas 0.1 --coverages 0.3 --jobs 1
    python benchmarks/routing.py --table evals.csv --partition-by subject --coverages 1.0 \
        --set clients.num=4 workload.params.n_train=300
    python benchmarks/routing.py --mutants            # claim tests against hand-made mutants
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import subprocess
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowerbed.apps.client_app import app as client_app  # noqa: E402
from flowerbed.apps.inline import InlineGrid  # noqa: E402
from flowerbed.clients.core.config import Experiment, load_base, to_json  # noqa: E402
from flowerbed.clients.runtime import CONFIG_KEY  # noqa: E402
from flowerbed.clients.workloads import build_workload  # noqa: E402
from flowerbed.clients.workloads.routing.data import BenchmarkParams, RouterData, pool  # noqa: E402
from flowerbed.clients.workloads.routing.kmeans import KMeansConfig, fit_kmeans_router  # noqa: E402
from flowerbed.clients.workloads.routing.metrics import ndch, score_router  # noqa: E402
from flowerbed.clients.workloads.routing.mlp import (  # noqa: E402
    MLPConfig,
    fit_mlp_router,
    mlp_predict,
    personalise_mlp,
)
from flowerbed.server.experiment import load_experiment  # noqa: E402
from flowerbed.server.grid import OrderedGrid  # noqa: E402
from flowerbed.strategies.context import build_strategy  # noqa: E402

CENTRAL_EPOCHS = 10  # pooled MLP: more epochs overfit (tuned on seed 0, alpha 0.1, coverage 0.3)
LEARNED = ["fed-mlp", "central-mlp", "local-mlp", "pers-mlp"]
LEARNED += ["fed-kmeans", "central-kmeans", "local-kmeans", "pers-kmeans"]
ROUTERS = [*LEARNED, "oracle", "single", "random"]
FARTHEST = 0.3  # share of clients whose topic mixture is farthest from the others'


def run_federated(cfg: Experiment) -> ArrayRecord:
    """The registered strategy on the in-process grid with the flowerbed ClientApp."""
    random.seed(cfg.seed)
    workload = build_workload(cfg)
    strategy = build_strategy(cfg, workload)
    config = ConfigRecord({CONFIG_KEY: to_json(cfg)})
    result = strategy.start(
        grid=OrderedGrid(InlineGrid(client_app, cfg.clients.num), lambda r, n: None),
        initial_arrays=workload.init_arrays(),
        num_rounds=cfg.rounds,
        train_config=config,
        evaluate_config=config,
    )
    return result.arrays


def _cfg(
    preset: str, seed: int, alpha: float, coverage: float, extra: list[str], base: dict
) -> Experiment:
    """The preset with ``base`` (clients + data keys of a YAML config) and the overrides."""
    overrides = [f"seed={seed}", f"workload.params.coverage={coverage}"]
    partitioned = base.get("clients", {}).get("partition_by") is not None
    if not partitioned and not any(o.startswith("clients.partition_by=") for o in extra):
        overrides.append(f"clients.alpha={alpha}")
    overrides += ["engine=inline", "clients.fraction_evaluate=0"]
    return load_experiment(preset, overrides + extra, **base)


def data_overrides(path: Path | None) -> dict:
    """The clients section and the data keys of ``workload.params`` of an experiment YAML, so
    both routers run on the data an experiment config describes."""
    if path is None:
        return {}
    raw = load_base(str(path))
    params = raw.get("workload", {}).get("params", {})
    data = {k: v for k, v in params.items() if k in BenchmarkParams.__dataclass_fields__}
    data.pop("coverage", None)  # --coverages sets it
    return {"clients": raw.get("clients", {}), "workload": {"params": data}}


def farthest_clients(mixtures: np.ndarray, share: float = FARTHEST) -> list[int]:
    """Clients whose topic mixture is farthest (total variation) from the mean of the others'."""
    n = len(mixtures)
    others = (mixtures.sum(0, keepdims=True) - mixtures) / max(n - 1, 1)
    distance = 0.5 * np.abs(mixtures - others).sum(1)
    return sorted(np.argsort(-distance, kind="stable")[: max(1, round(share * n))].tolist())


#: the MLP preset's former (hard) setting, which the tables of docs/routing.md were measured on:
#: the same benchmark as the K-means preset (10 clients, 11 models), 20 rounds x 5 local epochs
HARD_MLP = ["clients.num=10", "rounds=20", "workload.params.models=11",
            "workload.params.n_train=200", "workload.params.n_test=200",
            "workload.params.n_global_test=2000", "workload.params.local_epochs=5"]  # fmt: skip


def run_setting(args: tuple) -> dict:
    """All routers on one (seed, alpha, coverage); per-client scores and global-test scores.
    ``extra`` overrides both presets (a table, a partition column, clients.num); ``mlp_extra``
    only the MLP preset (e.g. ``rounds=20``)."""
    seed, alpha, coverage, mlp_extra, extra, base = args
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    started = time.perf_counter()
    mlp_cfg = _cfg("routing-synthetic-mlp", seed, alpha, coverage, HARD_MLP + extra + mlp_extra, base)  # fmt: skip
    km_cfg = _cfg("routing-synthetic-kmeans", seed, alpha, coverage, extra, base)
    fed_mlp = build_workload(mlp_cfg)
    bench = fed_mlp.bench
    mp, kp = mlp_cfg.workload.params, km_cfg.workload.params
    mlp_conf = MLPConfig(**{k: getattr(mp, k) for k in MLPConfig.__dataclass_fields__})
    km_conf = KMeansConfig(**{k: getattr(kp, k) for k in KMeansConfig.__dataclass_fields__})
    epochs = mlp_cfg.rounds * mlp_conf.local_epochs
    iters = km_cfg.rounds - 1

    fed_mlp_arrays = run_federated(mlp_cfg)
    fed_mlp_model = fed_mlp._load(fed_mlp_arrays)
    fed_km = build_workload(km_cfg).router(run_federated(km_cfg))
    pooled = pool(bench.train)
    central_mlp = fit_mlp_router(pooled, mlp_conf, CENTRAL_EPOCHS, seed)
    central_km = fit_kmeans_router(pooled, km_conf, iters, seed)

    def predictors(client: int | None) -> dict:
        out = {
            "fed-mlp": lambda e: mlp_predict(fed_mlp_model, e),
            "fed-kmeans": fed_km.predict,
            "central-mlp": lambda e: mlp_predict(central_mlp, e),
            "central-kmeans": central_km.predict,
        }
        if client is not None:
            own = bench.train[client]
            local_mlp = fit_mlp_router(own, mlp_conf, epochs, seed + client)
            local_km = fit_kmeans_router(own, km_conf, iters, seed + client)
            pers_mlp = personalise_mlp(fed_mlp_model, own, mlp_conf, seed + client)
            out["local-mlp"] = lambda e: mlp_predict(local_mlp, e)
            out["local-kmeans"] = local_km.predict
            out["pers-mlp"] = lambda e: mlp_predict(pers_mlp, e)
            out["pers-kmeans"] = fed_km.personalised(own, km_conf.personal_strength).predict
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
                refs = {"single": score.single_auc, "oracle": score.oracle_auc}
                refs |= {"weak": score.weak_acc, "strong": score.strong_acc}
                per_client["oracle"].append({"auc": score.oracle_auc, "subopt": 0.0} | refs)
                per_client["single"].append({"auc": score.single_auc, "subopt": np.nan})
                per_client["random"].append({"auc": random_auc(test), "subopt": np.nan})
    far = farthest_clients(bench.mixtures)
    summary = {}
    for name, rows in per_client.items():
        summary[name] = {
            "auc": float(np.mean([r["auc"] for r in rows])),
            "subopt": float(np.mean([r["subopt"] for r in rows])),
            "far_auc": float(np.mean([rows[k]["auc"] for k in far])),
        }
    refs = per_client["oracle"]
    for key in ("weak", "strong"):
        summary["oracle"][key] = float(np.mean([r[key] for r in refs]))
        summary["oracle"][f"far_{key}"] = float(np.mean([refs[k][key] for k in far]))
    test = bench.global_test
    for name, predict in predictors(None).items():
        score = score_router(*predict(test.emb), test)
        summary[name] |= {"global_auc": score.auc, "global_norm": score.auc_norm}
        summary[name] |= {"global_apgr": score.apgr}
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
        "setting": " ".join(extra) or base.get("clients", {}).get("partition_by") or "",
        "farthest": far,
        "routers": summary,
        "curves": curves,
        "wall_s": time.perf_counter() - started,
    }


def random_auc(test: RouterData) -> float:
    """Uniformly random model per query (mixing with abstention along the hull)."""
    costs, accs = test.cost_true.mean(0), test.p_true.mean(0)
    c_lo, c_hi = float(costs.min()), float(costs.max())
    from flowerbed.clients.workloads.routing.metrics import hull_auc

    return hull_auc(np.array([costs.mean()]), np.array([accs.mean()]), c_lo, c_hi)


def _oracle_curve(test: RouterData) -> tuple[list, list]:
    score = score_router(test.p_true, test.cost_true, test)
    return score.costs.tolist(), score.accs.tolist()


def _ratio(runs: list[dict], name: str, lo: str, hi: str, prefix: str = "") -> np.ndarray:
    """Per-seed (AUC - reference lo) / (reference hi - lo), references from the oracle entry."""
    auc = np.array([r["routers"][name][f"{prefix}auc"] for r in runs])
    ref = {"single": ("single", "auc"), "oracle": ("oracle", "auc")}
    ref |= {"weak": ("oracle", "weak"), "strong": ("oracle", "strong")}

    def value(key: str) -> np.ndarray:
        router, field = ref[key]
        return np.array([r["routers"][router][f"{prefix}{field}"] for r in runs])

    return (auc - value(lo)) / (value(hi) - value(lo))


def _cell(values: np.ndarray, digits: int = 3) -> str:
    return f"{values.mean():.{digits}f} ± {values.std():.{digits}f}"


def table(results: list[dict]) -> str:
    """Markdown tables, mean ± std over seeds of client-averaged values, per setting."""
    settings = sorted({(r.get("setting", ""), r["alpha"], r["coverage"]) for r in results})

    def runs_of(key: tuple) -> list[dict]:
        return [r for r in results if (r.get("setting", ""), r["alpha"], r["coverage"]) == key]

    def row_head(key: tuple) -> str:
        setting, alpha, coverage = key
        return f"| {setting + ' ' if setting else ''}{alpha} | {coverage} | "

    shown = [*LEARNED, "oracle", "single", "random"]
    head = "| alpha | coverage | " + " | ".join(shown) + " |"
    rule = "|---" * (len(shown) + 2) + "|"
    auc_lines, norm_lines, apgr_lines = [head, rule], [head, rule], [head, rule]
    for key in settings:
        runs = runs_of(key)
        auc = [_cell(np.array([r["routers"][n]["auc"] for r in runs]), 4) for n in shown]
        norm = [_cell(_ratio(runs, n, "single", "oracle")) for n in shown]
        apgr = [_cell(_ratio(runs, n, "weak", "strong")) for n in shown]
        auc_lines.append(row_head(key) + " | ".join(auc) + " |")
        norm_lines.append(row_head(key) + " | ".join(norm) + " |")
        apgr_lines.append(row_head(key) + " | ".join(apgr) + " |")
    gaps = ["| alpha | coverage | router | fed vs central (% AUC) | fed - local (AUC) |"]
    gaps.append("|---|---|---|---|---|")
    for key in settings:
        runs = runs_of(key)
        for kind in ("mlp", "kmeans"):
            fed = np.array([r["routers"][f"fed-{kind}"]["auc"] for r in runs])
            cen = np.array([r["routers"][f"central-{kind}"]["auc"] for r in runs])
            loc = np.array([r["routers"][f"local-{kind}"]["auc"] for r in runs])
            rel = 100 * (fed - cen) / cen
            gaps.append(
                row_head(key) + f"{kind} | {rel.mean():+.2f} ± {rel.std():.2f} | "
                f"{(fed - loc).mean():+.4f} ± {(fed - loc).std():.4f} |"
            )
    pers = [
        "| alpha | coverage | router | global (fed) | local | personalised | pers - max(global, local) |"
    ]
    pers.append("|---|---|---|---|---|---|---|")
    for key in settings:
        runs = runs_of(key)
        for kind in ("mlp", "kmeans"):
            vals = {
                w: _ratio(runs, f"{w}-{kind}", "single", "oracle", "far_")
                for w in ("fed", "local", "pers")
            }
            margin = vals["pers"] - np.maximum(vals["fed"], vals["local"])
            pers.append(
                row_head(key) + f"{kind} | {_cell(vals['fed'])} | {_cell(vals['local'])} | "
                f"{_cell(vals['pers'])} | {margin.mean():+.3f} ± {margin.std():.3f} |"
            )
    sub = ["| alpha | coverage | " + " | ".join(LEARNED) + " |", "|---" * (len(LEARNED) + 2) + "|"]
    fed_central = ["fed-mlp", "central-mlp", "fed-kmeans", "central-kmeans"]
    glob = ["| alpha | coverage | " + " | ".join(fed_central) + " |"]
    glob.append("|---" * (len(fed_central) + 2) + "|")
    for key in settings:
        runs = runs_of(key)

        def mean(name: str, field: str, runs: list = runs) -> float:
            return float(np.mean([r["routers"][name][field] for r in runs]))

        sub.append(row_head(key) + " | ".join(f"{mean(n, 'subopt'):.4f}" for n in LEARNED) + " |")
        glob.append(
            row_head(key)
            + " | ".join(
                f"{mean(n, 'global_auc'):.4f} ({mean(n, 'global_norm'):.2f} / "
                f"{mean(n, 'global_apgr'):.2f})"
                for n in fed_central
            )
            + " |"
        )
    return "\n".join(
        ["AUC (client-averaged):", "", *auc_lines, "", "Normalised AUC (per seed):", ""]
        + [*norm_lines, "", "APGR (per seed):", "", *apgr_lines, "", *gaps, ""]
        + [f"Personalisation, normalised AUC on the {FARTHEST:.0%} of clients farthest from the"]
        + ["rest (topic mixture, total variation):", "", *pers, ""]
        + ["Routing suboptimality (client-averaged, mean over seeds):", "", *sub, ""]
        + ["Global test set, AUC (normalised / APGR), mean over seeds:", "", *glob]
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


#: hand-made mutants (file, original text, replacement) and the claim tests that must kill them
MUTANTS: dict[str, tuple[str, str, str]] = {
    "constant router (MLP)": (
        "clients/workloads/routing/mlp.py",
        "    return torch.sigmoid(logits).numpy().astype(np.float64), np.exp(",
        "    return np.full(logits.shape, 0.5), np.exp(",
    ),
    "constant router (K-means)": (
        "clients/workloads/routing/kmeans.py",
        "    w = soft_assign(emb, centroids, temperature)\n    return w @ acc, w @ cost",
        "    w = soft_assign(emb, centroids, temperature)\n"
        "    return np.full((len(w), acc.shape[1]), 0.5), w @ cost",
    ),
    "cluster-blind K-means (one cluster for every query)": (
        "clients/workloads/routing/kmeans.py",
        "    return d2.argmin(1)",
        "    return np.zeros(len(x), dtype=int)",
    ),
    "cluster-blind K-means (tables = model means)": (
        "strategies/fed_kmeans.py",
        "    acc, cost = kmeans_tables(stats, np.asarray(centroids, dtype=np.float64), cfg)",
        "    acc, cost = kmeans_tables(stats, np.asarray(centroids, dtype=np.float64), cfg)\n"
        "    acc, cost = (np.broadcast_to(t.mean(0), t.shape).copy() for t in (acc, cost))",
    ),
    "server skips MLP aggregation (keeps the initial model)": (
        "strategies/fed_mlp.py",
        "        return as_record(merged), scalar_metrics(valid)",
        "        return as_record(self._global), scalar_metrics(valid)",
    ),
    "server skips K-means statistics (tables never filled)": (
        "strategies/fed_kmeans.py",
        '            merged = aggregate_lloyd(self._current["centroids"], states, self.tables)',
        "            merged = dict(self._current)",
    ),
}
CLAIM_TESTS = ["tests/clients/test_routing.py", "tests/strategies/test_routing.py"]


def run_mutants(
    mutants: dict[str, tuple[str, str, str]], names: list[str], tests: list[str]
) -> dict[str, str]:
    """Apply each mutant in place, run the claim tests, restore the file; killed or survived.

    The checkout's own files are mutated (the editable install imports them): run nothing else
    from this checkout meanwhile. SIGTERM restores the file before exiting."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that `finally` restores
    results = {}
    for name in names:
        rel, old, new = mutants[name]
        path = ROOT / rel
        original = path.read_text()
        if original.count(old) != 1:
            raise SystemExit(f"mutant '{name}': the original text is not found once in {rel}")
        try:
            path.write_text(original.replace(old, new))
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                cwd=ROOT, capture_output=True, text=True, check=False,
            )  # fmt: skip
        finally:
            path.write_text(original)
        failed = [ln.split(" ")[1] for ln in proc.stdout.splitlines() if ln.startswith("FAILED")]
        results[name] = f"killed by {', '.join(failed)}" if proc.returncode else "SURVIVED"
        print(f"{name}: {results[name]}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--coverages", type=float, nargs="+", default=[0.3, 0.7])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--table", default=None, help="an evaluation table (CSV/parquet/pickle)")
    parser.add_argument("--partition-by", default=None, help="clients = groups of this column")
    parser.add_argument(
        "--config", type=Path, default=None, help="take clients + data keys from this YAML"
    )
    parser.add_argument("--set", nargs="*", default=[], help="dotlist overrides of both presets")
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    parser.add_argument("--plot", type=Path, default=None, help="curves of the first setting")
    parser.add_argument("--mlp-rounds", type=int, default=None, help="override the MLP preset")
    parser.add_argument(
        "--mlp-set", nargs="*", default=[], help="dotlist overrides of the MLP preset"
    )
    parser.add_argument("--from-json", type=Path, nargs="*", default=None, help="re-print")
    parser.add_argument("--mutants", nargs="*", default=None, help="run mutants (none: all)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.alphas, args.coverages, args.jobs = [0], [1.0], [0.7], 1
        args.set = [
            *args.set,
            "rounds=1",
            "clients.num=3",
            "workload.params.n_train=30",
            "workload.params.n_test=20",
            "workload.params.n_global_test=50",
        ]
    if args.mutants is not None:
        run_mutants(MUTANTS, args.mutants or list(MUTANTS), CLAIM_TESTS)
        return
    if args.from_json:
        results = [r for path in args.from_json for r in json.loads(path.read_text())]
        print(table(results))
        if args.plot:
            plot(results[0], args.plot)
        return
    extra = list(args.set)
    if args.table:
        extra.append(f"workload.params.table_path={args.table}")
    if args.partition_by:
        extra.append(f"clients.partition_by={args.partition_by}")
    mlp_extra = [] if args.mlp_rounds is None else [f"rounds={args.mlp_rounds}"]
    mlp_extra += args.mlp_set
    base = data_overrides(args.config)
    partitioned = args.partition_by or base.get("clients", {}).get("partition_by")
    alphas = [0.0] if partitioned else args.alphas
    settings = [
        (s, a, c, mlp_extra, extra, base)
        for a in alphas
        for c in args.coverages
        for s in args.seeds
    ]
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
            if args.json:
                args.json.write_text(json.dumps(results))
    print(table(results))
    print(f"\n{len(settings)} settings in {time.perf_counter() - started:.0f} s")
    if args.plot:
        plot(results[0], args.plot)


if __name__ == "__main__":
    main()
