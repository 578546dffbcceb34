"""Attack evaluation harness: attack x dataset x setting x batch size (x training rounds) over
sampled batches, for tabular diffusion (Goliath and its baselines) or any model-loss workload.

Each case simulates one honest client update with the workload's own training code (the global
model at initialisation, or after ``--trained-rounds R`` rounds of the preset's own federated
training), gives the attack only public knowledge and the update, then scores the reconstruction
against the batch (which only the scorer holds).

    python -m flowerbed.apps.attack_eval --datasets adult german --regimes mixed gaussian \
        --batch-sizes 1 2 4 8 16 32 --batches 20 --out docs/goliath_table.md
    python -m flowerbed.apps.attack_eval --workload digits-classifier --batch-sizes 1 4 8 \
        workload.params.protocol=fedsgd
    python -m flowerbed.apps.attack_eval --datasets csv dataset.path=my.csv dataset.label=y \
        dataset.numeric=[a,b] dataset.categorical=[c]

Overrides (``key=value``) may stand anywhere on the command line. A ``csv`` table is named by its
file in the output. ``--trained-rounds``: the model is trained with the preset's own protocol
(``tabdiff-adult-mixed``, ``quickstart`` or ``digits-classifier``) on the same data and
architecture, cached under ``--model-cache``; the attacked update then follows the overrides.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pandas as pd
import torch
from flwr.app import RecordDict

from flowerbed.apps.attack_eval_tables import table
from flowerbed.attacks import ATTACKS
from flowerbed.attacks.baseline_common import ORACLE
from flowerbed.attacks.common import InversionAttack
from flowerbed.attacks.goliath import invert
from flowerbed.attacks.inversion.attack import ModelLossAttack
from flowerbed.attacks.inversion.scoring import ClassifierScorer
from flowerbed.attacks.inversion.types import (
    DiffusionReplay,
    InversionSettings,
    Knowledge,
    ModelLossReplay,
    Reconstruction,
)
from flowerbed.attacks.metrics import mask_f1, tableak_accuracy, timestep_mae
from flowerbed.clients.contracts import ModelLossOffer, TabularDiffusionOffer, offer
from flowerbed.clients.core.config import ChosenComponent, Experiment, OutputConfig, replace_at
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.tabdiff.model import (
    Latents,
    Rows,
    build_model,
    model_params,
    onehot_rows,
    sample_latents,
)
from flowerbed.clients.tabdiff.training import local_update
from flowerbed.clients.workloads import Examples, build_workload, fit_classifier
from flowerbed.clients.workloads.tabdiff import encoded
from flowerbed.server.experiment import load_experiment
from flowerbed.server.wrappers import truth_source

ATTACK_NAMES = ["goliath", "tableak", "inverting-gradients", "dlg", "idlg", "random", "oracle"]
MODEL_LOSS_ATTACKS = ["analytic-fc", "inverting-gradients", "idlg", "dlg", "random"]
#: the preset whose workload and training protocol each family uses
PRESETS = {"tabdiff": "tabdiff-adult-mixed", "tabular-mlp": "quickstart",
           "digits-classifier": "digits-classifier"}  # fmt: skip
#: workload params that define the local training protocol (restored to the preset's for training)
TRAIN_KEYS = ("protocol", "batch_size", "lr", "optimizer", "local_epochs", "max_steps",
              "momentum", "round_examples")  # fmt: skip


@dataclass
class Case:
    know: Knowledge  # the attacker's: the sent model, the update, the batch size
    truth_frame: pd.DataFrame  # scorer side only
    truth_latents: list[Latents]  # scorer side only (and the oracle upper bound)


# -- configs and trained models ------------------------------------------------------------------
def experiment(
    dataset: str, regime: str, protocol: str, overrides: list[str] | None = None
) -> Experiment:
    return load_experiment(
        "tabdiff-adult-mixed",
        [f"dataset.name={dataset}", f"workload.params.regime={regime}",
         f"workload.params.protocol={protocol}", "engine=inline", *(overrides or [])],
    )  # fmt: skip


def classifier_experiment(
    workload: str, dataset: str, overrides: list[str] | None = None
) -> Experiment:
    data = [f"dataset.name={dataset}"] if workload == "tabular-mlp" else []
    return load_experiment(PRESETS[workload], [*data, "engine=inline", *(overrides or [])])


def dataset_label(cfg: Experiment) -> str:
    """The name of a table in the output: a csv file by its stem, else the dataset's name."""
    if cfg.workload.name == "digits-classifier":
        return "digits"
    ds = cfg.dataset
    return Path(ds.path).stem if ds.name == "csv" and ds.path else ds.name


def trained_params(cfg: Experiment, rounds: int, cache: Path, log: Callable[[str], object] = print,
                   also: tuple[int, ...] = ()) -> dict[str, torch.Tensor] | None:  # fmt: skip
    """The global model after ``rounds`` rounds of the preset's own federated training (same data
    and architecture as ``cfg``; protocol keys from the preset); None for 0 (initialisation).

    One training run of ``max(rounds, *also)`` rounds writes every requested round's model to
    ``cache`` (keyed by the training config), so later calls only load."""
    if rounds <= 0:
        return None
    from flowerbed.apps.inline import run_inline

    preset = load_experiment(PRESETS[str(cfg.workload.name)], ["engine=inline"]).workload.params
    changes = {k: getattr(preset, k) for k in TRAIN_KEYS if hasattr(preset, k)}
    if hasattr(cfg.workload.params, "quality_rows"):
        changes["quality_rows"] = 0
    train = replace_at(cfg, "workload.params", **changes)
    train = replace(train, attack=ChosenComponent(None, {}), defenses=())
    train = replace_at(train, "clients", fraction_evaluate=0.0)
    key = hashlib.sha256(train.run_key().encode()).hexdigest()[:16]  # without its output
    path = cache / f"{key}.r{rounds}.pt"
    if not path.is_file():
        wanted = sorted({rounds, *(r for r in also if r > 0)})
        cache.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            output = OutputConfig(dir=tmp, plots=False, save_rounds=wanted)
            run_dir = Path(run_inline(replace(train, rounds=max(wanted), output=output))["run_dir"])
            for r in wanted:
                (cache / f"{key}.r{r}.pt").write_bytes((run_dir / f"model.r{r}.pt").read_bytes())
        log(f"trained {max(wanted)} rounds in {time.perf_counter() - start:.0f} s -> {cache}")
    return {k: v.float() for k, v in torch.load(path).items()}


# -- tabular diffusion ----------------------------------------------------------------------------
def make_case(cfg: Experiment, batch: int, seed: int, epochs_same_rows: int = 1,
              params: dict[str, torch.Tensor] | None = None) -> list[Case]:  # fmt: skip
    """One client batch and its update(s) (several rounds of fresh latents if asked)."""
    workload = build_workload(cfg)
    work = offer(workload, TabularDiffusionOffer)
    data = encoded(workload.ctx.dataset_json)
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(data.num), batch, replace=False)
    rows = onehot_rows(
        torch.from_numpy(data.num[idx]), torch.from_numpy(data.codes[idx]), work.spec.cat_sizes
    )
    frame = data.prep.decode(data.num[idx].astype(np.float64), data.codes[idx])
    if params is None:
        params = model_params(build_model(work.spec, cfg.seed))
    protocol = replace(work.protocol, batch_size=max(work.protocol.batch_size, batch))
    cases = []
    for r in range(epochs_same_rows):
        gen = torch.Generator().manual_seed(seed * 7919 + r)
        steps = 1 if protocol.kind == "fedsgd" else protocol.local_epochs
        lats = [sample_latents(work.spec, params, batch, gen) for _ in range(steps)]
        new = local_update(work.model, params, [rows] * steps, lats, protocol)
        sent32 = {k: v.float() for k, v in params.items()}
        reply32 = {k: v.detach().float() for k, v in new.items()}
        replay = DiffusionReplay(work.model, protocol, data.prep)
        cases.append(Case(Knowledge.observe(replay, sent32, reply32, batch), frame, lats))
    return cases


def random_reconstruction(
    replay: DiffusionReplay, batch: int, marginals: tuple[np.ndarray, np.ndarray], seed: int
) -> Reconstruction:
    """Empirical-marginal draw in model space (the floor every attack must beat)."""
    rng = np.random.default_rng(seed)
    num_pool, code_pool = marginals
    num = np.stack(
        [num_pool[rng.integers(0, len(num_pool), batch), j] for j in range(num_pool.shape[1])], 1
    )
    codes = np.stack(
        [code_pool[rng.integers(0, len(code_pool), batch), j] for j in range(code_pool.shape[1])], 1
    )
    cat = np.concatenate([np.eye(k)[codes[:, j]] for j, k in enumerate(replay.spec.cat_sizes)], 1)
    rows = Rows(torch.from_numpy(num).float(), torch.from_numpy(cat).float())
    return Reconstruction(rows, 0.0, decoded=replay.decode(rows.num, rows.cat))


def settings_of(name: str) -> InversionSettings:
    """A registered attack's settings (``oracle``: Goliath given the true latents)."""
    if name == "oracle":
        return ORACLE
    attack = ATTACKS.get(name)
    if not issubclass(attack, InversionAttack):
        raise ConfigError(f"attack '{name}' is not a gradient inversion (it has no settings)")
    return attack.settings


def score(case: Case, rec: Reconstruction, stds: dict[str, float]) -> dict[str, float]:
    prep = case.know.replay.prep
    res = tableak_accuracy(
        case.truth_frame, rec.decoded, list(prep.numeric), list(prep.categorical), stds
    )
    out = {"accuracy": res["accuracy"], "num_accuracy": res["num_accuracy"],
           "cat_accuracy": res["cat_accuracy"], "seconds": rec.seconds}  # fmt: skip
    if rec.t is not None:
        out["timestep_mae"] = timestep_mae(case.truth_latents[0].t.numpy(), rec.t, res["perm"])
    if rec.mask is not None and case.truth_latents[0].mask is not None:
        out["mask_f1"] = mask_f1(case.truth_latents[0].mask.numpy(), rec.mask, res["perm"])
    out["success"] = out["accuracy"]
    return out


class Budget(TypedDict, total=False):
    """The command line's overrides of an attack's settings."""

    iterations: int
    restarts: int


def run_attack(
    name: str, case: Case, budget: Budget, seed: int, marginals: tuple[np.ndarray, np.ndarray]
) -> Reconstruction:
    if name == "random":
        return random_reconstruction(case.know.replay, case.know.batch, marginals, seed)
    base = settings_of(name)
    knobs: Budget = {**budget}
    if base.restarts <= 1:  # a single-start attack keeps its one start
        knobs.pop("restarts", None)
    cfg = replace(base, seed=seed, **knobs)
    return invert(case.know, cfg, oracle=case.truth_latents if name == "oracle" else None)


def evaluate(datasets: list[str], regimes: list[str], batch_sizes: list[int], batches: int,
             attacks: list[str], budget: Budget, protocol: str = "fedsgd",
             log: Callable[[str], object] = print, overrides: list[str] | None = None,
             trained_rounds: tuple[int, ...] = (0,), cache: Path | None = None) -> pd.DataFrame:  # fmt: skip
    """Tabular diffusion: Goliath and its baselines."""
    torch.set_num_threads(1)
    rows = []
    for ds in datasets:
        for regime in regimes:
            cfg = experiment(ds, regime, protocol, overrides)
            label = dataset_label(cfg)
            data = encoded(json.dumps(asdict(cfg.dataset), sort_keys=True))
            train = data.table.train
            stds = {c: float(train[c].std()) for c in data.prep.numeric}
            marginals = (data.num, data.codes)
            for rounds in trained_rounds:
                params = trained_params(cfg, rounds, cache or MODEL_CACHE, log, trained_rounds)
                for b in batch_sizes:
                    for i in range(batches):
                        case = make_case(cfg, b, seed=1000 * b + i, params=params)[0]
                        for name in attacks:
                            rec = run_attack(name, case, budget, i, marginals)
                            s = score(case, rec, stds)
                            rows.append({"workload": "tabdiff", "dataset": label,
                                         "protocol": protocol,
                                         "hidden": cfg.workload.params.hidden,
                                         "regime": regime, "rounds": rounds, "B": b, "batch": i,
                                         "attack": name, **s})  # fmt: skip
                            log(f"{label} {regime} R={rounds} B={b} #{i} {name}: "
                                f"acc={s['accuracy']:.3f} ({rec.seconds:.1f}s)")  # fmt: skip
    return pd.DataFrame(rows)


# -- model-loss workloads ---------------------------------------------------------------------
def classifier_case(work: Any, batch: int, seed: int, params: dict[str, torch.Tensor] | None):  # noqa: ANN201
    """(sent, reply, truth examples): one client update on ``batch`` sampled training examples,
    trained by the workload's own code (torch.optim through ``fit_classifier``)."""
    pool = work.train_pool()
    idx = np.random.default_rng(seed).choice(len(pool.y), batch, replace=False)
    truth = Examples(pool.x[idx], pool.y[idx])
    model = work._model()
    model.load_state_dict(
        params if params is not None else work.init_arrays().to_torch_state_dict()
    )
    sent = {k: v.detach().clone().float() for k, v in model.state_dict().items()}
    fit_classifier(work, model, truth, work.training, seed, RecordDict())
    reply = {k: v.detach().float() for k, v in model.state_dict().items()}
    return sent, reply, truth


def evaluate_classifier(workload: str, datasets: list[str], batch_sizes: list[int], batches: int,
                        attacks: list[str], budget: Budget, log: Callable[[str], object] = print,
                        overrides: list[str] | None = None, trained_rounds: tuple[int, ...] = (0,),
                        cache: Path | None = None) -> pd.DataFrame:  # fmt: skip
    """Model-loss workloads: analytic-fc, DLG, iDLG, Inverting Gradients, random prior draws."""
    torch.set_num_threads(1)
    rows = []
    for ds in datasets:
        cfg = classifier_experiment(workload, ds, overrides)
        work = build_workload(cfg)
        replay = ModelLossReplay(offer(work, ModelLossOffer).model_loss())
        scorer = ClassifierScorer(truth_source(cfg, work))
        label, p = dataset_label(cfg), cfg.workload.params
        setting = getattr(p, "model", "mlp")
        for rounds in trained_rounds:
            params = trained_params(cfg, rounds, cache or MODEL_CACHE, log, trained_rounds)
            for b in batch_sizes:
                for i in range(batches):
                    sent, reply, truth = classifier_case(work, b, 1000 * b + i, params)
                    for name in attacks:
                        if name == "analytic-fc" and replay.contract.first_linear is None:
                            continue
                        registered = "random-baseline" if name == "random" else name
                        settings = replace(settings_of(registered), seed=i, **budget)
                        rec = ModelLossAttack(replay, settings, name).invert(sent, reply, b)
                        s = scorer.score_against(truth, rec)
                        rows.append({"workload": workload, "dataset": label,
                                     "protocol": p.protocol, "optimizer": getattr(p, "optimizer", None),
                                     "local_epochs": getattr(p, "local_epochs", None), "regime": setting,
                                     "rounds": rounds, "B": b, "batch": i, "attack": name,
                                     "seconds": rec.seconds, **s})  # fmt: skip
                        log(f"{label} {setting} R={rounds} B={b} #{i} {name}: "
                            f"success={s['success']:.3f} ({rec.seconds:.1f}s)")  # fmt: skip
    return pd.DataFrame(rows)


# -- command line ---------------------------------------------------------------------------------
MODEL_CACHE = Path(".flowerbed") / "attack-eval-models"


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(options, overrides): every ``key=value`` token that is not an option is an override,
    wherever it stands (so ``--attacks a b key=value`` keeps the override)."""
    options: list[str] = []
    overrides: list[str] = []
    for token in argv:
        (overrides if "=" in token and not token.startswith("-") else options).append(token)
    return options, overrides


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="key=value overrides may stand anywhere.")  # fmt: skip
    ap.add_argument("--workload", default="tabdiff", choices=sorted(PRESETS))
    ap.add_argument("--datasets", nargs="+", default=None,
                    help="adult german csv ... (default: adult german; digits for the images)")  # fmt: skip
    ap.add_argument("--regimes", nargs="+", default=["mixed", "gaussian"], help="tabdiff only")
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--attacks", nargs="+", default=None,
                    help=f"tabdiff: {' '.join(ATTACK_NAMES)}; others: {' '.join(MODEL_LOSS_ATTACKS)}")  # fmt: skip
    ap.add_argument("--iterations", type=int, default=400)
    ap.add_argument("--restarts", type=int, default=None,
                    help="default: 4 on tabdiff (Goliath, TabLeak), each attack's own otherwise")  # fmt: skip
    ap.add_argument("--protocol", default="fedsgd", help="tabdiff: fedsgd | fedavg")
    ap.add_argument("--trained-rounds", nargs="+", type=int, default=[0],
                    help="attack the model after R rounds of the preset's training (0 = init)")  # fmt: skip
    ap.add_argument("--model-cache", default=str(MODEL_CACHE))
    ap.add_argument("--out", default="")
    ap.add_argument("--csv", default="")
    ap.add_argument("--report", nargs="+", default=[], help="render saved CSVs instead of running")
    return ap


def run(argv: list[str]) -> int:
    options, overrides = split_overrides(argv)
    ap = parser()
    args = ap.parse_args(options)
    if args.report:
        print(table(pd.concat([pd.read_csv(f) for f in args.report], ignore_index=True)))
        return 0
    allowed = ATTACK_NAMES if args.workload == "tabdiff" else MODEL_LOSS_ATTACKS
    attacks = args.attacks or allowed
    bad = [a for a in attacks if a not in allowed]
    if bad:
        ap.error(f"unknown attack '{bad[0]}' for --workload {args.workload} "
                 f"(allowed: {', '.join(allowed)})")  # fmt: skip
    datasets = args.datasets or (["digits"] if args.workload == "digits-classifier" else ["adult", "german"])  # fmt: skip
    start = time.perf_counter()
    budget: Budget = {"iterations": args.iterations}
    if args.restarts is not None or args.workload == "tabdiff":
        budget["restarts"] = 4 if args.restarts is None else args.restarts
    rounds, cache = tuple(args.trained_rounds), Path(args.model_cache)
    try:
        if args.workload == "tabdiff":
            df = evaluate(datasets, args.regimes, args.batch_sizes, args.batches, attacks, budget,
                          args.protocol, overrides=overrides, trained_rounds=rounds, cache=cache)  # fmt: skip
        else:
            df = evaluate_classifier(args.workload, datasets, args.batch_sizes, args.batches,
                                     attacks, budget, overrides=overrides, trained_rounds=rounds,
                                     cache=cache)  # fmt: skip
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    md = table(df)
    print(md)
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.csv:
        df.to_csv(args.csv, index=False)
    if args.out:
        Path(args.out).write_text(md + "\n")
    return 0


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
