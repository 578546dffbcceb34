"""Warm start of tabular diffusion: the public split is disjoint from every client's rows, the
pretrained weights are the same for the same seed (and cached), and they are what makes a short
federation useful (the claim test)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flowerbed.clients.core.diskcache import CACHE_ENV
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.tabdiff import pretrain
from flowerbed.clients.workloads import build_workload
from flowerbed.clients.workloads.tabdiff import encoded, to_params
from flowerbed.server.experiment import load_experiment

torch.set_num_threads(1)
CLIENTS = 8
WARM = [
    "engine=inline", "output.dir=/tmp/fb-test-tabdiff-pretrain", "output.plots=false",
    f"clients.num={CLIENTS}", "dataset.max_rows=400", "workload.params.hidden=32",
    "workload.params.layers=2", "workload.params.eval_rows=256",
    "workload.params.pretrain_rows=300", "workload.params.pretrain_epochs=2",
    "workload.params.pretrain_batch_size=64", "workload.params.pretrain_lr=0.004",
]  # fmt: skip


def _work(extra: list[str] | None = None):  # noqa: ANN202
    return build_workload(load_experiment("tabdiff-adult-mixed", [*WARM, *(extra or [])]))


def test_no_client_row_reaches_pretraining(monkeypatch) -> None:
    """The public rows are outside every partition, by position and by value, and the rows the
    pretraining steps train on are exactly the public rows (spied on the training call)."""
    work = _work(["clients.partitioner=dirichlet", "clients.alpha=0.5"])
    data = encoded(work.ctx.dataset_json)
    client_ids = np.concatenate([work.load_partition(p, CLIENTS)["ids"] for p in range(CLIENTS)])
    public = pretrain.public_row_ids(work.ctx.dataset_json, 300)
    assert len(public) == 300 and public.min() >= len(data.table.train)  # after max_rows
    assert not set(public.tolist()) & set(client_ids.tolist())
    whole = pretrain.public_table(work.ctx.dataset_json).train
    client_rows = {tuple(map(str, r)) for r in data.table.train.itertuples(index=False)}
    public_rows = [tuple(map(str, r)) for r in whole.iloc[public].itertuples(index=False)]
    assert not client_rows & set(public_rows)

    seen: list[torch.Tensor] = []
    real_update = pretrain.local_update

    def spy(model, params, batches, latents, protocol, **kw):  # noqa: ANN001, ANN202
        seen.extend(torch.cat([b.num, b.cat], 1) for b in batches)
        return real_update(model, params, batches, latents, protocol, **kw)

    monkeypatch.setattr(pretrain, "local_update", spy)
    pretrain.train_on_public(work.ctx.dataset_json, work.prep, work.spec, work.pretraining, 0)
    trained = torch.unique(torch.cat(seen), dim=0)
    num, codes = work.prep.encode(whole.iloc[public])
    cat = torch.cat(
        [torch.nn.functional.one_hot(torch.from_numpy(codes[:, j]), k).float()
         for j, k in enumerate(work.spec.cat_sizes)], 1,
    )  # fmt: skip
    expected = torch.unique(torch.cat([torch.from_numpy(num).float(), cat], 1), dim=0)
    assert torch.equal(trained, expected)  # every public row, and nothing else


def test_a_warm_start_without_a_public_split_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs dataset.max_rows"):
        _work(["dataset.max_rows=null"])
    with pytest.raises(ConfigError, match="exceeds the"):
        pretrain.public_row_ids(_work().ctx.dataset_json, 10**6)


def test_same_seed_same_weights_cached_on_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(pretrain, "_MEMORY", {})
    first = to_params(_work().init_arrays())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("tabdiff-pretrain")]
    monkeypatch.setattr(pretrain, "_MEMORY", {})
    monkeypatch.setattr(pretrain, "train_on_public", lambda *a: pytest.fail("not cached"))
    again = to_params(_work().init_arrays())
    assert all(torch.equal(first[k], again[k]) for k in first)
    scratch = to_params(_work(["workload.params.pretrain_rows=0"]).init_arrays())
    assert any(not torch.equal(first[k], scratch[k]) for k in first)


# Claim test: after the same two federated rounds on 4 clients x 50 rows, the warm-started
# denoiser fits real held-out rows far better than the same federation started from scratch, on
# each of three seeds. (The ML efficacy this buys at the benchmark's arms is measured in
# docs/methods/tabdiff.md, "Warm start": the efficacy report costs seconds per run.)
CLAIM = [
    "engine=inline", "output.plots=false", "rounds=2", "clients.num=4", "dataset.max_rows=200",
    "workload.params.hidden=64", "workload.params.layers=2", "workload.params.batch_size=25",
    "workload.params.local_epochs=2", "workload.params.lr=0.004",
    "workload.params.eval_rows=512", "workload.params.quality_rows=0",
    "workload.params.pretrain_epochs=10", "workload.params.pretrain_batch_size=128",
    "workload.params.pretrain_lr=0.004",
]  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_warm_start_makes_a_short_cross_device_federation_useful(seed, tmp_path) -> None:
    from flowerbed.apps.inline import run_inline

    runs = {}
    for rows in (2000, 0):
        overrides = [*CLAIM, f"seed={seed}", f"output.dir={tmp_path}"]
        cfg = load_experiment(
            "tabdiff-adult-mixed", [*overrides, f"workload.params.pretrain_rows={rows}"]
        )
        runs[rows] = run_inline(cfg)["metrics"]
    warm, scratch = runs[2000], runs[0]
    assert warm["central.warm_start_rows"] == 2000 and "central.warm_start_rows" not in scratch
    assert warm["central.loss"] <= 0.85 * scratch["central.loss"], (warm, scratch)
