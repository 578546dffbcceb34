"""Fisher projection: memorisation removed without hurting test accuracy; PCR closed form; K-FAC."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flowerbed.clients.nn import make_mlp
from flowerbed.clients.workloads import build_workload
from flowerbed.clients.workloads.fisher_memorisation import (
    FisherMemorisation,
    InContextRegressor,
    digits_data,
    exact_diagonal_fisher,
    flip_labels,
    icl_scores,
    icl_split,
    kfac_factors,
    linear_check,
    linear_layers,
    make_cnn,
    noisy_split,
    projection_sweep,
    random_relu_features,
    scores,
    train,
    train_in_context,
)

# kept fractions of a layer's K-FAC eigen-directions (conv input layer: 16 x 10 = 160 of them)
KEEPS = [0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.06, 0.04, 0.03, 0.02, 0.01]


def _memorise(model: torch.nn.Module):
    data = noisy_split("digits", 500, 0.4, seed=0)
    train(model, data.x_train, data.y_noisy, 300, 3e-3, 500, torch.Generator().manual_seed(0))
    return model, data, scores(model, data)


@pytest.fixture(scope="module")
def memorised():
    """The paper's vision setting in small: a conv input layer, a dense hidden layer, the output."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return _memorise(make_cnn(8, 16, [256], 10))


def _decoupled(cells: dict, base) -> list:
    return [
        cell
        for cell, s in cells.items()
        if base.memorisation - s.memorisation >= 0.5 and s.test_accuracy >= base.test_accuracy
    ]


def test_network_memorises_the_flipped_labels(memorised):
    _, _, base = memorised
    assert base.memorisation >= 0.95
    assert base.recovery <= 0.05


def test_fisher_projection_decouples_memorisation_from_test_accuracy(memorised):
    model, data, base = memorised
    top = projection_sweep(model, data, KEEPS, layers=[1, 2])
    found = _decoupled(top, base)
    assert found, {k: (v.test_accuracy, v.memorisation) for k, v in top.items()}
    best = max(found, key=lambda cell: top[cell].test_accuracy)
    assert top[best].test_accuracy >= base.test_accuracy + 0.05  # it rises, not merely holds
    rand = projection_sweep(model, data, KEEPS, order="random", layers=[1, 2])
    for cell in found:
        # the same number of randomly chosen eigen-directions destroys the network instead
        assert rand[cell].test_accuracy < base.test_accuracy - 0.2
        # what was memorised is partly recovered: flipped samples now get their true label
        assert top[cell].recovery >= 0.3


def test_input_layer_memorisation_falls_only_with_test_accuracy(memorised):
    model, data, base = memorised
    conv = projection_sweep(model, data, KEEPS, layers=[0])
    falls = [cell for cell, s in conv.items() if base.memorisation - s.memorisation >= 0.5]
    assert falls  # the sweep does reach the regime where memorisation is gone
    assert not _decoupled(conv, base)
    for cell in falls:
        assert conv[cell].test_accuracy <= base.test_accuracy - 0.1, (cell, conv[cell])


def test_dense_input_layer_decouples_too_the_ablation():
    """Replace the conv input layer by a dense one (the MLP): its top-Fisher projection is a PCA
    denoiser of the pixels, and the input layer then decouples as well — the contrast the claim
    about the input layer rests on (docs/workloads.md, "Fisher memorisation")."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, data, base = _memorise(make_mlp(64, [128, 128], 10))
    assert base.memorisation >= 0.95
    assert _decoupled(projection_sweep(model, data, KEEPS, layers=[0]), base)


ICL_KEEPS = [0.8, 0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01]


def test_in_context_transformer_decouples_in_the_mlp_not_in_the_attention():
    """Second setting: in-context linear regression learned on fresh prompts, then 30 % of a fixed
    pool of 300 prompts with random targets memorised. Projecting the MLP's output layer removes
    the memorised targets and restores in-context regression; projecting the attention (the
    in-context mechanism) never does — memorisation falls there only as test error rises."""
    torch.set_num_threads(1)
    data = icl_split(300, 0.3, seed=0)
    torch.manual_seed(0)
    model = InContextRegressor()
    train_in_context(model, data, 600, 2000, 3e-3, seed=0)
    base = icl_scores(model, data)
    assert base.memorisation >= 0.95

    def decoupled(cells: dict) -> list:
        return [
            cell
            for cell, s in cells.items()
            if base.memorisation - s.memorisation >= 0.5 and s.test_mse <= base.test_mse
        ]

    top = projection_sweep(model, data, ICL_KEEPS, score=icl_scores)
    mlp = decoupled({c: s for c, s in top.items() if c[0] == 3})
    assert mlp, {k: (v.test_mse, v.memorisation) for k, v in top.items()}
    best = min(mlp, key=lambda cell: top[cell].test_mse)
    assert top[best].test_mse <= base.test_mse - 0.3
    rand = projection_sweep(model, data, ICL_KEEPS, "random", layers=[3], score=icl_scores)
    assert top[best].test_mse <= rand[best].test_mse - 0.1  # the Fisher ordering matters
    attention = {c: s for c, s in top.items() if c[0] in (0, 1)}
    assert not decoupled(attention)
    falls = [c for c, s in attention.items() if base.memorisation - s.memorisation >= 0.5]
    assert falls
    for cell in falls:
        assert attention[cell].test_mse >= base.test_mse + 0.2, (cell, attention[cell])


def test_linear_fisher_projection_is_principal_component_regression():
    x, y = digits_data()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    tr, te = order[:300], order[300:800]
    feats = random_relu_features(x, 400, seed=0)
    noisy = flip_labels(y[tr], 0.4, 10, rng)
    check = linear_check(feats[tr], noisy, y[tr], 40, feats[te], y[te])
    np.testing.assert_allclose(check.numeric_fit, check.closed_fit, atol=1e-8)
    assert check.numeric_noise_share == pytest.approx(check.closed_noise_share, abs=1e-8)
    full = linear_check(feats[tr], noisy, y[tr], 300, feats[te], y[te])
    assert full.memorisation >= 0.99  # min-norm interpolation memorises every flipped label
    assert check.memorisation <= full.memorisation - 0.5
    assert check.test_accuracy > full.test_accuracy + 0.1


@pytest.mark.parametrize("conv", [False, True])
def test_exact_diagonal_matches_per_sample_gradients_and_kfac_tracks_it(conv):
    torch.manual_seed(0)
    model = make_cnn(4, 3, [6], 3) if conv else make_mlp(16, [4], 3)
    x = torch.randn(20, 16)
    diag = exact_diagonal_fisher(model, x)
    brute = [np.zeros_like(d) for d in diag]
    for xi in x:
        probs = torch.softmax(model(xi[None]), 1)[0].detach()
        for c in range(3):
            model.zero_grad()
            (-torch.log_softmax(model(xi[None]), 1)[0, c]).backward()
            for i, lin in enumerate(linear_layers(model)):
                g = torch.cat([lin.weight.grad, lin.bias.grad[:, None]], 1).double().numpy()
                brute[i] += probs[c].item() * g**2 / len(x)
    for d, b in zip(diag, brute, strict=True):
        np.testing.assert_allclose(d, b, rtol=1e-5, atol=1e-10)
    factors = kfac_factors(model, x)
    for (a, g), d in zip(factors, diag, strict=True):
        kfac_diag = np.outer(np.diag(g), np.diag(a))
        live = (kfac_diag > 0) & (d > 0)  # not a dead ReLU unit
        # weight sharing makes a conv layer's Kronecker factorisation rougher (KFC)
        assert np.corrcoef(np.log(kfac_diag[live]), np.log(d[live]))[0, 1] > (0.75 if conv else 0.8)


def test_federated_factors_are_pooled_exactly(tmp_path, monkeypatch):
    from flowerbed.apps.inline import run_inline
    from flowerbed.server.experiment import load_experiment

    seen = {}
    original = FisherMemorisation.server_evaluate

    def record(self, server_round, arrays):  # noqa: ANN001
        seen[server_round] = {k: np.array(arrays[k].numpy()) for k in arrays}
        return original(self, server_round, arrays)

    monkeypatch.setattr(FisherMemorisation, "server_evaluate", record)
    overrides = [
        "engine=inline", "rounds=2", f"output.dir={tmp_path}", "clients.num=3",
        "workload.params.train_size=301", "workload.params.hidden=[16]",
        "workload.params.local_epochs=3", "workload.params.project_layer=0",
    ]  # fmt: skip
    cfg = load_experiment("fisher-memorisation", overrides)
    summary = run_inline(cfg)["metrics"]
    assert "central.proj_keep0.02_memorisation" in summary
    # round 1 carries the factors of the initial model: equal to the pooled-data factors
    workload = build_workload(cfg)
    model = workload._model()
    model.load_state_dict({k: torch.from_numpy(seen[0][k]) for k in model.state_dict()})
    union = torch.cat([workload.load_partition(i, 3).x for i in range(3)])
    for i, (a, g) in enumerate(kfac_factors(model, union)):
        np.testing.assert_allclose(seen[1][f"kfac.A.{i}"], a, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(seen[1][f"kfac.G.{i}"], g, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bad", ["workload.params.model=bogus", "workload.params.dataset=bogus"])
def test_bad_params_are_a_config_error(bad):
    """Caught when the workload is built, before a run starts (the CLI: one line, exit 2)."""
    from flowerbed.clients.core.errors import ConfigError
    from flowerbed.server.experiment import load_experiment

    with pytest.raises(ConfigError):
        build_workload(load_experiment("fisher-memorisation", ["engine=inline", bad]))
