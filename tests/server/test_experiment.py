"""Config resolution against every registry: presets resolve, and resolve again unchanged."""

import pytest

from flowerbed.clients.core.config import preset_names
from flowerbed.clients.core.errors import ConfigError
from flowerbed.server.experiment import load_experiment, resolve


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_resolves_and_a_resolved_config_resolves_to_itself(preset):
    cfg = load_experiment(preset)
    assert resolve(cfg.to_dict()) == cfg  # what the ServerApp does with the config the CLI sends


@pytest.mark.parametrize(
    ("preset", "overrides", "needle"),
    [
        ("gem", ["dataset.name=german"], "workload 'gem' does not use dataset"),
        (
            "fcm-trig-evolving",
            ["clients.partitioner=dirichlet"],
            "does not use clients.partitioner",
        ),
        ("quickstart", ["attack.name=goliath"], "attack 'goliath' needs tabular-diffusion"),
        ("flowleak", ["defenses=[{name: dp-sgd}]"], "defense 'dp-sgd' needs private-training"),
    ],
)
def test_a_wrong_combination_is_refused_naming_what_is_missing(preset, overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_experiment(preset, overrides)
