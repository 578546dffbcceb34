"""ACC++ on the tiny multilingual IOI model: circuit sizes, signal dimensionality, causality,
cross-language head vs signal Jaccard, language distance matrices, ACC++ vs activation patching.

    PYTHONPATH=$PWD python -m benchmarks.acc_pp [--seed 0] [--prompts 32]
    PYTHONPATH=$PWD python -m benchmarks.acc_pp --federated   # the acc-pp preset, inline engine
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import torch

from flowerbed.clients.workloads.acc_pp import (
    LANGUAGES,
    SEQ_LEN,
    Prompts,
    accuracy,
    activation_patching,
    edge_signals,
    language_report,
    logit_diff,
    make_prompts,
    random_signals,
    signal_edit,
    trace_prompt,
    trained_model,
)


def causality(model, n: int) -> dict[str, float]:  # noqa: ANN001
    """Mean (END, IO) weight drop for selected vs as many random signals; logit diff before/after."""
    end, drops, rand, before, after = SEQ_LEN - 1, [], [], [], []
    for lang in range(LANGUAGES):
        p = make_prompts(lang, n, 500 + lang)
        for b in range(n):
            io = int(p.io_pos[b])
            circuit = trace_prompt(model, p, b)
            roots = [(ly, h) for ly, h, d, s in circuit.traced if (ly, d, s) == (1, end, io)]
            if not roots:
                continue
            layer, head = roots[0]
            cache: dict = {}
            with torch.no_grad():
                model(p.tokens[b : b + 1], cache=cache)
            signals = edge_signals(circuit, layer, head)
            w0 = float(cache[f"pattern{layer}"][0, head, end, io])
            one = Prompts(*(getattr(p, f)[b : b + 1] for f in Prompts.__annotations__))
            for chosen, out in ((signals, drops), (random_signals(model, layer, signals, b), rand)):
                edited: dict = {}
                with torch.no_grad():
                    model(
                        p.tokens[b : b + 1],
                        signal_edit(model, cache, layer, head, end, io, chosen),
                        edited,
                    )
                out.append(1 - float(edited[f"pattern{layer}"][0, head, end, io]) / w0)
            before.append(float(logit_diff(model, one)))
            after.append(
                float(
                    logit_diff(model, one, signal_edit(model, cache, layer, head, end, io, signals))
                )
            )
    return {
        "edges": len(drops), "drop_selected": float(np.mean(drops)), "drop_random": float(np.mean(rand)),
        "logit_diff_before": float(np.mean(before)), "logit_diff_after": float(np.mean(after)),
    }  # fmt: skip


def timing(model, n: int) -> tuple[float, float]:  # noqa: ANN001
    p, corrupt = make_prompts(0, n, 5), make_prompts(0, n, 6)
    t0 = time.perf_counter()
    circuits = [trace_prompt(model, p, b) for b in range(n)]
    acc_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for b, c in enumerate(circuits):
        activation_patching(model, p, corrupt, c.traced, b)
    return acc_s, time.perf_counter() - t0


def federated(seed: int) -> None:
    """Run the ``acc-pp`` preset in-process and print the server-side client distance matrices."""
    import tempfile

    from flowerbed.apps.inline import run_inline
    from flowerbed.clients.workloads.acc_pp import circuit_distances, client_circuits
    from flowerbed.server.experiment import load_experiment

    with tempfile.TemporaryDirectory() as out:
        cfg = load_experiment(
            "acc-pp", ["engine=inline", f"seed={seed}", f"output.dir={out}", "output.plots=false"]
        )
        summary = run_inline(cfg)
    m = summary["metrics"]
    print(f"federated acc-pp, seed {seed}, {summary['rounds']} rounds, {summary['wall_s']} s")
    for key in ("eval.accuracy", "eval.logit_diff", "eval.acc_nodes", "eval.acc_edges",
                "eval.acc_signal_dim"):  # fmt: skip
        print(f"  {key} {m[key]:.3f}")
    clients = client_circuits(m, summary["clients"])
    for what in ("heads", "signals"):
        print(f"{what} distance between clients (1 - weighted Jaccard):")
        for row in circuit_distances(clients, what):
            print("  " + " ".join(f"{v:.3f}" for v in row))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--federated", action="store_true")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds: checks the script runs (CI); the numbers mean nothing",
    )
    args = parser.parse_args()
    if args.quick:
        args.prompts = 4
    torch.set_num_threads(1)
    if args.federated:
        federated(args.seed)
        return
    t0 = time.perf_counter()
    model = trained_model(args.seed, steps=10 if args.quick else 400)
    print(f"seed {args.seed}: trained in {time.perf_counter() - t0:.1f} s")
    accs = [accuracy(model, make_prompts(lang, 500, 900 + lang)) for lang in range(LANGUAGES)]
    print("accuracy per language:", " ".join(f"L{i + 1} {a:.3f}" for i, a in enumerate(accs)))
    report = language_report(model, args.prompts, args.seed)
    print("| language | nodes | edges | signal dim (k's per edge) |\n|---|---|---|---|")
    for i, s in enumerate(report["summaries"]):
        print(f"| L{i + 1} | {s['nodes']:.2f} | {s['edges']:.2f} | {s['signal_dim']:.2f} |")
    pairs = list(itertools.combinations(range(LANGUAGES), 2))
    hj = [1 - report["head_distance"][i, j] for i, j in pairs]
    sj = [1 - report["signal_distance"][i, j] for i, j in pairs]
    print(f"mean cross-language Jaccard: heads {np.mean(hj):.3f}, signals {np.mean(sj):.3f}")
    for name in ("head_distance", "signal_distance"):
        print(f"{name} (1 - weighted Jaccard), rows/cols L1..L4:")
        for row in report[name]:
            print("  " + " ".join(f"{v:.3f}" for v in row))
    c = causality(model, args.prompts)
    print(
        f"causality over {c['edges']} (END, IO) last-layer edges: weight drop selected "
        f"{c['drop_selected']:.3f}, random {c['drop_random']:.3f}; logit diff "
        f"{c['logit_diff_before']:.2f} -> {c['logit_diff_after']:.2f}"
    )
    acc_s, patch_s = timing(model, 16)
    print(f"wall time, 16 prompts: ACC++ {acc_s:.3f} s, patching {patch_s:.3f} s, "
          f"ratio {patch_s / acc_s:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
