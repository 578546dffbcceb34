"""Numeric rules for the fields of a ``Params`` (or config) dataclass, checked at config time.

A rule sits in the field's metadata, so the dataclass stays a plain omegaconf schema::

    @dataclass
    class Params:
        lr: float = param(0.05, gt=0)
        batch_size: int = param(64, ge=1)
        hidden: list[int] = param(factory=lambda: [64, 32], ge=1)   # every element
        fraction: float = param(0.1, gt=0, le=1)

String options are :func:`choices` enums (omegaconf then reports a bad value with the allowed
ones). :func:`check_rules` (called by ``validate_structured`` for every schema it validates) turns a
broken rule into one ``ConfigError`` line: ``workload.params.lr must be > 0 (got -1.0)``.

A workload's ``Params`` extends the config dataclass its method code takes (or a base of the fields
the two share), so each field, rule and default is written once; where the federated setting
differs, :func:`defaults` gives the subclass its own default without redeclaring the field.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast, overload

from flowerbed.clients.core.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from flowerbed.clients.core.values import JsonObject, JsonValue

T = TypeVar("T")

RULE_KEY = "flowerbed.rule"


@dataclass(frozen=True)
class Rule:
    """Bounds on a number (``None`` = unbounded); ``None`` values pass (optional fields).

    ``check`` is a rule on any value (a name among those registered at run time, a mapping's
    shape): it returns ``None`` when the value is fine, else what is wrong and what is allowed."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    #: takes the field's value (its type is the field's: erased here, where every rule is kept)
    check: Callable[..., str | None] | None = dataclasses.field(default=None, compare=False)

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and math.isnan(value):
            return False
        return not (
            (self.gt is not None and not value > self.gt)
            or (self.ge is not None and not value >= self.ge)
            or (self.lt is not None and not value < self.lt)
            or (self.le is not None and not value <= self.le)
        )

    def text(self) -> str:
        low = f"({_num(self.gt)}" if self.gt is not None else None
        low = f"[{_num(self.ge)}" if self.ge is not None else low
        high = f"{_num(self.lt)})" if self.lt is not None else None
        high = f"{_num(self.le)}]" if self.le is not None else high
        if low and high:
            return f"in {low}, {high}"
        if low:
            return f"{'>' if low[0] == '(' else '>='} {low[1:]}"
        return f"{'<' if high and high[-1] == ')' else '<='} {(high or '')[:-1]}"


def _num(value: float) -> str:
    return f"{value:g}"


@overload
def param(
    default: T,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    check: Callable[..., str | None] | None = None,
) -> T: ...
@overload
def param(
    *,
    factory: Callable[[], T],
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    check: Callable[..., str | None] | None = None,
) -> T: ...
def param(
    default: object = dataclasses.MISSING,
    *,
    factory: Callable[[], object] | None = None,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    check: Callable[..., str | None] | None = None,
) -> object:
    """A dataclass field with a numeric rule (applied to each element of a list value) and/or a
    ``check`` of the whole value (returns ``None`` or the problem, with the allowed values)."""
    metadata = {RULE_KEY: Rule(gt=gt, ge=ge, lt=lt, le=le, check=check)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def choices(name: str, values: Iterable[object]) -> type[enum.StrEnum]:
    """A ``StrEnum`` whose member names are its values (``scale-free`` included).

    As the type of a ``Params`` field it makes omegaconf reject any other value with the allowed
    list; members are strings, so comparisons with plain strings and JSON keep working::

        Regime = choices("Regime", ("gaussian", "mixed"))
        regime: Regime = Regime("mixed")
    """
    return enum.StrEnum(name, {str(v): str(v) for v in values})  # type: ignore[return-value]


def defaults(**values: object) -> Callable[[type], type]:
    """Class decorator, placed under ``@dataclass``: other defaults for inherited fields.

    A subclass whose setting differs from its base's (a federated workload's ``Params`` extending
    the config of the centralised experiment) keeps each field's type, rule and position::

        @dataclass
        @defaults(batch_size=32, singular_values=[4.0, 2.0, 1.0])
        class Params(DLNSetup):
            local_steps: int = param(50, ge=1)

    A list or dict value becomes a default factory (each instance gets its own copy).
    """

    def apply(cls: type) -> type:
        inherited = {
            f.name: f
            for base in reversed(cls.__mro__[1:])
            if dataclasses.is_dataclass(base)
            for f in dataclasses.fields(base)
        }
        own = dict(cls.__dict__.get("__annotations__", {}))
        for name, value in values.items():
            if name not in inherited or name in own:
                raise TypeError(f"{cls.__name__}: {name} is not a field it inherits")
            base_field = inherited[name]
            if isinstance(value, list | dict):
                field: object = dataclasses.field(
                    default_factory=functools.partial(copy.deepcopy, value),
                    metadata=base_field.metadata,
                )
            else:
                field = dataclasses.field(default=value, metadata=base_field.metadata)
            own[name] = base_field.type
            setattr(cls, name, field)
        cls.__annotations__ = own
        return cls

    return apply


def check_rules(obj: object, where: str) -> None:
    """Raise ``ConfigError`` for the first field of dataclass ``obj`` that breaks its rule."""
    for f in dataclasses.fields(cast("DataclassInstance", obj)):
        value = getattr(obj, f.name)
        key = f"{where}.{f.name}" if where else f.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_rules(value, key)
            continue
        rule = f.metadata.get(RULE_KEY)
        if rule is None or value is None:
            continue
        problem = rule.check(value) if rule.check is not None else None
        if problem:
            raise ConfigError(f"{key}: {problem}")
        many = isinstance(value, list | tuple)
        for item in value if many else [value]:
            if isinstance(item, int | float) and not rule.holds(item):
                what = f"every value of {key}" if many else key
                raise ConfigError(f"{what} must be {rule.text()} (got {value})")


@overload
def plain(value: Mapping[str, object]) -> JsonObject: ...
@overload
def plain(value: object) -> JsonValue: ...
def plain(value: object) -> JsonValue:
    """Enum members as their values, recursively: a resolved config stays plain JSON/YAML
    (``value`` holds nothing else: enums, mappings, sequences and JSON scalars)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return cast("JsonValue", value)  # a JSON scalar
