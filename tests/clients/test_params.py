"""Numeric rules and string choices of Params dataclasses: one-line errors, plain JSON values."""

import json
from dataclasses import dataclass, fields

import pytest

from flowerbed.clients.core.config import validate_structured
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.params import Rule, choices, defaults, param, plain

Kind = choices("Kind", ("chain", "scale-free"))


@dataclass
class Params:
    lr: float = param(0.1, gt=0)
    steps: int = param(10, ge=0)
    fraction: float = param(0.5, gt=0, le=1)
    widths: list[int] = param(factory=lambda: [4, 2], ge=1)
    limit: int | None = param(None, ge=1)
    kind: Kind = Kind("chain")


def test_rule_text():
    assert Rule(gt=0).text() == "> 0"
    assert Rule(ge=1).text() == ">= 1"
    assert Rule(gt=0, le=1).text() == "in (0, 1]"
    assert Rule(ge=0, lt=0.5).text() == "in [0, 0.5)"
    assert Rule(le=16).text() == "<= 16"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"lr": -1}, "p.lr must be > 0 (got -1.0)"),
        ({"lr": float("nan")}, "p.lr must be > 0 (got nan)"),
        ({"steps": -2}, "p.steps must be >= 0 (got -2)"),
        ({"fraction": 0}, "p.fraction must be in (0, 1] (got 0.0)"),
        ({"widths": [3, 0]}, "every value of p.widths must be >= 1 (got [3, 0])"),
        ({"limit": 0}, "p.limit must be >= 1 (got 0)"),
        ({"kind": "ring"}, "unknown value 'ring' for 'p.kind' (allowed: chain, scale-free)"),
    ],
)
def test_broken_rule_is_one_config_error(values, message):
    with pytest.raises(ConfigError) as err:
        validate_structured(Params, values, "p")
    assert str(err.value) == message


def test_valid_values_pass_and_choices_stay_plain_strings():
    params = validate_structured(Params, {"kind": "scale-free", "limit": None, "steps": 0}, "p")
    assert params.kind == "scale-free" and isinstance(params.kind, str)
    data = plain({"kind": params.kind, "nested": [Kind("chain")]})
    assert type(data["kind"]) is str and type(data["nested"][0]) is str
    assert json.loads(json.dumps(data)) == {"kind": "scale-free", "nested": ["chain"]}


@dataclass
@defaults(lr=0.5, widths=[8], kind=Kind("scale-free"))
class Federated(Params):
    rounds: int = param(3, ge=1)


def test_defaults_change_only_the_default_of_an_inherited_field():
    assert [f.name for f in fields(Federated)] == [f.name for f in fields(Params)] + ["rounds"]
    assert (Federated().lr, Federated().widths, Federated().kind) == (0.5, [8], "scale-free")
    assert Params().lr == 0.1 and Params().widths == [4, 2]
    assert Federated().widths is not Federated().widths  # a list default is a factory
    with pytest.raises(ConfigError, match=r"p.lr must be > 0 \(got 0.0\)"):
        validate_structured(Federated, {"lr": 0}, "p")  # the base's rule still holds
    assert validate_structured(Federated, {"rounds": 2}, "p") == Federated(rounds=2)
    with pytest.raises(TypeError, match="bogus"):
        defaults(bogus=1)(type("Bad", (Params,), {}))


def test_a_check_rule_names_the_problem_on_one_line():
    @dataclass
    class Named:
        name: str = param("a", check=lambda v: None if v in ("a", "b") else "allowed: a, b")

    assert validate_structured(Named, {"name": "b"}, "p").name == "b"
    with pytest.raises(ConfigError, match=r"^p\.name: allowed: a, b$"):
        validate_structured(Named, {"name": "c"}, "p")


#: fields without a rule yet (each one given a rule must leave this list)
PENDING_RULES: set[tuple[str, str, str]] = set()


def _ruled(field, hint) -> bool:  # noqa: ANN001
    """A range or check rule (``param``), a choices enum, a bool, or a list of choices."""
    import enum
    import typing

    from flowerbed.clients.core.params import RULE_KEY

    if RULE_KEY in field.metadata or hint is bool:
        return True
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return True
    args = typing.get_args(hint)
    return typing.get_origin(hint) is list and all(
        isinstance(a, type) and issubclass(a, enum.Enum) for a in args
    )


def test_every_params_field_of_every_component_has_a_rule():
    import typing

    from flowerbed.server.experiment import COMPONENTS

    unruled, count = set(), 0
    for kind in ("workloads", "datasets", "strategies", "attacks", "defenses", "malicious"):
        registry = getattr(COMPONENTS, kind)
        for name, cls in registry.items():
            if not registry.is_builtin(name):
                continue
            hints = typing.get_type_hints(cls.Params)
            for field in fields(cls.Params):
                count += 1
                if not _ruled(field, hints[field.name]):
                    unruled.add((kind, name, field.name))
    assert count > 300
    assert unruled == PENDING_RULES, "Params fields without a rule (or given one: remove)"
