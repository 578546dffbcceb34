"""Benchmark: where Goliath's FedAvg-SGD closed form stands, stage by stage (issue 50).

Adult, mixed regime, FedAvg with local SGD (the tabdiff preset's lr 0.002, one minibatch of all
rows per epoch), attack_eval's batches (``seed = 1000 B + i``). Per batch: (1) how far the
observed ``delta / lr`` is from the float64 sum of the local steps' gradients at the global
model (the premise that every step can be read there); (2) the share of the E x B visits'
timesteps the time route finds (within 1e-3); (3) the closed form's own gradient-match score
against the acceptance it used to need (``LOCAL_SGD_ACCEPT``); (4) cell accuracy of the visits,
of the rows grouped one visit per epoch (perfect matching) and by agglomerative clustering,
and of Goliath's answer with and without ``keep_local_sgd`` (the cyclic loop then takes over).

    python -m benchmarks.goliath_visits                 # 32 rows x 2 epochs, width 256, 3 batches
    python -m benchmarks.goliath_visits --quick         # 12 rows x 2 epochs, width 48, 1 batch
    python -m benchmarks.goliath_visits --adam-support --rows 8 --batches 6

``--adam-support`` (FedAvg with Adam instead): what survives Adam exactly -- the category
support (an input column zero for every row keeps its weights unchanged through every Adam
step) -- measured as the categorical accuracy of 10 prior draws per batch against the same
draws with each column's categories drawn from the public frequencies restricted to the support
(no attack integrates it yet).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pandas as pd
import torch


def main() -> None:
    import flowerbed.apps.attack_eval as ae
    from flowerbed.attacks.goliath import GOLIATH, closed_form_local_sgd, invert
    from flowerbed.attacks.goliath.closed_forms import timesteps_from_embedding
    from flowerbed.attacks.goliath.knowledge import LOCAL_SGD_ACCEPT
    from flowerbed.attacks.metrics import tableak_accuracy
    from flowerbed.clients.tabdiff.model import Latents, Rows, loss_grad

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--adam-support", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.hidden, args.batches, args.iterations = 12, 48, 1, 5
    torch.set_num_threads(1)
    if args.adam_support:
        adam_support(args.rows, args.epochs, args.hidden, args.batches)
        return
    cfg = ae.experiment("adult", "mixed", "fedavg", [
        "workload.params.optimizer=sgd", f"workload.params.local_epochs={args.epochs}",
        f"workload.params.hidden={args.hidden}"])  # fmt: skip
    for i in range(args.batches):
        case = ae.make_case(cfg, args.rows, seed=1000 * args.rows + i)[0]
        know, data = case.know, ae.encoded(ae.build_workload(cfg).ctx.dataset_json)
        prep, spec, lr = know.replay.prep, know.replay.spec, know.replay.protocol.lr
        stds = {c: float(data.table.train[c].std()) for c in prep.numeric}

        def acc(rows: Rows | pd.DataFrame, case: ae.Case = case, stds: dict = stds) -> float:
            replay = case.know.replay
            dec = rows if isinstance(rows, pd.DataFrame) else replay.decode(rows.num, rows.cat)
            cols = list(replay.prep.numeric), list(replay.prep.categorical)
            return float(tableak_accuracy(case.truth_frame, dec, *cols, stds)["accuracy"])

        idx = np.random.default_rng(1000 * args.rows + i).choice(len(data.num), args.rows,
                                                                 replace=False)  # fmt: skip
        rows = ae.onehot_rows(torch.from_numpy(data.num[idx]), torch.from_numpy(data.codes[idx]),
                              spec.cat_sizes)  # fmt: skip
        p64 = {k: v.double() for k, v in know.params.items()}
        exact: dict[str, torch.Tensor] = {}
        for lat in case.truth_latents:  # every local step's gradient at the global model
            m = None if lat.mask is None else lat.mask.double()
            g = loss_grad(know.replay.model, p64, Rows(rows.num.double(), rows.cat.double()),
                          Latents(lat.t.double(), lat.eps.double(), m))  # fmt: skip
            exact = {k: exact.get(k, 0) + g[k] for k in g}
        seen = {k: v.double() / lr for k, v in know.update.items()}
        name = "time_embed.0.weight"
        lin = float((seen[name] - exact[name]).norm() / exact[name].norm())
        visits = args.epochs * args.rows
        t_true = torch.cat([lat.t for lat in case.truth_latents]).double()
        t_hat = timesteps_from_embedding(seen[name], visits, spec.hidden)
        found = float(((t_true[:, None] - t_hat[None]).abs().min(1).values < 1e-3).double().mean())
        matched = closed_form_local_sgd(know)
        clustered = closed_form_local_sgd(know, balanced=False)
        assert matched is not None and clustered is not None
        budget = replace(GOLIATH, restarts=1, iterations=args.iterations, seed=i)
        kept = acc(invert(know, budget).decoded)
        loop = acc(invert(know, budget.on_diffusion(keep_local_sgd=False)).decoded)
        print(f"batch {i}: linearisation error {lin:.1e}, timesteps found {found:.2f}, "
              f"closed-form score {matched.score:.4f} (accepted below {LOCAL_SGD_ACCEPT}); "
              f"accuracy: one visit per epoch {acc(matched.rows):.3f}, agglomerative "
              f"{acc(clustered.rows):.3f}, goliath {kept:.3f}, without keep_local_sgd {loop:.3f}",
              flush=True)  # fmt: skip


def adam_support(rows: int, epochs: int, hidden: int, batches: int) -> None:
    """Categorical accuracy: prior draws vs the same draws restricted to the category support."""
    import flowerbed.apps.attack_eval as ae
    from flowerbed.attacks.goliath.knowledge import prior_rows, sign_surrogate
    from flowerbed.attacks.goliath.objective import category_support
    from flowerbed.attacks.metrics import tableak_accuracy
    from flowerbed.clients.tabdiff.model import Rows

    cfg = ae.experiment("adult", "mixed", "fedavg", [
        "workload.params.optimizer=adam", f"workload.params.local_epochs={epochs}",
        f"workload.params.hidden={hidden}"])  # fmt: skip
    data = ae.encoded(ae.build_workload(cfg).ctx.dataset_json)
    for i in range(batches):
        case = ae.make_case(cfg, rows, seed=1000 * rows + i)[0]
        replay = case.know.replay
        prep, spec = replay.prep, replay.spec
        stds = {c: float(data.table.train[c].std()) for c in prep.numeric}
        support = category_support(sign_surrogate(case.know))
        assert support is not None
        plain, restricted = [], []
        for d in range(10):
            draw = prior_rows(replay, rows, 100 * i + d).rows
            cat, pos = draw.cat.clone(), 0
            gen = torch.Generator().manual_seed(d)
            for col, k in zip(prep.categorical, spec.cat_sizes, strict=True):
                freq = (prep.frequencies or {}).get(col) or [1.0] * k
                w = torch.tensor(freq, dtype=torch.float64) * support[pos : pos + k].double()
                codes = torch.multinomial(w / w.sum(), rows, replacement=True, generator=gen)
                cat[:, pos : pos + k] = torch.nn.functional.one_hot(codes, k).float()
                pos += k
            for rows_, out in ((draw, plain), (Rows(draw.num, cat), restricted)):
                dec = replay.decode(rows_.num, rows_.cat)
                cols = list(prep.numeric), list(prep.categorical)
                out.append(tableak_accuracy(case.truth_frame, dec, *cols, stds)["cat_accuracy"])
        print(f"batch {i}: support {int(support.sum())} of {sum(spec.cat_sizes)} categories; "
              f"categorical accuracy: prior {np.mean(plain):.3f}, restricted to the support "
              f"{np.mean(restricted):.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
