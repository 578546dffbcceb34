"""Malicious clients: who is malicious, the one-line refusals, each attack's crafted update on
hand-made benign updates, and the attacks acting in the ClientApp's path on the inline and
simulation engines (same seed, same result)."""

from __future__ import annotations

import numpy as np
import pytest

from flowerbed.apps.inline import run_inline
from flowerbed.clients.core.config import Engine, replace_at
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.seeding import malicious_partitions
from flowerbed.clients.malicious import MALICIOUS, AggregationRule, MaliciousContext, View, chosen
from flowerbed.clients.malicious.alie import alie_z
from flowerbed.clients.malicious.fang import coordinate_wise, distance_selection, krum_selects
from flowerbed.clients.malicious.shift import pairwise_sq
from flowerbed.server.experiment import load_experiment
from tests.cli_helpers import one_line_exit_2, run_cli

SMALL = ["rounds=1", "clients.num=4", "dataset.max_rows=1200", "clients.fraction_evaluate=0.0"]


# -- who is malicious, and bad input ------------------------------------------------------------
def test_fraction_draws_from_the_seed_and_a_list_is_taken_as_given() -> None:
    a = malicious_partitions(0, 10, 0.3, [])
    assert len(a) == 3 and a == malicious_partitions(0, 10, 0.3, [])
    assert any(malicious_partitions(s, 10, 0.3, []) != a for s in range(1, 5))
    assert malicious_partitions(0, 10, None, [3, 0]) == (0, 3)
    cfg = load_experiment("quickstart", ["malicious.name=sign-flip", "malicious.fraction=0.2"])
    assert len(chosen(cfg)) == 2


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["malicious.name=sign-flip"], "exactly one of fraction"),
        (["malicious.name=sign-flip", "malicious.fraction=0.2", "malicious.clients=[1]"],
         "exactly one of fraction"),
        (["malicious.name=sign-flip", "malicious.clients=[12]"], "outside 0..9"),
        (["malicious.name=sign-flip", "malicious.fraction=0.01"], "rounds to 0"),
        (["malicious.name=sign-flip", "malicious.fraction=1.5"], "malicious.fraction must be"),
        (["malicious.name=nope", "malicious.fraction=0.2"], "unknown malicious 'nope'"),
        (["malicious.name=sign-flip", "malicious.fraction=0.2", "malicious.params.scale=-1"],
         "malicious.params.scale must be > 0"),
        (["malicious.fraction=0.2"], "without malicious.name"),
    ],
)  # fmt: skip
def test_bad_malicious_config_is_one_line(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        load_experiment("quickstart", overrides)


def test_data_poisoning_needs_labelled_examples() -> None:
    with pytest.raises(ConfigError, match="malicious 'label-flip' needs labelled-examples"):
        load_experiment("routing-synthetic-mlp", ["malicious.name=label-flip", "malicious.fraction=0.2"])  # fmt: skip


def test_cli_refuses_before_anything_is_written(tmp_path) -> None:
    result, out = run_cli(tmp_path, "quickstart", "malicious.name=sign-flip", "malicious.clients=[99]")  # fmt: skip
    one_line_exit_2(result, out, "malicious.clients [99] outside 0..9")


# -- crafted updates on hand-made benign updates (float64) -------------------------------------
def _attack(name: str, colluders: tuple[int, ...] = (0, 1, 2), sampled: int = 10, **params):  # noqa: ANN202
    cls = MALICIOUS.get(name)
    return cls(cls.Params(**params), MaliciousContext(0, 1, 10, sampled, colluders))


def _view(benign: np.ndarray, rule: AggregationRule | None = None) -> View:
    return View(0, 1, np.zeros(benign.shape[1]), benign[0], benign, 10,
                np.random.default_rng(1), np.random.default_rng(2), rule)  # fmt: skip


BENIGN = np.random.default_rng(0).normal(0.5, 0.2, size=(5, 40))


def test_sign_flip_gaussian_and_ipm() -> None:
    view = _view(BENIGN)
    assert np.array_equal(_attack("sign-flip", scale=2.0).craft(view), -2.0 * BENIGN[0])
    noise = _attack("gaussian", std=3.0).craft(view)
    assert abs(noise.std() - 3.0) < 1.0 and not np.allclose(noise, BENIGN[0])
    assert np.allclose(_attack("ipm", epsilon=0.5).craft(view), -0.5 * BENIGN.mean(0))


def test_alie_uses_baruchs_z() -> None:
    # Baruch et al. 2019: n = 50, m = 24 -> s = 2, z = Phi^-1(48 / 50) = 1.751
    assert alie_z(50, 24) == pytest.approx(1.7507, abs=1e-4)
    assert alie_z(10, 2) == pytest.approx(0.2533, abs=1e-4)  # s = 4: Phi^-1(0.6)
    crafted = _attack("alie", sampled=10).craft(_view(BENIGN))
    assert np.allclose(crafted, BENIGN.mean(0) - alie_z(10, 3) * BENIGN.std(0))


@pytest.mark.parametrize("name", ["min-max", "min-sum"])
def test_min_max_and_min_sum_take_the_largest_shift_within_the_benign_spread(name: str) -> None:
    crafted = _attack(name).craft(_view(BENIGN))
    mu, d = BENIGN.mean(0), pairwise_sq(BENIGN)
    far = ((BENIGN - crafted) ** 2).sum(1)
    if name == "min-max":
        assert far.max() <= d.max() + 1e-9
        beyond = mu + 1.01 * (crafted - mu)  # a 1 % larger shift breaks the bound
        assert ((BENIGN - beyond) ** 2).sum(1).max() > d.max()
    else:
        assert far.sum() <= d.sum(1).max() + 1e-9
        beyond = mu + 1.01 * (crafted - mu)
        assert ((BENIGN - beyond) ** 2).sum() > d.sum(1).max()


def test_fang_goes_beyond_the_benign_extremes_against_the_mean_direction() -> None:
    crafted = coordinate_wise(BENIGN, np.random.default_rng(0))
    s = np.sign(BENIGN.mean(0))
    assert np.all(np.where(s > 0, crafted <= BENIGN.min(0), crafted >= BENIGN.max(0)))
    assert np.all(np.where(s > 0, crafted >= BENIGN.min(0) / 2, True))  # b = 2 (all positive here)


def test_fang_on_distance_selection_is_picked_by_krum() -> None:
    """Benign updates spread as in high dimension (pairwise distances above their norms)."""
    spread = np.random.default_rng(1).normal(0.1, 1.0, size=(5, 40))
    crafted = distance_selection(spread, copies=3, f=3, threshold=1e-5)
    updates = np.vstack([np.repeat(crafted[None], 3, 0), spread])
    assert krum_selects(updates, 3) < 3
    assert np.all(np.sign(crafted) == -np.sign(spread.mean(0)))
    assert not np.allclose(crafted, -1e-5 * np.sign(spread.mean(0)))  # not the threshold
    rule = AggregationRule("distance-selection", assumed_malicious=3)
    fang = _attack("fang")
    assert fang.variant(_view(BENIGN, rule)) == "distance-selection"
    assert fang.variant(_view(BENIGN, AggregationRule("coordinate-wise", trim=0.5))) == "coordinate-wise"  # fmt: skip


def test_mimic_sends_one_colluders_benign_update() -> None:
    crafted = _attack("mimic").craft(_view(BENIGN))
    assert any(np.array_equal(crafted, row) for row in BENIGN)


# -- in the ClientApp's path --------------------------------------------------------------------
def test_malicious_clients_act_in_the_run_and_are_reported(inline_cfg) -> None:
    """A sign-flip client among 4 changes the run; the summary names it; a clean arm with the
    same seed differs; the model-replacement backdoor reports its ASR at fraction 0 too."""
    clean = run_inline(inline_cfg("quickstart", *SMALL))
    flipped = run_inline(inline_cfg("quickstart", *SMALL, "malicious.name=sign-flip",
                                    "malicious.clients=[1]", "malicious.params.scale=5"))  # fmt: skip
    assert flipped["malicious_partitions"] == [1]
    assert flipped["metrics"]["central.loss"] > clean["metrics"]["central.loss"]
    baseline = run_inline(inline_cfg("quickstart", *SMALL, "malicious.name=backdoor",
                                     "malicious.fraction=0", "malicious.params.target=1"))  # fmt: skip
    assert baseline["malicious_partitions"] == []
    assert 0.0 <= baseline["metrics"]["central.backdoor_asr"] <= 1.0


def test_same_seed_same_result_on_inline_and_simulation(inline_cfg, tmp_path) -> None:
    """ALIE (colluders recompute each other's benign updates) and a label-flipping client give
    the same metrics on the inline engine and on Flower's simulation engine."""
    from flowerbed.server.engines.simulation import run_simulation
    from flowerbed.server.results import default_run_dir

    cfg = inline_cfg("quickstart", *SMALL, "rounds=2", "malicious.name=alie",
                     "malicious.clients=[0, 2]")  # fmt: skip
    inline = run_inline(cfg)
    cfg = replace_at(cfg, "", engine=Engine.simulation)
    simulated = run_simulation(cfg, default_run_dir(cfg))
    keep = lambda m: {k: v for k, v in m.items() if k.startswith("central.")}  # noqa: E731
    assert keep(simulated["metrics"]) == pytest.approx(keep(inline["metrics"]), abs=1e-6)
    assert simulated["malicious_partitions"] == inline["malicious_partitions"] == [0, 2]


def test_a_plugin_file_registers_a_malicious_client_with_its_origin(tmp_path) -> None:
    plugin = tmp_path / "zero_update.py"
    plugin.write_text(
        "import numpy as np\n"
        "from flowerbed.clients.malicious import MALICIOUS, Malicious\n"
        "@MALICIOUS.register('zero-update', 'sends a zero update')\n"
        "class ZeroUpdate(Malicious):\n"
        "    def craft(self, view):\n"
        "        return np.zeros_like(view.own)\n"
    )
    cfg = load_experiment("quickstart", [f"plugins=[{plugin}]", "malicious.name=zero-update",
                                         "malicious.clients=[0]"])  # fmt: skip
    assert cfg.malicious.name == "zero-update"
    assert MALICIOUS.origin("zero-update") == f"plugin {plugin}"


def test_data_poisoning_rewrites_only_the_rows_it_should() -> None:
    """Label flip reverses labels; the image backdoor stamps the bottom-right patch on half the
    rows and relabels them to the last class; the test split is never touched."""
    import torch

    from flowerbed.clients.model_loss import InputSchema
    from flowerbed.clients.workloads import Examples

    schema = InputSchema((1, 8, 8), 10, torch.zeros(64), torch.ones(64), "image")
    ctx = MaliciousContext(0, 1, 10, 10, (0,), schema)
    data = {"train": Examples(torch.zeros(20, 1, 8, 8), torch.arange(20) % 10),
            "test": Examples(torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long))}  # fmt: skip
    flipped = MALICIOUS.get("label-flip")(None, ctx).poison(data, 0, 1)
    assert torch.equal(flipped["train"].y, 9 - data["train"].y)
    poisoned = MALICIOUS.get("backdoor")(None, ctx).poison(data, 0, 1)["train"]
    stamped = poisoned.x[..., -2:, -2:].flatten(1).eq(1.0).all(1)
    assert int(stamped.sum()) == 10 and torch.all(poisoned.y[stamped] == 9)
    assert float(poisoned.x[..., :-2, :].abs().sum()) == 0.0  # nothing else changed
    assert torch.equal(data["train"].x, torch.zeros(20, 1, 8, 8))  # the partition is not mutated
