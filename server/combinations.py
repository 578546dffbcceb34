"""Checks of a resolved config that span components: inputs each component accepts alone but
that together would run and lie (an entry silently ignored, every round silently dropped, an
attack that never scores). Each is a one-line ``ConfigError`` naming the problem and what is
allowed, raised when the config is resolved (before anything starts)."""

from __future__ import annotations

from flowerbed.attacks import ATTACKS
from flowerbed.clients.core.config import Experiment
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.defenses import DEFENSES, Aggregation, DefenseContext


def check_combinations(experiment: Experiment) -> None:
    """Raise ``ConfigError`` for a combination of components that would run and lie."""
    names = [d.name for d in experiment.defenses]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        first, second = [i for i, n in enumerate(names) if n == twice][:2]
        raise ConfigError(
            f"defense '{twice}' listed twice in defenses (entries {first} and {second}); only one "
            "would act (allowed: each defense once, its params in one entry)"
        )
    if not names:
        return
    ctx = DefenseContext.of(experiment)
    for i, defense in enumerate(experiment.defenses):
        cls = DEFENSES.get(defense.name or "")
        for mechanism in cls(defense.params, ctx).mechanism():
            if isinstance(mechanism, Aggregation):
                _check_aggregation(experiment, i, defense.name or "", mechanism, ctx)


def _check_aggregation(
    experiment: Experiment, index: int, name: str, mechanism: Aggregation, ctx: DefenseContext
) -> None:
    """Secure aggregation drops a round with fewer replies than its threshold: a threshold above
    the clients a round samples drops every round; an attack on single clients' replies never
    sees one (the server receives only aggregates)."""
    clients = experiment.clients
    if mechanism.min_clients > ctx.sampled_clients:
        raise ConfigError(
            f"defenses.{index}.params.min_clients={mechanism.min_clients} above the "
            f"{ctx.sampled_clients} clients a round samples (clients.num={clients.num}, "
            f"clients.fraction={clients.fraction}): '{name}' would drop every round "
            f"(allowed: min_clients 1..{ctx.sampled_clients})"
        )
    attack = experiment.attack.name
    if attack and not ATTACKS.get(attack).reads_aggregates:
        readers = [n for n, c in ATTACKS.items() if getattr(c, "reads_aggregates", False)]
        raise ConfigError(
            f"attack '{attack}' inverts single clients' updates, but defense '{name}' shows the "
            f"server only aggregates: it would never score (allowed with '{name}': "
            f"{', '.join(readers)})"
        )
