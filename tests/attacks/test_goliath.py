"""Goliath: oracle-latent B = 1 recovery, Goliath vs Inverting Gradients, observer isolation."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

import flowerbed.attacks.goliath as goliath
from flowerbed.apps.attack_eval import experiment, make_case, random_reconstruction
from flowerbed.attacks.baseline_common import IG, ORACLE
from flowerbed.attacks.goliath import GOLIATH, aggregate_rounds, invert
from flowerbed.attacks.inversion.types import InversionSettings, Reconstruction
from flowerbed.attacks.metrics import tableak_accuracy
from flowerbed.clients.tabdiff.model import Rows

torch.set_num_threads(1)
SMALL = ["workload.params.hidden=64", "workload.params.layers=2"]


def _acc(case, rec) -> float:
    prep = case.know.replay.prep
    from flowerbed.clients.core.config import DatasetConfig
    from flowerbed.clients.datasets import load_table

    table = load_table(DatasetConfig(name="adult"))
    stds = {c: float(table.train[c].std()) for c in prep.numeric}
    return tableak_accuracy(
        case.truth_frame, rec.decoded, list(prep.numeric), list(prep.categorical), stds
    )["accuracy"]


def test_oracle_latents_b1_recovers_cells() -> None:
    """With the true latents and B = 1, Goliath (analytic first-layer init + row steps on the
    true latents) recovers > 95 % of cells in both regimes; the same optimiser with wrong
    (random, fixed) latents and no analytic init does not. The row steps alone (no analytic init,
    100 steps from prior draws) do the work too: 0.978 (mixed) / 0.955 (Gaussian) on seeds 0-2,
    vs 0.600 for the random-baseline draw from the public marginals; an objective without the
    gradient match leaves the rows at their prior draws."""
    from flowerbed.clients.core.config import DatasetConfig
    from flowerbed.clients.datasets import load_table

    marginals = None
    accs, wrong, cold, prior = [], [], [], []
    for regime in ("mixed", "gaussian"):
        cfg = experiment("adult", regime, "fedsgd", SMALL)
        for i in range(3):
            case = make_case(cfg, 1, seed=i)[0]
            oracle = replace(ORACLE, iterations=20, seed=i).on_diffusion(cycles=1)
            accs.append(_acc(case, invert(case.know, oracle, oracle=case.truth_latents)))
            fixed = oracle.on_diffusion(latents="fixed", analytic_init=False, label_recovery=False)
            wrong.append(_acc(case, invert(case.know, fixed)))
            steps = replace(oracle, iterations=100).on_diffusion(analytic_init=False)
            cold.append(_acc(case, invert(case.know, steps, oracle=case.truth_latents)))
            if marginals is None:
                table = load_table(DatasetConfig(name="adult"))
                marginals = case.know.replay.prep.encode(table.train)
            prior.append(_acc(case, random_reconstruction(case.know.replay, 1, marginals, i)))
    assert np.mean(accs) > 0.95
    assert np.mean(wrong) < np.mean(accs) - 0.1
    assert np.mean(cold) > 0.9, cold
    assert np.mean(cold) > np.mean(prior) + 0.25, (cold, prior)


def test_goliath_beats_inverting_gradients_small_case() -> None:
    cfg = experiment("adult", "mixed", "fedsgd", SMALL)
    g, ig = [], []
    for i in range(2):
        case = make_case(cfg, 4, seed=10 + i)[0]
        g.append(_acc(case, invert(case.know, replace(GOLIATH, restarts=1, iterations=40))))
        ig.append(_acc(case, invert(case.know, replace(IG, iterations=150, seed=i))))
    assert np.mean(g) > np.mean(ig) + 0.2
    assert np.mean(g) > 0.95


def test_closed_form_needs_the_onehot_structure() -> None:
    """Ablation: without analytic initialisation, the same budget recovers far less."""
    cfg = experiment("adult", "mixed", "fedsgd", SMALL)
    case = make_case(cfg, 4, seed=21)[0]
    budget = replace(GOLIATH, restarts=1, iterations=40)
    full = _acc(case, invert(case.know, budget))
    ablated = _acc(
        case, invert(case.know, budget.on_diffusion(analytic_init=False, label_recovery=False))
    )
    assert full > ablated + 0.2


def test_timesteps_are_read_from_the_time_embedding_gradient() -> None:
    """The first time layer's gradient spans {sinusoid(t_i)}: the rows' t come back to ~1e-4,
    which a random subspace of the same rank would not give."""
    cfg = experiment("adult", "gaussian", "fedsgd", SMALL)
    case = make_case(cfg, 8, seed=8000)[0]
    truth = case.truth_latents[0].t.double().sort().values
    g = case.know.update["time_embed.0.weight"]
    found = goliath.timesteps_from_embedding(g, 8, 64).sort().values
    assert float((found - truth).abs().max()) < 1e-3
    noise = torch.randn(g.shape, generator=torch.Generator().manual_seed(0))
    ablated = goliath.timesteps_from_embedding(noise, 8, 64).sort().values
    assert float((ablated - truth).abs().max()) > 0.05


def test_gaussian_regime_b8_is_inverted_in_closed_form() -> None:
    """Gaussian regime, B = 8, FedSGD: the time-embedding route recovers the rows where the same
    engine without the closed form (and Inverting Gradients) stays near chance."""
    cfg = experiment("adult", "gaussian", "fedsgd", SMALL)
    full, ablated, ig = [], [], []
    for seed in (8000, 8002):
        case = make_case(cfg, 8, seed=seed)[0]
        budget = replace(GOLIATH, restarts=1, iterations=20, seed=seed).on_diffusion(cycles=1)
        rec = invert(case.know, budget)
        full.append(_acc(case, rec))
        assert rec.seconds < 30
        off = budget.on_diffusion(analytic_init=False, label_recovery=False)
        ablated.append(_acc(case, invert(case.know, off)))
        ig.append(_acc(case, invert(case.know, replace(IG, iterations=40))))
    assert np.mean(full) > 0.95
    assert np.mean(full) > max(np.mean(ablated), np.mean(ig)) + 0.3


def test_mixed_regime_b16_time_route_beats_signature_search() -> None:
    """Mixed regime, B = 16: the one-hot signature search runs out of nodes; reading t from the
    time embedding separates the rows regardless of how many share category values."""
    cfg = experiment("adult", "mixed", "fedsgd", SMALL)
    timed, searched = [], []
    for seed in (16001, 16002):
        case = make_case(cfg, 16, seed=seed)[0]

        def accuracy(closed, case=case) -> float:
            if closed is None:
                return 0.0
            rows = closed[0]
            frame = case.know.replay.decode(rows.num, rows.cat)
            return _acc(case, Reconstruction(rows, 0.0, decoded=frame))

        timed.append(accuracy(goliath.analytic_time(case.know)))
        searched.append(accuracy(goliath.analytic_mixed(case.know)))
    assert np.mean(timed) > 0.95
    assert np.mean(searched) < np.mean(timed) - 0.2


def test_fedavg_local_sgd_visits_are_inverted_and_grouped() -> None:
    """FedAvg, 2 local epochs of SGD: the update is a FedSGD update of 2 x B row visits; they are
    inverted in closed form and grouped back into the B rows. Without it the engine must
    differentiate through the local steps and, at this budget, stays far below."""
    cfg = experiment("adult", "mixed", "fedavg", [*SMALL, "workload.params.optimizer=sgd"])
    case = make_case(cfg, 4, seed=4001)[0]
    assert case.know.replay.protocol.local_epochs == 2
    budget = replace(GOLIATH, restarts=1, iterations=20).on_diffusion(cycles=1)
    full = _acc(case, invert(case.know, budget))
    off = budget.on_diffusion(analytic_init=False, label_recovery=False)
    assert full > 0.95
    assert full > _acc(case, invert(case.know, off)) + 0.2


def test_fedavg_adam_update_read_as_signs_mixed_regime() -> None:
    """FedAvg with 2 local Adam steps, mixed regime, one row, 3 seeds: read as a sign-compressed
    gradient, the update gives every categorical cell (the zero pattern of the one-hot input
    columns is the support); differentiating through the unrolled Adam steps (the ablation) stays
    near the random guess."""
    cfg = experiment("adult", "mixed", "fedavg", [*SMALL, "workload.params.optimizer=adam"])
    signs, unrolled = [], []
    for i in range(3):
        case = make_case(cfg, 1, seed=40 + i)[0]
        goliath = replace(GOLIATH, restarts=1, iterations=30, seed=i).on_diffusion(cycles=2)
        rec = invert(case.know, goliath)
        prep = case.know.replay.prep
        table = tableak_accuracy(case.truth_frame, rec.decoded, list(prep.numeric),
                                 list(prep.categorical), {c: 1.0 for c in prep.numeric})  # fmt: skip
        assert table["cat_accuracy"] == 1.0
        signs.append(_acc(case, rec))
        ablation = goliath.on_diffusion(adam_as_signs=False)
        unrolled.append(_acc(case, invert(case.know, ablation)))
    assert min(signs) > 0.65
    assert np.mean(signs) > np.mean(unrolled) + 0.2


def test_multi_round_vote_fixes_disagreeing_cells() -> None:
    """Aligning reconstructions of the same rows and voting beats each single reconstruction."""
    cfg = experiment("adult", "mixed", "fedsgd", SMALL)
    case = make_case(cfg, 4, seed=3)[0]
    rng = np.random.default_rng(0)
    replay = case.know.replay
    truth_num = torch.tensor(replay.prep.encode(case.truth_frame)[0], dtype=torch.float32)
    codes = replay.prep.encode(case.truth_frame)[1]
    recs = []
    for r in range(7):  # noisy copies: ~25 % of categorical cells wrong, rows shuffled
        noisy = codes.copy()
        flip = rng.random(noisy.shape) < 0.25
        sizes = np.array(replay.spec.cat_sizes)
        noisy[flip] = (noisy[flip] + 1 + rng.integers(0, 1, flip.sum())) % np.broadcast_to(
            sizes, noisy.shape
        )[flip]
        perm = rng.permutation(4)
        cat = torch.cat(
            [
                torch.nn.functional.one_hot(torch.from_numpy(noisy[perm, j]), k).float()
                for j, k in enumerate(sizes)
            ],
            1,
        )
        rows = Rows(truth_num[perm] + 0.01 * r, cat)
        recs.append(Reconstruction(rows, float(r), decoded=replay.decode(rows.num, rows.cat)))
    single = np.mean([_acc(case, r) for r in recs])
    voted = _acc(case, aggregate_rounds(replay, recs))
    assert voted > single + 0.05


def _names(module) -> set[str]:
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    return (
        {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        | {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    )


def test_attack_code_never_touches_client_data() -> None:
    import flowerbed.attacks.observer as observer

    forbidden = {
        "load_partition",
        "client_row_ids",
        "round_plan",
        "truth",
        "Truth",
        "truth_latents",
    }
    attack_modules = [
        importlib.import_module(f"flowerbed.attacks.goliath.{m.name}")
        for m in pkgutil.iter_modules(goliath.__path__)
        if m.name != "scoring"  # the scorer is where ground truth belongs
    ]
    baselines = [
        importlib.import_module(f"flowerbed.attacks.{name}")
        for name in ("common", "baseline_common", "dlg", "idlg", "inverting_gradients", "tableak",
                     "random_baseline", "analytic_fc")
    ]  # fmt: skip
    for module in (goliath, *baselines, *attack_modules):
        assert not (_names(module) & forbidden), module.__name__
    # the observer touches ground truth only through the scorer, after the attack returned
    assert not (_names(observer) & (forbidden - {"truth"}))
    params = set(inspect.signature(invert).parameters)  # the update and batch are in ``know``
    assert params == {"know", "cfg", "oracle", "start"}
    # ``start``: another attack's reconstruction of the same update (the aware one's warm start)
    assert "Reconstruction" in str(inspect.signature(invert).parameters["start"].annotation)
    assert "Knowledge" in str(inspect.signature(invert).parameters["know"].annotation)
    assert isinstance(goliath.GOLIATH, InversionSettings)


def test_observer_in_a_federated_run(tmp_path, monkeypatch) -> None:
    """Through run_inline: the attack runs on real replies, is scored, and no client data is read
    while the observer handles a round except inside the scorer, on a reconstruction the attack
    already returned: load_partition / round_plan calls are recorded with flags, so truth fetched
    by the observer and handed to the attack (before or during ``invert``) fails, and so does a
    scorer asked about anything but what the attack returned."""
    import flowerbed.clients.workloads.tabdiff as td
    from flowerbed.apps.inline import run_inline
    from flowerbed.attacks.goliath.attack import TabularInversion
    from flowerbed.attacks.goliath.scoring import TruthScorer
    from flowerbed.attacks.observer import AttackObserver
    from flowerbed.server.experiment import load_experiment

    inside = {"observer": False, "invert": False, "score": False}
    seen = {"violations": [], "calls": 0, "returned": [], "scored": 0}
    real_invert, real_plan, real_load = (
        TabularInversion.invert,
        td.round_plan,
        td.TabDiff.load_partition,
    )
    real_aggregate, real_score = AttackObserver.aggregate_train, TruthScorer.score

    def flagged(flag: str, fn):
        def run(*a, **k):
            inside[flag] = True
            try:
                return fn(*a, **k)
            finally:
                inside[flag] = False

        return run

    def spy_invert(*a, **k):
        rec = flagged("invert", real_invert)(*a, **k)
        seen["returned"].append(rec)
        return rec

    def spy_score(self, partition_id, server_round, sent, rec):
        if not any(rec is r for r in seen["returned"]):
            seen["violations"].append("scored something the attack did not return")
        seen["scored"] += 1
        return flagged("score", real_score)(self, partition_id, server_round, sent, rec)

    real_illustrate = TruthScorer.illustrate

    def spy_illustrate(self, server_round, items, run_dir):
        """The scorer's pictures read the truth too: only for what the attack returned."""
        if not all(any(rec is r for r in seen["returned"]) for _, _, rec in items):
            seen["violations"].append("illustrated something the attack did not return")
        return flagged("score", real_illustrate)(self, server_round, items, run_dir)

    def data_read(what: str) -> None:
        seen["calls"] += 1
        if inside["invert"] or (inside["observer"] and not inside["score"]):
            seen["violations"].append(f"{what} outside the scorer while the observer ran")

    def spy_plan(*a, **k):
        data_read("round_plan")
        return real_plan(*a, **k)

    def spy_load(self, *a, **k):
        data_read("load_partition")
        return real_load(self, *a, **k)

    monkeypatch.setattr(TabularInversion, "invert", spy_invert)
    monkeypatch.setattr(TruthScorer, "score", spy_score)
    monkeypatch.setattr(TruthScorer, "illustrate", spy_illustrate)
    monkeypatch.setattr(AttackObserver, "aggregate_train", flagged("observer", real_aggregate))
    monkeypatch.setattr(td, "round_plan", spy_plan)
    monkeypatch.setattr(td.TabDiff, "load_partition", spy_load)
    cfg = load_experiment(
        "tabdiff-german-mixed",
        ["engine=inline", "rounds=2", "clients.num=3", f"output.dir={tmp_path}", "output.plots=false",
         "workload.params.protocol=fedsgd", "workload.params.batch_size=2", "workload.params.lr=0.01",
         "workload.params.hidden=32", "workload.params.layers=1", "workload.params.quality_rows=0",
         "attack.name=goliath", "attack.params.restarts=1", "attack.params.iterations=20"],
    )  # fmt: skip
    summary = run_inline(cfg)
    assert not seen["violations"], seen["violations"][:3]
    assert seen["calls"] > 0 and seen["scored"] == len(seen["returned"]) > 0
    assert "attack.cell_accuracy" in summary["metrics"]
    assert summary["metrics"]["attack.cell_accuracy"] > 0.9


def test_goliath_per_round_metrics_of_a_federated_preset(tmp_path, monkeypatch) -> None:
    """goliath-adult-mixed (FedSGD, B = 8) attacked at rounds 1, 5 and 10 only: each attacked
    round has its line in metrics.jsonl and its attack.r<round>.success in the summary, and every
    one stays >= 0.889 (the paper's B = 8 mixed-regime figure) on the model trained so far -- the
    arrays attacked at rounds 5 and 10 have moved away from round 1's (a server that skipped
    aggregation would keep sending the initial model)."""
    import json

    from flowerbed.apps.inline import run_inline
    from flowerbed.attacks.goliath.attack import TabularInversion
    from flowerbed.server.experiment import load_experiment

    models: list[torch.Tensor] = []
    real_invert = TabularInversion.invert

    def spy_invert(self, sent, reply, num_examples):
        models.append(torch.cat([v.detach().double().flatten() for v in sent.values()]))
        return real_invert(self, sent, reply, num_examples)

    monkeypatch.setattr(TabularInversion, "invert", spy_invert)
    cfg = load_experiment("goliath-adult-mixed", [
        "engine=inline", "rounds=10", "clients.num=3", f"output.dir={tmp_path}",
        "output.plots=false", "attack.params.target_clients=[0]", "attack.params.rounds=[1,5,10]"])  # fmt: skip
    summary = run_inline(cfg)
    lines = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    attacked = {x["round"]: x for x in lines if x["scope"] == "attack"}
    assert sorted(attacked) == [1, 5, 10]
    for rnd in (1, 5, 10):
        assert attacked[rnd]["success"] >= 0.889
        assert summary["metrics"][f"attack.r{rnd}.success"] >= 0.889
    assert not any(f"attack.r{r}.success" in summary["metrics"] for r in (2, 3, 4, 6, 7, 8, 9))
    assert len(models) == 3
    moved = [float((a - models[0]).norm() / models[0].norm()) for a in models[1:]]
    # relative change of the sent arrays vs round 1: 2.6e-4 (r5) / 6.0e-4 (r10) on seeds 0-2
    assert min(moved) > 1e-4, moved


def test_fedavg_local_sgd_rows_kept_past_exactness_and_visits_grouped_one_per_epoch() -> None:
    """FedAvg, 2 epochs of SGD, 12 rows = 24 visits at width 48 (its h/2): seeds 0, 4 and 8 are
    the first three of 0-29 whose local-SGD closed form is *not* exact by its own gradient match
    (the attacker's test, asserted). Its rows are still most of the cells: kept, they beat the
    cyclic loop that used to take over (``keep_local_sgd=False``) by > 0.15; and grouping the
    visits one per epoch (perfect matching) beats agglomerative clustering on the same visits."""
    from flowerbed.attacks.goliath import closed_form_local_sgd
    from flowerbed.attacks.goliath.knowledge import LOCAL_SGD_ACCEPT

    cfg = experiment("adult", "mixed", "fedavg", ["workload.params.optimizer=sgd",
                                                  "workload.params.hidden=48",
                                                  "workload.params.layers=2"])  # fmt: skip
    kept, loop, matched, clustered = [], [], [], []
    for seed in (0, 4, 8):
        case = make_case(cfg, 12, seed=seed)[0]
        assert case.know.replay.protocol.local_epochs == 2
        budget = replace(GOLIATH, restarts=1, iterations=10, seed=seed).on_diffusion(cycles=1)
        kept.append(_acc(case, invert(case.know, budget)))
        loop.append(_acc(case, invert(case.know, budget.on_diffusion(keep_local_sgd=False))))
        clustered_form = closed_form_local_sgd(case.know, balanced=False)  # score: pre-grouping
        assert clustered_form is not None and clustered_form.score > LOCAL_SGD_ACCEPT
        rows = clustered_form.rows
        matched.append(kept[-1])
        decoded = case.know.replay.decode(rows.num, rows.cat)
        clustered.append(_acc(case, Reconstruction(rows, 0.0, decoded=decoded)))
    assert min(kept) > 0.7
    assert np.mean(kept) > np.mean(loop) + 0.15
    assert np.mean(matched) > np.mean(clustered) + 0.03
