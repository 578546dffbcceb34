"""The experiment config: a structured omegaconf schema, presets, dotlist overrides and validation.

It lives in ``clients`` (the bottom of the import graph) because every layer reads it.
:func:`resolve` validates a raw config against the omegaconf schema (``ExperimentConfig``) and
returns a frozen, typed :class:`Experiment`: every component a :class:`ChosenComponent` holding its name
and an instance of its ``Params`` filled with its defaults. The framework reads attributes
(``experiment.attack.params.rounds``); the experiment becomes a plain dict (:meth:`Experiment.to_dict`)
only where it leaves the process: ``config.yaml`` (so it says exactly what ran), Flower's run
config and ConfigRecords (:func:`encode_config`, :func:`to_json`), Ray. A resolved experiment's
dict resolves again to the same experiment (the ServerApp re-resolves what the CLI sent;
a ClientApp types what the server sent with :func:`decode`).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import enum
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    OmegaConfBaseException,
    ValidationError,
)

from flowerbed.clients.core.capabilities import (
    alternatives,
    describe,
    fits,
    offered,
    supported_workloads,
)
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.params import check_rules, param, plain
from flowerbed.clients.core.plugins import FILE_MODULE_PREFIX, load_plugins, normalise
from flowerbed.clients.core.registry import BUILTIN, Registry
from flowerbed.clients.core.seeding import malicious_count
from flowerbed.clients.core.values import JsonObject, JsonValue


class Engine(enum.StrEnum):
    simulation = "simulation"
    inline = "inline"
    deployment = "deployment"


class Partitioner(enum.StrEnum):
    iid = "iid"
    dirichlet = "dirichlet"


@dataclass(frozen=True)
class ResourcesConfig:
    """What each client gets: Flower's client resources on the simulation engine (Ray actors);
    ``gpus > 0`` also puts workloads' tensors on CUDA (``Workload.device``) on every engine."""

    cpus: int = param(1, ge=1)
    gpus: float = param(0.0, ge=0)


@dataclass(frozen=True)
class ClientsConfig:
    num: int = param(10, ge=1)
    fraction: float = param(1.0, gt=0, le=1)
    #: share of clients evaluating each round; unset: the same as ``fraction``
    fraction_evaluate: float | None = param(None, ge=0, le=1)
    min_clients: int = param(2, ge=1)
    partitioner: Partitioner = Partitioner.iid
    alpha: float = param(0.5, gt=0, lt=float("inf"))
    partition_by: str | None = None  # a table column: clients = groups of its values
    failure_rate: float = param(0.0, ge=0, lt=1)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    #: how long the server waits for a round's replies; missing ones count as failures
    timeout_s: float = param(600.0, gt=0, lt=float("inf"))

    @property
    def least(self) -> int:
        """The fewest clients a round waits for: ``min_clients``, capped at ``num``."""
        return min(self.min_clients, self.num)

    def sampled(self, fraction: float | None = None) -> int:
        """Clients a round samples, by Flower's rule ``max(int(num * fraction), min_clients)``
        (:attr:`least`); ``fraction`` is ``self.fraction`` unless given."""
        share = self.fraction if fraction is None else fraction
        return max(int(self.num * share), self.least)


@dataclass(frozen=True)
class DatasetConfig:
    name: str = "adult"
    path: str | None = None
    label: str | None = None
    numeric: list[str] = field(default_factory=list)
    categorical: list[str] = field(default_factory=list)
    test_fraction: float = param(0.2, gt=0, lt=1)
    max_rows: int | None = param(None, ge=1)
    #: draw this many training rows with replacement (seed 0) from the training split (after
    #: max_rows; the test split is kept): a table for more clients than it has rows
    resample_rows: int | None = param(None, ge=1)


@dataclass
class ComponentConfig:
    name: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class MaliciousConfig:
    """Clients that lie (``flowerbed.clients.malicious``): which attack (``name``, its
    ``params``) and which clients run it, ``fraction`` of them drawn from the seed or the
    partition ids in ``clients`` (one of the two)."""

    name: str | None = None
    fraction: float | None = param(None, ge=0, lt=1)
    clients: list[int] = param(factory=list, ge=0)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClaimConfig:
    """The preset's headline: ``metric`` (a summary metric) must end ``above`` or ``below`` a
    bound (a number, another summary metric, or ``{metric, overrides}``: the metric of the same
    preset run with those overrides on top, an ablation arm), shifted by ``margin``.
    ``overrides`` are the small settings at which ``tests/test_preset_claims.py`` checks it on
    the inline engine (empty: ``test`` names the claim test that covers it); ``page`` is the
    method page that names the preset and the metric. ``hard`` (a reason) marks a preset whose
    headline does not hold at its own settings: its page documents it as a hard setting."""

    metric: str = ""
    above: Any = None
    below: Any = None
    margin: float = 0.0
    overrides: list[str] = field(default_factory=list)
    test: str = ""
    page: str = ""
    hard: str = ""


@dataclass(frozen=True)
class OutputConfig:
    """Where runs go (``dir/<time>-<experiment>`` unless ``--out`` names the run directory)."""

    dir: str = "runs"
    plots: bool = True
    #: rounds after which the global model is written to model.r<round>.pt (torch state dict)
    save_rounds: list[int] = field(default_factory=list)
    #: the overrides the run was started with, as typed (shown by ``show``, report.md and the
    #: plot titles; set by ``load_experiment``, never read by a run)
    overrides: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DeploymentConfig:
    """Where the ``deployment`` engine submits: a loopback federation dir or any SuperLink."""

    dir: str = ".flowerbed/deploy"
    superlink: str | None = None
    root_certificates: str | None = None
    insecure: bool = False
    #: how long a ServerApp waits for SuperNodes to connect before failing (seconds)
    node_timeout_s: float = param(120.0, gt=0, lt=float("inf"))


@dataclass(frozen=True)
class SimulationConfig:
    """Where the ``simulation`` engine's ClientApp actors run: a private local Ray instance
    (unset), or an existing Ray cluster (``auto``, ``HOST:PORT``), with ``clients.resources``
    per actor either way."""

    ray_address: str | None = None


@dataclass
class ExperimentConfig:
    experiment: str = "quickstart"
    description: str = ""
    seed: int = 0
    rounds: int = param(3, ge=1)
    engine: Engine = Engine.simulation
    clients: ClientsConfig = field(default_factory=ClientsConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    workload: ComponentConfig = field(default_factory=lambda: ComponentConfig("tabular-mlp"))
    strategy: ComponentConfig = field(default_factory=lambda: ComponentConfig("fedavg"))
    attack: ComponentConfig = field(default_factory=ComponentConfig)
    defenses: list[ComponentConfig] = field(default_factory=list)
    malicious: MaliciousConfig = field(default_factory=MaliciousConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig)
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    #: outside code every process imports first: module names or .py paths
    #: (``flowerbed.clients.core.plugins``); the resolved config adds the module of every component
    #: that came from outside flowerbed (an entry point), so each process can import it by name
    plugins: list[str] = field(default_factory=list)
    claim: ClaimConfig = field(default_factory=ClaimConfig)


@dataclass(frozen=True)
class ChosenComponent:
    """A configured component: its registered ``name`` and ``params``, an instance of its class's
    ``Params`` dataclass (built from the validated values, as the component receives it).

    An unset component (``attack``, ``malicious`` without a name) holds its params as given (a
    dict, normally empty); so do the sections of kinds a process has no registry for
    (:func:`decode` on a ClientApp: the strategy and the attack)."""

    name: str | None = None
    params: Any = None


@dataclass(frozen=True)
class Malicious:
    """Clients that lie (``MaliciousConfig``, typed like :class:`ChosenComponent`): which attack and who
    runs it, ``fraction`` of the clients drawn from the seed or the partition ids in ``clients``."""

    name: str | None = None
    fraction: float | None = None
    clients: tuple[int, ...] = ()
    params: Any = None


@dataclass(frozen=True)
class Experiment:
    """A resolved experiment: what :func:`resolve` returns, frozen; every framework module reads
    its attributes. Field order is ``ExperimentConfig``'s, so :meth:`to_dict` writes the same
    ``config.yaml`` and run config; ``clients.fraction_evaluate`` is always set. The sections
    without params are the schema's own frozen dataclasses (``ClientsConfig``, ...); their list
    fields stay lists, so omegaconf's one-line errors for them are unchanged."""

    experiment: str
    description: str
    seed: int
    rounds: int
    engine: Engine
    clients: ClientsConfig
    dataset: DatasetConfig
    workload: ChosenComponent
    strategy: ChosenComponent
    attack: ChosenComponent
    defenses: tuple[ChosenComponent, ...]
    malicious: Malicious
    output: OutputConfig
    deployment: DeploymentConfig
    simulation: SimulationConfig
    plugins: tuple[str, ...]
    claim: ClaimConfig

    def to_dict(self) -> JsonObject:
        """The plain nested dict (enums as values, sequences as lists) written to files and
        Flower's configs; :func:`resolve` (or :func:`decode`) turns it back into this experiment."""
        data: JsonObject = plain(dataclasses.asdict(self))
        return data

    def run_key(self) -> str:
        """The experiment without its output settings, as canonical JSON: the key of state a
        client keeps per experiment (a sweep's cells share a client's process and Context)."""
        return json.dumps(
            {k: v for k, v in self.to_dict().items() if k != "output"}, sort_keys=True
        )


T = TypeVar("T")


def replace_at(obj: T, path: str, **changes: object) -> T:
    """A copy of the frozen ``obj`` (an :class:`Experiment`) with ``changes`` made to the part at
    dotted ``path`` (``""``: ``obj`` itself; ``"clients.resources"``, ``"workload.params"``);
    nothing is validated again (:func:`resolve` does that)."""
    if not path:
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    head, _, rest = path.partition(".")
    part = replace_at(getattr(obj, head), rest, **changes)
    return dataclasses.replace(obj, **{head: part})  # type: ignore[type-var]


def configs_dir() -> Path:
    """The presets folder: ``configs/`` at the project root, installed as ``flowerbed.configs``."""
    return Path(str(resources.files("flowerbed.configs")))


def preset_names() -> list[str]:
    return sorted(p.stem for p in (configs_dir() / "experiments").glob("*.yaml"))


def _one_line(exc: OmegaConfBaseException, where: str) -> str:
    key = getattr(exc, "full_key", None) or ""
    key = f"{where}.{key}" if where and key else (key or where)
    if isinstance(exc, ConfigKeyError | ConfigAttributeError):
        obj_type = getattr(exc, "object_type", None)
        allowed = ""
        if obj_type is not None and dataclasses.is_dataclass(obj_type):
            allowed = f" (allowed: {', '.join(f.name for f in dataclasses.fields(obj_type))})"
        return f"unknown key '{key}'{allowed}"
    if isinstance(exc, ValidationError):
        first = str(exc).splitlines()[0]
        choice = re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", first)
        if choice:
            return f"unknown value '{choice[1]}' for '{key}' (allowed: {choice[2]})"
        if "is not a ListConfig" in first:  # OmegaConf's words for "a scalar where a list goes"
            return (
                f"wrong type for '{key}': a list is required, e.g. {key.rsplit('.', 1)[-1]}: [a, b]"
            )
        return f"wrong type for '{key}': {first}"
    return f"invalid config at '{key}': {str(exc).splitlines()[0]}"


def validate_structured(schema: type[T], values: Mapping[str, object], where: str) -> T:
    """Merge ``values`` into the dataclass ``schema``; returns the dataclass instance."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), values)
        obj = cast(T, OmegaConf.to_object(merged))  # an instance of ``schema``
    except OmegaConfBaseException as exc:
        raise ConfigError(_one_line(exc, where)) from None
    check_rules(obj, where)
    return obj


def _mapping(node: DictConfig, resolve: bool = True) -> JsonObject:
    """``OmegaConf.to_container`` of a mapping node: a dict with string keys (omegaconf types
    what it returns as any container with any key type)."""
    return cast(JsonObject, OmegaConf.to_container(node, resolve=resolve))


def load_preset(name: str) -> JsonObject:
    path = configs_dir() / "experiments" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown experiment '{name}' (allowed: {', '.join(preset_names())})")
    loaded = OmegaConf.load(path)
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: the top level must be a mapping of config keys")
    data = _mapping(loaded)
    data.setdefault("experiment", name)
    return data


def preset_description(name: str) -> str:
    """The ``description`` a preset's file gives (without resolving it: ``flowerbed list``)."""
    return str(load_preset(name).get("description", ""))


def load_config_file(path: str | Path) -> JsonObject:
    """A YAML mapping from ``path``; every way a file can fail is one ``ConfigError`` line."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML: {problem}{where}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} could not be read: {exc}") from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(
            f"{path}: the top level must be a mapping of config keys (e.g. 'rounds: 5'), "
            f"not a {type(loaded).__name__.removesuffix('Config').lower()}"
        )
    if not loaded:
        raise ConfigError(
            f"{path} is empty: write the keys to change, e.g. copy "
            f"{configs_dir() / 'experiments' / 'quickstart.yaml'}"
        )
    try:
        return _mapping(loaded)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {str(exc).splitlines()[0]}") from None


def parse_overrides(overrides: list[str] | str | None) -> JsonObject:
    """Dotlist ``rounds=5 clients.num=100`` to a nested dict."""
    if not overrides:
        return {}
    if isinstance(overrides, str):
        overrides = overrides.split()
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"override '{bad[0]}' is not of the form key=value (e.g. rounds=5)")
    try:
        return _mapping(OmegaConf.from_dotlist(list(overrides)))
    except Exception as exc:  # noqa: BLE001 - omegaconf or YAML parse errors, shown on one line
        raise ConfigError(
            f"bad override ({str(exc).splitlines()[0]}); YAML values need a space after ':', "
            "e.g. 'defenses=[{name: topk, params: {fraction: 0.1}}]'"
        ) from None


@dataclass(frozen=True)
class Components:
    """The registries a config is validated against.

    The core layer cannot import the layers above it, so whoever sees them all (the server layer,
    ``flowerbed.server.experiment``) hands them in.
    """

    workloads: Registry
    datasets: Registry
    strategies: Registry
    attacks: Registry
    defenses: Registry
    #: malicious clients (``flowerbed.clients.malicious.MALICIOUS``); None: none can be configured
    malicious: Registry | None = None


#: Shared config keys a workload may or may not honour; set for a workload that ignores them is an
#: error (``Workload.reads``).
OPTIONAL_KEYS = ("dataset", "clients.partitioner", "clients.alpha", "clients.partition_by")


def resolve(base: JsonObject, overrides: JsonObject | None, components: Components) -> Experiment:
    """Validate a raw config (preset + overrides) into a typed :class:`Experiment`, every
    component's params filled with its defaults."""
    raws = [base, overrides or {}]
    if any(_is_set(raw, "clients.cpus") for raw in raws):
        raise ConfigError(
            "clients.cpus moved to clients.resources.cpus (clients.resources: cpus, gpus)"
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ExperimentConfig), base, overrides or {})
        schema: ExperimentConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        raise ConfigError(_one_line(exc, "")) from None
    check_rules(schema, "")
    clients = schema.clients
    num, least = clients.num, clients.min_clients
    if least > num and any(_is_set(raw, "clients.min_clients") for raw in raws):
        raise ConfigError(  # Flower would wait for clients that never come; never cap it silently
            f"clients.min_clients={least} above clients.num={num} (allowed: 1..{num})"
        )
    plugins = normalise(schema.plugins)
    load_plugins(plugins)
    if clients.fraction_evaluate is None:
        clients = dataclasses.replace(clients, fraction_evaluate=clients.fraction)
    components.datasets.get(schema.dataset.name)
    workload_cls, workload = _component(schema.workload, "workload", components.workloads)
    _check_reads(workload, workload_cls, raws, components.workloads)
    strategy_cls, strategy = _component(schema.strategy, "strategy", components.strategies)
    _check_strategy_clients(strategy, strategy_cls, clients)
    _check_withheld(strategy, strategy_cls, schema.defenses, components.defenses)
    offers = offered(workload_cls, workload.params)
    _check_needs("strategy", strategy, strategy_cls, workload, offers, components.workloads)
    if schema.attack.params and not schema.attack.name:  # else kept, and never read by anything
        raise ConfigError(
            "attack.params set without attack.name "
            f"(allowed: {', '.join(components.attacks.names())})"
        )
    attack = ChosenComponent(None, schema.attack.params)
    if schema.attack.name:
        attack_cls, attack = _component(schema.attack, "attack", components.attacks)
        _check_needs("attack", attack, attack_cls, workload, offers, components.workloads)
        _check_attacked(attack, schema.rounds, num)
    defenses = []
    for i, section in enumerate(schema.defenses):
        cls, defense = _component(section, f"defenses.{i}", components.defenses, required=False)
        defenses.append(defense)
        _check_needs("defense", defense, cls, workload, offers, components.workloads)
    malicious = _check_malicious(schema.malicious, num, workload, offers, components)
    experiment = Experiment(
        experiment=schema.experiment, description=schema.description, seed=schema.seed,
        rounds=schema.rounds, engine=schema.engine, clients=clients, dataset=schema.dataset,
        workload=workload, strategy=strategy, attack=attack, defenses=tuple(defenses),
        malicious=malicious, output=schema.output, deployment=schema.deployment,
        simulation=schema.simulation, plugins=tuple(plugins), claim=schema.claim,
    )  # fmt: skip
    return dataclasses.replace(experiment, plugins=_outside_modules(experiment, components))


def _check_malicious(
    section: MaliciousConfig, num: int, workload: ChosenComponent,
    offers: tuple[set[str], dict[str, str]], components: Components,
) -> Malicious:  # fmt: skip
    """A malicious-client attack: its params, what it needs of the workload, and who runs it
    (a fraction or a list, never both; ids that exist; at least one client unless fraction=0)."""
    name, fraction, listed = section.name, section.fraction, section.clients
    registry = components.malicious
    if not name:
        if fraction is not None or listed or section.params:
            raise ConfigError(
                "malicious.fraction/clients/params set without malicious.name "
                f"(allowed: {', '.join(registry.names()) if registry else 'none'})"
            )
        return Malicious(name, fraction, tuple(listed), section.params)
    if registry is None:
        raise ConfigError("malicious clients are not available here (no malicious registry)")
    cls, typed = _component(section, "malicious", registry)
    _check_needs("malicious", typed, cls, workload, offers, components.workloads)
    if (fraction is None) == (not listed):
        raise ConfigError(
            "malicious: give exactly one of fraction (a share of the clients, drawn from the "
            "seed, e.g. 0.2) and clients (partition ids, e.g. [0, 3])"
        )
    outside = [c for c in listed if not 0 <= c < num]
    if outside:
        raise ConfigError(
            f"malicious.clients {outside} outside 0..{num - 1} (clients.num={num}): never "
            f"malicious (allowed: partition ids 0..{num - 1})"
        )
    if fraction is not None and fraction > 0 and malicious_count(num, fraction) == 0:
        raise ConfigError(
            f"malicious.fraction={fraction:g} of clients.num={num} rounds to 0 malicious clients "
            f"(allowed: 0, or >= {0.5 / num:.3g}; or list them in malicious.clients)"
        )
    return Malicious(name, fraction, tuple(listed), typed.params)


def _outside_modules(experiment: Experiment, components: Components) -> tuple[str, ...]:
    """``plugins`` plus the module of each component that came from outside flowerbed (an
    installed package's entry point), so every process imports it by name: a Ray worker or a
    container that has the module but not the package's metadata still finds it."""
    used: list[tuple[Registry | None, str | None]] = [
        (components.datasets, experiment.dataset.name),
        (components.workloads, experiment.workload.name),
        (components.strategies, experiment.strategy.name),
        (components.attacks, experiment.attack.name),
        *((components.defenses, d.name) for d in experiment.defenses),
        (components.malicious, experiment.malicious.name),
    ]
    plugins = list(experiment.plugins)
    for registry, name in used:
        if registry is None or not name or registry.origin(name) == BUILTIN:
            continue
        module = registry.get(name).__module__
        if module != "__main__" and not module.startswith(FILE_MODULE_PREFIX):
            if module not in plugins:
                plugins.append(module)
    return tuple(plugins)


def _check_attacked(attack: ChosenComponent, rounds: int, num: int) -> None:
    """Attacked rounds and target clients must exist, else they are silently never attacked."""
    attacked = getattr(attack.params, "rounds", None) or []
    outside = [r for r in attacked if not 1 <= r <= rounds]
    if outside:
        raise ConfigError(
            f"attack.params.rounds {outside} outside 1..{rounds} (rounds={rounds}): never attacked "
            f"(allowed: rounds 1..{rounds}; empty = every round)"
        )
    targets = [t for t in getattr(attack.params, "target_clients", None) or [] if not 0 <= t < num]
    if targets:
        raise ConfigError(
            f"attack.params.target_clients {targets} outside 0..{num - 1} (clients.num={num}): "
            f"never attacked (allowed: partition ids 0..{num - 1})"
        )


@functools.cache
def _schema_defaults() -> JsonObject:
    """Every shared key at its schema default (built once; read only)."""
    return _mapping(OmegaConf.structured(ExperimentConfig), resolve=False)


def _is_set(raw: JsonObject, dotted: str) -> bool:
    """The key is present with a value other than the schema default.

    A resolved config carries every key (at its default when nobody set it), so it resolves again
    unchanged (the ServerApp re-resolves what the CLI sent).
    """
    node: JsonValue = raw
    default: JsonValue = _schema_defaults()
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
        default = default.get(part) if isinstance(default, dict) else None
    if isinstance(node, dict) and isinstance(default, dict):
        return any(k not in default or value != default[k] for k, value in node.items())
    return node is not None and node != default


def _check_reads(
    workload: ChosenComponent, workload_cls: type, raws: list[JsonObject], workloads: Registry
) -> None:
    """A shared key set for a workload that ignores it is an error, not a silent no-op."""
    reads = set(getattr(workload_cls, "reads", ()))
    for key in OPTIONAL_KEYS:
        if key not in reads and any(_is_set(raw, key) for raw in raws):
            users = [n for n, c in workloads.items() if key in getattr(c, "reads", ())]
            raise ConfigError(
                f"workload '{workload.name}' does not use {key}; remove it "
                f"(workloads that do: {', '.join(users) or 'none'})"
            )


def _check_withheld(
    strategy: ChosenComponent,
    strategy_cls: type,
    defenses: list[ComponentConfig],
    registry: Registry,
) -> None:
    """The strategy needs what a configured defense withholds from the server (secure aggregation
    hides the individual updates a robust aggregator needs): refused, naming both."""
    needs = getattr(strategy_cls, "needs", ())
    for defense in defenses:
        withheld = set(getattr(registry.get(defense.name), "withholds", ()))  # type: ignore[arg-type]
        if withheld and all(alt & withheld for alt in alternatives(needs)):
            raise ConfigError(
                f"strategy '{strategy.name}' needs {describe(needs)}, which defense "
                f"'{defense.name}' withholds from the server; use one or the other"
            )


def _check_strategy_clients(
    strategy: ChosenComponent, strategy_cls: type, clients: ClientsConfig
) -> None:
    """A strategy whose rule needs a number of replies per round (Krum: n >= 2f+3) gets it from
    the clients a round samples (:meth:`ClientsConfig.sampled`, Flower's rule)."""
    check = getattr(strategy_cls, "fits_clients", None)
    if check is None:
        return
    sampled = clients.sampled()
    why = check(strategy.params, sampled)
    if why:
        raise ConfigError(
            f"strategy '{strategy.name}': {why}, but a round samples {sampled} "
            f"(clients.num={clients.num}, clients.fraction={clients.fraction})"
        )


def _check_needs(
    kind: str, component: ChosenComponent, cls: type, workload: ChosenComponent,
    offers: tuple[set[str], dict[str, str]], workloads: Registry,
) -> None:  # fmt: skip
    """A strategy, attack or defense runs only on a workload that offers what one of its
    alternatives needs
    (``offers`` = what the workload offers under its params, and why it withholds the rest)."""
    needs = getattr(cls, "needs", ())
    available, withheld = offers
    if fits(needs, available):
        return
    reasons = [why for cap, why in sorted(withheld.items()) if fits(needs, available | {cap})]
    where = f" here ({'; '.join(reasons)})" if reasons else ""
    fitting = supported_workloads(needs, workloads.items())
    alts = alternatives(needs)
    what = describe(alts[0] - available) if len(alts) == 1 else describe(needs)
    raise ConfigError(
        f"{kind} '{component.name}' needs {what}, which workload '{workload.name}' does not offer"
        f"{where} (workloads that do: {', '.join(fitting) or 'none'})"
    )


def _component(
    section: ComponentConfig | MaliciousConfig,
    where: str,
    registry: Registry,
    required: bool = True,
) -> tuple[type, ChosenComponent]:
    """The registered class of a config section and the section typed: its params validated
    against the class's ``Params`` (``ConfigError`` naming ``where``) and filled with defaults."""
    if required and not section.name:
        raise ConfigError(f"{where}.name is required (allowed: {', '.join(registry.names())})")
    cls = registry.get(section.name or "")
    params = validate_structured(cls.Params, section.params, f"{where}.params")
    return cls, ChosenComponent(section.name, typed_params(cls, plain(dataclasses.asdict(params))))


def typed_params(cls: type, values: Mapping[str, object]) -> object:
    """``cls.Params`` from its validated plain values, as every component has received it."""
    return cls.Params(**values)  # type: ignore[attr-defined]


def load_base(name_or_path: str) -> JsonObject:
    """The raw (unresolved) config of a preset name or a YAML path."""
    if name_or_path.endswith((".yaml", ".yml")):
        base = load_config_file(name_or_path)
        base.setdefault("experiment", Path(name_or_path).stem)
        return base
    if "/" in name_or_path or Path(name_or_path).is_file():
        raise ConfigError(
            f"'{name_or_path}' is neither a preset nor a .yaml/.yml file "
            f"(presets: {', '.join(preset_names())})"
        )
    return load_preset(name_or_path)


def load_experiment(
    name_or_path: str,
    overrides: list[str] | str | None,
    components: Components,
    **forced: JsonValue,
) -> Experiment:
    """Preset name (or YAML path) + dotlist overrides (+ forced values) -> resolved experiment.

    ``forced`` values (CLI options) are merged key by key over the overrides, so
    ``--superlink`` keeps a ``deployment.insecure=true`` given beside it.
    """
    base = load_base(name_or_path)
    extra = parse_overrides(overrides)
    merge_into(extra, {k: v for k, v in forced.items() if v is not None})
    experiment = resolve(base, extra, components)
    typed = overrides.split() if isinstance(overrides, str) else list(overrides or [])
    if typed:
        output = dataclasses.replace(experiment.output, overrides=[str(o) for o in typed])
        experiment = dataclasses.replace(experiment, output=output)
    return experiment


def merge_into(into: JsonObject, extra: JsonObject) -> None:
    """Deep-merge ``extra`` into ``into`` (mappings merged key by key, anything else replaced)."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge_into(cast(JsonObject, into[key]), value)
        else:
            into[key] = copy.deepcopy(value)


# ---- the serialisation boundary: files, Flower's run config and ConfigRecords, Ray ----------


def decode(
    data: JsonObject, *, workloads: Registry | None = None, defenses: Registry | None = None,
    malicious: Registry | None = None, strategies: Registry | None = None,
    attacks: Registry | None = None,
) -> Experiment:  # fmt: skip
    """A resolved experiment's dict (:meth:`Experiment.to_dict`, read back from JSON) typed again
    without the checks of :func:`resolve`: what a ClientApp does with the experiment the server
    sent (its plugins imported first), and the CLI with the one its pre-flight child resolved. A
    kind without a registry here (a ClientApp has no strategies or attacks; the CLI none) keeps
    its params as the plain dict, read by nobody in that process and serialised unchanged."""
    try:
        schema: ExperimentConfig = OmegaConf.to_object(  # type: ignore[assignment]
            OmegaConf.merge(OmegaConf.structured(ExperimentConfig), data)
        )
    except OmegaConfBaseException as exc:
        raise ConfigError(_one_line(exc, "")) from None
    if any(r is not None for r in (workloads, defenses, malicious, strategies, attacks)):
        load_plugins(schema.plugins)

    def component(section: ComponentConfig, registry: Registry | None) -> ChosenComponent:
        if registry is None or not section.name:
            return ChosenComponent(section.name, section.params)
        return ChosenComponent(
            section.name, typed_params(registry.get(section.name), section.params)
        )

    bad = schema.malicious
    return Experiment(
        experiment=schema.experiment, description=schema.description, seed=schema.seed,
        rounds=schema.rounds, engine=schema.engine, clients=schema.clients,
        dataset=schema.dataset, workload=component(schema.workload, workloads),
        strategy=component(schema.strategy, strategies),
        attack=component(schema.attack, attacks),
        defenses=tuple(component(d, defenses) for d in schema.defenses),
        malicious=Malicious(
            bad.name, bad.fraction, tuple(bad.clients),
            component(ComponentConfig(bad.name, bad.params), malicious).params,
        ),
        output=schema.output, deployment=schema.deployment, simulation=schema.simulation,
        plugins=tuple(schema.plugins), claim=schema.claim,
    )  # fmt: skip


def encode_config(experiment: Experiment) -> str:
    """Base64 JSON: survives Flower's flat, TOML-quoted run config on any transport."""
    return base64.b64encode(to_json(experiment).encode()).decode()


def decode_config(encoded: str) -> JsonObject:
    """The dict :func:`encode_config` encoded (to be resolved again)."""
    data: JsonObject = json.loads(base64.b64decode(encoded.encode()).decode())
    return data


def to_json(experiment: Experiment) -> str:
    return json.dumps(experiment.to_dict(), sort_keys=True)


def to_yaml(experiment: Experiment | JsonObject) -> str:
    """``config.yaml``'s text of an experiment (or of its :meth:`~Experiment.to_dict`)."""
    data = experiment.to_dict() if isinstance(experiment, Experiment) else experiment
    return OmegaConf.to_yaml(OmegaConf.create(data))
