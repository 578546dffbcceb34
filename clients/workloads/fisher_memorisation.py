"""Fisher information separates generalisation from memorisation.

Method page: docs/methods/fisher-memorisation.md.

A network trained on data with a fraction of flipped labels memorises them. Projecting one layer's
weights onto the top eigen-directions of its Fisher information (K-FAC: ``F ~ G (x) A`` with
``A = E[a a^T]`` over layer inputs, bias appended, and ``G = E[g g^T]`` over output gradients with
labels drawn from the model) keeps the shared structure and drops the directions used to
memorise: memorisation of the noisy labels falls while test accuracy holds or rises — in the deeper
layers. The model is the paper's vision setting in small: a convolutional input layer (weights
shared over positions, as in every CIFAR-10 model), a dense hidden layer and the output layer.
Projecting the conv input layer only blurs its filters, and memorisation falls only together with
test accuracy ("the layer where the decoupling emerges"). A *dense* input layer (``make_mlp``)
decouples too: its ``A`` is the pixel second moment, so its top-Fisher projection is a PCA denoiser
of the inputs. After Merullo et al. 2025 (arXiv 2510.24256) and the abstract; the paper itself was
not located.

The analytically solvable case: least squares on fixed features, where the Fisher is ``X^T X``
and the top-k projection is principal-component regression; the memorised share of the label
noise is ``||U_k^T eps||^2 / ||eps||^2`` in closed form.

The second setting: a one-block transformer (linear self-attention + MLP) learns in-context
linear regression on fresh prompts, then memorises random targets of a fixed prompt pool;
projecting the MLP removes them and restores in-context regression, projecting the attention
does not (memorisation falls there only as test error rises).

Federated (``fisher-memorisation``): clients with different label-noise rates train the shared
model with FedAvg and also return the K-FAC factors of the model they received; FedAvg's
example-weighted mean of those factors is exactly the pooled-data factor, so the server projects
the previous round's global model with the pooled Fisher.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from scipy.ndimage import gaussian_filter, shift
from sklearn.datasets import load_digits
from torch import nn

from flowerbed.clients.core.params import choices, param
from flowerbed.clients.core.seeding import client_seed
from flowerbed.clients.core.values import RoundConfig
from flowerbed.clients.nn import make_mlp
from flowerbed.clients.workloads import WORKLOADS, Workload, WorkloadContext, train_cross_entropy

# ---------------------------------------------------------------------------------------------
# 1. data: bundled digits or generated image-like classes, with controlled label noise
# ---------------------------------------------------------------------------------------------


@dataclass
class NoisySplit:
    """Train set with noisy labels (and the clean ones, for the analysis), clean test set."""

    x_train: torch.Tensor
    y_noisy: torch.Tensor
    y_clean: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def flipped(self) -> torch.Tensor:
        return self.y_noisy != self.y_clean


def flip_labels(y: np.ndarray, rate: float, classes: int, rng: np.random.Generator) -> np.ndarray:
    """Symmetric label noise: a ``rate`` fraction of labels moved to a uniformly random other class."""
    y = y.copy()
    idx = rng.choice(len(y), size=int(round(rate * len(y))), replace=False)
    y[idx] = (y[idx] + rng.integers(1, classes, size=len(idx))) % classes
    return y


def digits_data() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits, pixels scaled to [0, 1]."""
    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


def image_like_data(
    n: int, seed: int, classes: int = 10, side: int = 8
) -> tuple[np.ndarray, np.ndarray]:
    """Generated image-like classes: smooth random prototypes, shifted by up to a pixel, plus noise."""
    rng = np.random.default_rng(seed)
    protos = np.stack([gaussian_filter(rng.normal(size=(side, side)), 1.0) for _ in range(classes)])
    protos = protos / protos.std(axis=(1, 2), keepdims=True)
    y = rng.integers(0, classes, size=n)
    x = np.stack([
        shift(protos[c], rng.uniform(-1, 1, size=2), order=1, mode="nearest") for c in y
    ]) + 0.6 * rng.normal(size=(n, side, side))  # fmt: skip
    return x.reshape(n, -1).astype(np.float32), y.astype(np.int64)


def noisy_split(
    dataset: str, n_train: int, noise_rate: float, seed: int, n_synthetic: int = 1800
) -> NoisySplit:
    """Train/test split of ``dataset`` ("digits" or "image-like") with noisy train labels."""
    x, y = digits_data() if dataset == "digits" else image_like_data(n_synthetic, seed)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    train, test = order[:n_train], order[n_train:]
    noisy = flip_labels(y[train], noise_rate, int(y.max()) + 1, rng)
    t = torch.from_numpy
    return NoisySplit(t(x[train]), t(noisy), t(y[train]), t(x[test]), t(y[test]))


# ---------------------------------------------------------------------------------------------
# 2. model
# ---------------------------------------------------------------------------------------------


class PatchConv(nn.Module):
    """A ``k x k`` convolution (stride 1, same padding) written as one ``nn.Linear`` on patches.

    The weight is shared across positions, so the layer cannot store a per-image detail in its
    own parameters; K-FAC sees every patch as a sample of the same linear map (Grosse & Martens'
    KFC), and the projection code treats it exactly like a dense layer.
    """

    def __init__(self, channels_in: int, channels_out: int, side: int, kernel: int = 3) -> None:
        super().__init__()
        self.channels_in, self.side, self.kernel = channels_in, side, kernel
        self.linear = nn.Linear(channels_in * kernel * kernel, channels_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(len(x), self.channels_in, self.side, self.side)
        patches = nn.functional.unfold(x, self.kernel, padding=self.kernel // 2).transpose(1, 2)
        out = self.linear(patches)  # (N, positions, channels_out)
        return out.transpose(1, 2).reshape(len(x), -1, self.side, self.side)


def make_cnn(side: int, channels: int, hidden: list[int], classes: int) -> nn.Sequential:
    """Conv input layer and 2x2 average pooling, then the dense layers of ``make_mlp``."""
    head = make_mlp(channels * (side // 2) ** 2, hidden, classes)
    return nn.Sequential(
        PatchConv(1, channels, side), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(), *head
    )


def linear_layers(model: nn.Module) -> list[nn.Linear]:
    """The model's weight layers in forward order (a ``PatchConv`` contributes its ``linear``)."""
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


# ---------------------------------------------------------------------------------------------
# 3. local step
# ---------------------------------------------------------------------------------------------


train = train_cross_entropy  # Adam on cross-entropy in shuffled minibatches (shared)


# ---------------------------------------------------------------------------------------------
# 4. metrics: K-FAC factors, exact diagonal Fisher, projection, memorisation
# ---------------------------------------------------------------------------------------------


def _inputs_and_output_grads(
    model: nn.Module, x: torch.Tensor
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Per weight layer: inputs (N, P, in), a 1 appended where the layer has a bias, and, per class
    y, ``sqrt(p_y) dL_y/ds`` (N, P, out); P = 1 for a dense layer, the positions for a conv layer.

    Summing outer products of the latter over classes gives the *true* Fisher (labels from the
    model) exactly, without sampling. A model with one output per sample is a regression with
    unit-variance Gaussian noise: its true Fisher has the single term ``df/ds``.
    """
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []

    def capture(module: nn.Linear, args: tuple[torch.Tensor], out: torch.Tensor) -> None:
        a = args[0].detach().reshape(len(x), -1, module.in_features)
        if module.bias is not None:
            a = torch.cat([a, torch.ones(*a.shape[:2], 1)], dim=2)
        inputs.append(a)
        outputs.append(out)

    hooks = [layer.register_forward_hook(capture) for layer in linear_layers(model)]
    try:
        out = model(x)
    finally:
        for hook in hooks:
            hook.remove()
    if out.dim() == 1:  # regression
        terms = [out.sum()]
    else:
        logp = torch.log_softmax(out, dim=1)
        weight = logp.detach().exp().sqrt()
        terms = [-(weight[:, c] * logp[:, c]).sum() for c in range(out.shape[1])]
    grads: list[list[torch.Tensor]] = [[] for _ in outputs]
    for term in terms:
        for layer, g in enumerate(torch.autograd.grad(term, outputs, retain_graph=True)):
            grads[layer].append(g.detach().reshape(len(x), -1, g.shape[-1]))
    return inputs, grads


@torch.no_grad()
def _no_grad_eval(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    return model(x)


def kfac_factors(model: nn.Module, x: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(A, G)`` per weight layer, summed over positions and averaged over the samples ``x``."""
    inputs, grads = _inputs_and_output_grads(model, x)
    n = len(x)
    factors = []
    for a, per_class in zip(inputs, grads, strict=True):
        a64 = a.double().reshape(-1, a.shape[-1])
        flat = (c.double().reshape(-1, c.shape[-1]) for c in per_class)
        g = cast(torch.Tensor, sum(gc.T @ gc for gc in flat))
        factors.append(((a64.T @ a64 / n).numpy(), (g / n).numpy()))
    return factors


def exact_diagonal_fisher(model: nn.Module, x: torch.Tensor) -> list[np.ndarray]:
    """The exact Fisher diagonal per layer, ``E_x sum_y p_y (dL_y/dW)^2`` as an (out, in+1) array."""
    inputs, grads = _inputs_and_output_grads(model, x)
    out = []
    for a, per_class in zip(inputs, grads, strict=True):
        a64 = a.double()
        if a.shape[1] == 1:  # dense: the per-sample gradient g a^T is rank one, so square factors
            g2 = cast(torch.Tensor, sum(gc.double()[:, 0] ** 2 for gc in per_class))
            out.append((g2.T @ a64[:, 0] ** 2 / len(x)).numpy())
            continue
        per_sample = (torch.einsum("npo,npi->noi", gc.double(), a64) for gc in per_class)
        out.append((cast(torch.Tensor, sum(g**2 for g in per_sample)).sum(0) / len(x)).numpy())
    return out


def layer_weight(layer: nn.Linear) -> np.ndarray:
    """The layer's weight with its bias (if any) as a last column, (out, in[+1])."""
    if layer.bias is None:
        return layer.weight.detach().double().numpy()
    return torch.cat([layer.weight, layer.bias[:, None]], dim=1).detach().double().numpy()


@dataclass
class KroneckerBasis:
    """Eigen-decomposition of one layer's K-FAC factors."""

    lam_a: np.ndarray
    u_a: np.ndarray
    lam_g: np.ndarray
    u_g: np.ndarray

    @classmethod
    def of(cls, a: np.ndarray, g: np.ndarray) -> KroneckerBasis:
        lam_a, u_a = np.linalg.eigh(a)
        lam_g, u_g = np.linalg.eigh(g)
        return cls(np.clip(lam_a, 0, None), u_a, np.clip(lam_g, 0, None), u_g)


def fisher_projection(
    w: np.ndarray,
    a: np.ndarray | KroneckerBasis,
    g: np.ndarray | None = None,
    keep: float = 0.1,
    order: str = "top",
    seed: int = 0,
) -> np.ndarray:
    """Keep the top ``keep`` fraction of K-FAC eigen-directions of ``w`` (out, in[+1]).

    ``C = U_G^T W U_A``; direction (i, j) has Fisher eigenvalue ``lambda^G_i lambda^A_j``;
    ``W' = U_G (C * M) U_A^T`` with ``M`` the mask of the largest ones. ``order="random"`` keeps
    the same number of directions at random (the ablation).
    """
    basis = a if isinstance(a, KroneckerBasis) else KroneckerBasis.of(a, cast(np.ndarray, g))
    coeff = basis.u_g.T @ w @ basis.u_a
    importance = np.outer(basis.lam_g, basis.lam_a).ravel()
    k = max(int(round(keep * importance.size)), 1)
    if order == "top":
        chosen = np.argsort(importance, kind="stable")[::-1][:k]
    elif order == "random":
        chosen = np.random.default_rng(seed).permutation(importance.size)[:k]
    else:
        raise ValueError(f"order must be 'top' or 'random', not {order!r}")
    mask = np.zeros(importance.size, dtype=bool)
    mask[chosen] = True
    return basis.u_g @ (coeff * mask.reshape(coeff.shape)) @ basis.u_a.T


def set_layer_weight(layer: nn.Linear, w: np.ndarray) -> None:
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w[:, : layer.in_features]).float())
        if layer.bias is not None:
            layer.bias.copy_(torch.from_numpy(w[:, -1]).float())


@dataclass
class Scores:
    test_accuracy: float
    memorisation: float  # train accuracy on flipped samples w.r.t. their noisy labels
    recovery: float  # accuracy on flipped samples w.r.t. their true labels


def scores(model: nn.Module, data: NoisySplit) -> Scores:
    test_pred = _no_grad_eval(model, data.x_test).argmax(1)
    flipped = data.flipped
    train_pred = _no_grad_eval(model, data.x_train[flipped]).argmax(1)
    return Scores(
        float((test_pred == data.y_test).float().mean()),
        float((train_pred == data.y_noisy[flipped]).float().mean()),
        float((train_pred == data.y_clean[flipped]).float().mean()),
    )


def projected_scores(
    model: nn.Module,
    basis: KroneckerBasis,
    data: NoisySplit,
    layer: int,
    keep: float,
    order: str = "top",
    score: Callable[[nn.Module, NoisySplit], Any] = scores,
) -> Any:
    """``score`` after projecting one layer (the model is restored afterwards)."""
    target = linear_layers(model)[layer]
    original = layer_weight(target)
    set_layer_weight(target, fisher_projection(original, basis, keep=keep, order=order))
    try:
        return score(model, data)
    finally:
        set_layer_weight(target, original)


def projection_sweep(
    model: nn.Module,
    data: NoisySplit,
    keeps: list[float],
    order: str = "top",
    layers: list[int] | None = None,
    score: Callable[[nn.Module, NoisySplit], Any] = scores,
) -> dict[tuple[int, float], Any]:
    """Layer x kept-fraction table (all layers unless ``layers``); K-FAC from the training inputs."""
    bases = [KroneckerBasis.of(a, g) for a, g in kfac_factors(model, data.x_train)]
    return {
        (layer, keep): projected_scores(model, bases[layer], data, layer, keep, order, score)
        for layer in (range(len(bases)) if layers is None else layers)
        for keep in keeps
    }


# ---------------------------------------------------------------------------------------------
# The analytically solvable linear model: Fisher projection = principal-component regression
# ---------------------------------------------------------------------------------------------


def random_relu_features(x: np.ndarray, dim: int, seed: int) -> np.ndarray:
    """Fixed random ReLU features ``max(0, x R + b)``: a linear model with more parameters than data."""
    rng = np.random.default_rng(seed)
    proj = rng.normal(size=(x.shape[1], dim)) / np.sqrt(x.shape[1])
    return np.maximum(x @ proj + rng.normal(size=dim), 0.0)


def projected_least_squares(features: np.ndarray, targets: np.ndarray, k: int) -> np.ndarray:
    """Min-norm least squares, then the generic K-FAC projection keeping the top ``k`` directions.

    Squared loss with unit output variance: ``A = X^T X / n`` and ``G = I``, so the Kronecker
    spectrum is ``lambda^A_j`` for every output and a kept fraction ``k / D`` keeps the top ``k``
    input eigen-directions in every row. Returns the projected weight (outputs, D).
    """
    w = np.linalg.lstsq(features, targets, rcond=None)[0].T
    a = features.T @ features / len(features)
    return fisher_projection(w, a, np.eye(w.shape[0]), keep=k / features.shape[1])


@dataclass
class LinearCheck:
    numeric_fit: np.ndarray  # train outputs of the Fisher-projected min-norm solution
    closed_fit: np.ndarray  # principal-component regression: U_k U_k^T Y
    numeric_noise_share: float  # fitted part of the label noise, through the projection code
    closed_noise_share: float  # ||U_k^T eps||^2 / ||eps||^2
    test_accuracy: float
    memorisation: float


def linear_check(
    features: np.ndarray,
    y_noisy: np.ndarray,
    y_clean: np.ndarray,
    k: int,
    test_features: np.ndarray,
    y_test: np.ndarray,
) -> LinearCheck:
    """The linear model numerically (projection code) and in closed form (PCR)."""
    classes = int(max(y_noisy.max(), y_clean.max(), y_test.max())) + 1
    onehot_noisy, onehot_clean = np.eye(classes)[y_noisy], np.eye(classes)[y_clean]
    w_k = projected_least_squares(features, onehot_noisy, k)
    numeric_fit = features @ w_k.T
    u = np.linalg.svd(features, full_matrices=False)[0][:, :k]
    closed_fit = u @ (u.T @ onehot_noisy)
    eps = onehot_noisy - onehot_clean
    # the projected fit is linear in the targets, so its noise part is the fit of eps alone
    fitted_eps = features @ projected_least_squares(features, eps, k).T
    flipped = y_noisy != y_clean
    return LinearCheck(
        numeric_fit=numeric_fit,
        closed_fit=closed_fit,
        numeric_noise_share=float((fitted_eps**2).sum() / (eps**2).sum()),
        closed_noise_share=float(((u.T @ eps) ** 2).sum() / (eps**2).sum()),
        test_accuracy=float(((test_features @ w_k.T).argmax(1) == y_test).mean()),
        memorisation=float((numeric_fit[flipped].argmax(1) == y_noisy[flipped]).mean()),
    )


# ---------------------------------------------------------------------------------------------
# Second setting: a small transformer doing in-context linear regression
# ---------------------------------------------------------------------------------------------


def icl_prompts(n: int, dim: int, context: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` prompts ``(x_1, y_1) ... (x_k, y_k), (x_q, 0)`` with ``y = w.x``, a fresh ``w`` per prompt.

    Tokens (n, context + 1, dim + 1); returns them and the query targets ``w.x_q``.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, context + 1, dim, generator=gen)
    w = torch.randn(n, dim, generator=gen) / dim**0.5
    y = (x @ w[:, :, None])[..., 0]
    tokens = torch.cat([x, y[..., None]], dim=-1)
    tokens[:, -1, dim] = 0.0
    return tokens, y[:, -1].clone()


def icl_split(
    n_train: int, noise_rate: float, seed: int, dim: int = 3, context: int = 10
) -> NoisySplit:
    """Training prompts of which a ``noise_rate`` fraction get a random query target
    (learnable only by memorising that prompt), and fresh test prompts."""
    x, y = icl_prompts(n_train, dim, context, seed)
    noisy = y.clone()
    flipped = torch.from_numpy(np.random.default_rng(seed).random(n_train) < noise_rate)
    gen = torch.Generator().manual_seed(seed + 1)
    noisy[flipped] = torch.randn(int(flipped.sum()), generator=gen)
    x_test, y_test = icl_prompts(2000, dim, context, seed + 2)
    return NoisySplit(x, noisy, y, x_test, y_test)


class InContextRegressor(nn.Module):
    """A one-block transformer: linear self-attention from the query to the context (which can
    learn in-context regression as one gradient step, von Oswald et al. 2023), then a ReLU MLP on
    the query token and the attention update, with residual connections. Weight layers in order:
    ``kq``, ``pv`` (attention), ``mlp_in``, ``mlp_out``."""

    def __init__(self, dim: int = 3, hidden: int = 128) -> None:
        super().__init__()
        d = dim + 1
        self.kq = nn.Linear(d, d, bias=False)
        self.pv = nn.Linear(d, d, bias=False)
        self.mlp_in = nn.Linear(2 * d, hidden)
        self.mlp_out = nn.Linear(hidden, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        context, query = tokens[:, :-1], tokens[:, -1:]
        score = self.kq(context) @ query.transpose(1, 2) / context.shape[1]  # (n, k, 1)
        update = (self.pv(context) * score).sum(1)  # (n, d)
        h = torch.relu(self.mlp_in(torch.cat([query[:, 0], update], dim=-1)))
        return update[:, -1] + self.mlp_out(h)[:, 0]


def train_in_context(
    model: nn.Module, data: NoisySplit, warm_steps: int, steps: int, lr: float, seed: int
) -> None:
    """Adam on squared error: first on fresh prompts (in-context regression emerges), then
    full-batch on the fixed noisy training prompts until their random targets are memorised."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    dim, context = data.x_train.shape[2] - 1, data.x_train.shape[1] - 1
    for step in range(warm_steps + steps):
        if step < warm_steps:
            x, y = icl_prompts(256, dim, context, seed=10_000 * (seed + 1) + step)
        else:
            x, y = data.x_train, data.y_noisy
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


@dataclass
class IclScores:
    test_mse: float  # on fresh prompts; predicting 0 gives about 1
    memorisation: float  # noisy prompts predicted closer to their random target than to w.x_q


def icl_scores(model: nn.Module, data: NoisySplit) -> IclScores:
    flipped = data.flipped
    pred = _no_grad_eval(model, data.x_train[flipped])
    closer = (pred - data.y_noisy[flipped]).abs() < (pred - data.y_clean[flipped]).abs()
    test = _no_grad_eval(model, data.x_test)
    return IclScores(float(((test - data.y_test) ** 2).mean()), float(closer.float().mean()))


# ---------------------------------------------------------------------------------------------
# 5. registration: FedAvg of the model, K-FAC factors pooled by sample count
# ---------------------------------------------------------------------------------------------


@dataclass
class ClientShard:
    x: torch.Tensor
    y_noisy: torch.Tensor
    y_clean: torch.Tensor
    noise_rate: float


FisherDataset = choices("FisherDataset", ("digits", "image-like"))
FisherModel = choices("FisherModel", ("cnn", "mlp"))


@WORKLOADS.register(
    "fisher-memorisation",
    "Fisher (K-FAC) projection separates generalisation from memorised label noise (FedAvg)",
)
class FisherMemorisation(Workload):
    """Clients with different label-noise rates train a shared CNN (or MLP), return K-FAC factors.

    Every reply carries, next to the trained weights, the factors ``A``, ``G`` of the model the
    client *received*, averaged over its samples; FedAvg's example-weighted mean of them is the
    pooled-data factor of that global model. ``server_evaluate`` of round ``r`` therefore
    projects the global model of round ``r - 1`` with its exact pooled Fisher and reports test
    accuracy and memorisation per kept fraction. Memorisation is measured on the clients'
    flipped samples, which the simulation can regenerate (an evaluation oracle, not a protocol).
    """

    @dataclass
    class Params:
        dataset: FisherDataset = FisherDataset("digits")  # or "image-like"
        model: FisherModel = FisherModel(
            "cnn"
        )  # conv input layer + dense layers, or "mlp" (dense input layer)
        channels: int = param(16, ge=1)  # conv input layer (model "cnn")
        hidden: list[int] = param(factory=lambda: [256], ge=1)
        noise_rates: list[float] = param(factory=lambda: [0.2, 0.4, 0.6], ge=0, le=1)
        train_size: int = param(1200, ge=1)
        lr: float = param(3e-3, gt=0)
        local_epochs: int = param(20, ge=1)
        batch_size: int = param(0, ge=0)  # 0 = full batch
        project_layer: int = param(2, ge=0)
        keep_fractions: list[float] = param(factory=lambda: [0.05, 0.01], gt=0, le=1)

    params: Params

    def __init__(self, params: Params | Mapping[str, object], ctx: WorkloadContext) -> None:
        super().__init__(params, ctx)
        x, y = (
            digits_data()
            if self.params.dataset == "digits"
            else image_like_data(1800, self.ctx.seed)
        )
        rng = np.random.default_rng(client_seed(self.ctx.seed, 0, 0, salt=24))
        order = rng.permutation(len(y))
        self._x, self._y = x, y
        self._pool, self._test = order[: self.params.train_size], order[self.params.train_size :]
        self.classes = int(y.max()) + 1
        self.in_dim = x.shape[1]
        self._previous: dict[str, torch.Tensor] | None = None
        self._shards: list[ClientShard] | None = None

    def _model(self) -> nn.Sequential:
        hidden = list(self.params.hidden)
        if self.params.model == "mlp":
            return make_mlp(self.in_dim, hidden, self.classes)
        return make_cnn(int(round(self.in_dim**0.5)), self.params.channels, hidden, self.classes)

    def _layer_sizes(self) -> list[tuple[int, int]]:
        return [(lin.in_features + 1, lin.out_features) for lin in linear_layers(self._model())]

    def load_partition(self, partition_id: int, num_partitions: int) -> ClientShard:
        idx = self._pool[partition_id::num_partitions]
        rate = float(self.params.noise_rates[partition_id % len(self.params.noise_rates)])
        rng = np.random.default_rng(client_seed(self.ctx.seed, partition_id, 0, salt=24))
        noisy = flip_labels(self._y[idx], rate, self.classes, rng)
        t = torch.from_numpy
        return ClientShard(t(self._x[idx]), t(noisy), t(self._y[idx]), rate)

    def _split_arrays(
        self, arrays: ArrayRecord
    ) -> tuple[nn.Sequential, list[tuple[np.ndarray, np.ndarray]]]:
        model = self._model()
        state = {k: torch.from_numpy(np.array(arrays[k].numpy())) for k in model.state_dict()}
        model.load_state_dict(state)
        n_layers = len(linear_layers(model))
        factors = [(np.array(arrays[f"kfac.A.{i}"].numpy()), np.array(arrays[f"kfac.G.{i}"].numpy()))
                   for i in range(n_layers)]  # fmt: skip
        return model, factors

    @staticmethod
    def _pack(model: nn.Module, factors: list[tuple[np.ndarray, np.ndarray]]) -> ArrayRecord:
        record = {k: Array(v.detach().numpy().copy()) for k, v in model.state_dict().items()}
        for i, (a, g) in enumerate(factors):
            record[f"kfac.A.{i}"] = Array(a)
            record[f"kfac.G.{i}"] = Array(g)
        return ArrayRecord(record)

    def init_arrays(self) -> ArrayRecord:
        torch.manual_seed(self.ctx.seed)
        zeros = [(np.zeros((a, a)), np.zeros((g, g))) for a, g in self._layer_sizes()]
        return self._pack(self._model(), zeros)

    def fit(
        self, arrays: ArrayRecord, data: ClientShard, config: RoundConfig, state: RecordDict
    ) -> tuple[ArrayRecord, dict[str, float]]:
        model, _ = self._split_arrays(arrays)
        factors = kfac_factors(model, data.x)  # of the received global model
        seed = client_seed(self.ctx.seed, config["partition-id"], config["server-round"])
        batch = self.params.batch_size or len(data.y_noisy)
        loss = train(model, data.x, data.y_noisy, self.params.local_epochs, self.params.lr, batch,
                     torch.Generator().manual_seed(seed))  # fmt: skip
        flipped = data.y_noisy != data.y_clean
        pred = _no_grad_eval(model, data.x[flipped]).argmax(1)
        metrics = {
            "num-examples": len(data.y_noisy),
            "loss": loss,
            "memorisation": float((pred == data.y_noisy[flipped]).float().mean()),
            "noise_rate": data.noise_rate,
        }
        return self._pack(model, factors), metrics

    def evaluate(self, arrays: ArrayRecord, data: ClientShard, config: RoundConfig):
        model, _ = self._split_arrays(arrays)
        pred = _no_grad_eval(model, data.x).argmax(1)
        flipped = data.y_noisy != data.y_clean
        return {
            "num-examples": len(data.y_noisy),
            "clean_accuracy": float((pred[~flipped] == data.y_clean[~flipped]).float().mean()),
            "memorisation": float((pred[flipped] == data.y_noisy[flipped]).float().mean()),
        }

    def _global_split(self) -> NoisySplit:
        if self._shards is None:
            num = self.ctx.num_clients
            self._shards = [self.load_partition(i, num) for i in range(num)]
        t = torch.from_numpy
        return NoisySplit(
            torch.cat([s.x for s in self._shards]),
            torch.cat([s.y_noisy for s in self._shards]),
            torch.cat([s.y_clean for s in self._shards]),
            t(self._x[self._test]),
            t(self._y[self._test]),
        )

    def server_evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        model, factors = self._split_arrays(arrays)
        data = self._global_split()
        now = scores(model, data)
        metrics = {"test_accuracy": now.test_accuracy, "memorisation": now.memorisation}
        if self._previous is not None and server_round > 0:
            previous = self._model()
            previous.load_state_dict(self._previous)
            base = scores(previous, data)
            metrics |= {
                "prev_test_accuracy": base.test_accuracy,
                "prev_memorisation": base.memorisation,
            }
            layer = self.params.project_layer
            basis = KroneckerBasis.of(*factors[layer])
            for keep in self.params.keep_fractions:
                s = projected_scores(previous, basis, data, layer, keep)
                metrics |= {
                    f"proj_keep{keep:g}_test_accuracy": s.test_accuracy,
                    f"proj_keep{keep:g}_memorisation": s.memorisation,
                    f"proj_keep{keep:g}_recovery": s.recovery,
                }
        self._previous = {k: v.clone() for k, v in model.state_dict().items()}
        return metrics
