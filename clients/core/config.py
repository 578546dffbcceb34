"""The experiment config: a structured omegaconf schema, presets, dotlist overrides and validation.

It lives in ``clients`` (the bottom of the import graph) because every layer reads it. A resolved
config is a plain nested dict: every component's ``params`` filled with its defaults, so the
``config.yaml`` of a run says exactly what ran.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import enum
import functools
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

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


class Engine(enum.StrEnum):
    simulation = "simulation"
    inline = "inline"
    deployment = "deployment"


class Partitioner(enum.StrEnum):
    iid = "iid"
    dirichlet = "dirichlet"


@dataclass
class ResourcesConfig:
    """What each client gets: Flower's client resources on the simulation engine (Ray actors);
    ``gpus > 0`` also puts workloads' tensors on CUDA (``Workload.device``) on every engine."""

    cpus: int = param(1, ge=1)
    gpus: float = param(0.0, ge=0)


@dataclass
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


@dataclass
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


@dataclass
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


@dataclass
class OutputConfig:
    """Where runs go (``dir/<time>-<experiment>`` unless ``--out`` names the run directory)."""

    dir: str = "runs"
    plots: bool = True
    #: rounds after which the global model is written to model.r<round>.pt (torch state dict)
    save_rounds: list[int] = field(default_factory=list)
    #: the overrides the run was started with, as typed (shown by ``show``, report.md and the
    #: plot titles; set by ``load_experiment``, never read by a run)
    overrides: list[str] = field(default_factory=list)


@dataclass
class DeploymentConfig:
    """Where the ``deployment`` engine submits: a loopback federation dir or any SuperLink."""

    dir: str = ".flowerbed/deploy"
    superlink: str | None = None
    root_certificates: str | None = None
    insecure: bool = False
    #: how long a ServerApp waits for SuperNodes to connect before failing (seconds)
    node_timeout_s: float = param(120.0, gt=0, lt=float("inf"))


@dataclass
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


def validate_structured(schema: type, values: dict[str, Any], where: str) -> Any:
    """Merge ``values`` into the dataclass ``schema``; returns the dataclass instance."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), values)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(_one_line(exc, where)) from None
    check_rules(obj, where)
    return obj


def load_preset(name: str) -> dict[str, Any]:
    path = configs_dir() / "experiments" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown experiment '{name}' (allowed: {', '.join(preset_names())})")
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    data.setdefault("experiment", name)
    return data


def load_config_file(path: str | Path) -> dict[str, Any]:
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
        return OmegaConf.to_container(loaded, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {str(exc).splitlines()[0]}") from None


def parse_overrides(overrides: list[str] | str | None) -> dict[str, Any]:
    """Dotlist ``rounds=5 clients.num=100`` to a nested dict."""
    if not overrides:
        return {}
    if isinstance(overrides, str):
        overrides = overrides.split()
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"override '{bad[0]}' is not of the form key=value (e.g. rounds=5)")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(list(overrides)), resolve=True)
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


def resolve(
    base: dict[str, Any], overrides: dict[str, Any] | None, components: Components
) -> dict[str, Any]:
    """Validate a raw config (preset + overrides) and fill every component's params."""
    if any(_is_set(raw, "clients.cpus") for raw in (base, overrides or {})):
        raise ConfigError(
            "clients.cpus moved to clients.resources.cpus (clients.resources: cpus, gpus)"
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ExperimentConfig), base, overrides or {})
        experiment = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(_one_line(exc, "")) from None
    check_rules(experiment, "")
    cfg: dict[str, Any] = plain(dataclasses.asdict(experiment))
    num, least = cfg["clients"]["num"], cfg["clients"]["min_clients"]
    if least > num and any(_is_set(raw, "clients.min_clients") for raw in (base, overrides or {})):
        raise ConfigError(  # Flower would wait for clients that never come; never cap it silently
            f"clients.min_clients={least} above clients.num={num} (allowed: 1..{num})"
        )
    cfg["plugins"] = normalise(cfg["plugins"])
    load_plugins(cfg["plugins"])
    if cfg["clients"]["fraction_evaluate"] is None:
        cfg["clients"]["fraction_evaluate"] = cfg["clients"]["fraction"]
    components.datasets.get(cfg["dataset"]["name"])
    workload_cls = _fill_params(cfg, "workload", components.workloads)
    _check_reads(cfg, workload_cls, [base, overrides or {}], components.workloads)
    strategy_cls = _fill_params(cfg, "strategy", components.strategies)
    _check_strategy_clients(cfg, strategy_cls)
    _check_withheld(cfg, strategy_cls, components.defenses)
    offers = offered(workload_cls, cfg["workload"]["params"])
    _check_needs(
        "strategy", cfg["strategy"]["name"], strategy_cls, cfg, offers, components.workloads
    )
    if cfg["attack"]["name"]:
        attack_cls = _fill_params(cfg, "attack", components.attacks)
        _check_needs("attack", cfg["attack"]["name"], attack_cls, cfg, offers, components.workloads)
        _check_attacked(cfg)
    for i, defense in enumerate(cfg["defenses"]):
        cls = components.defenses.get(defense["name"] or "")
        params = validate_structured(cls.Params, defense["params"], f"defenses.{i}.params")
        defense["params"] = plain(dataclasses.asdict(params))
        _check_needs("defense", defense["name"], cls, cfg, offers, components.workloads)
    _check_malicious(cfg, offers, components)
    _record_outside_modules(cfg, components)
    return cfg


def _check_malicious(
    cfg: dict[str, Any], offers: tuple[set[str], dict[str, str]], components: Components
) -> None:
    """A malicious-client attack: its params, what it needs of the workload, and who runs it
    (a fraction or a list, never both; ids that exist; at least one client unless fraction=0)."""
    section = cfg["malicious"]
    name, fraction, listed = section["name"], section["fraction"], section["clients"]
    registry = components.malicious
    if not name:
        if fraction is not None or listed or section["params"]:
            raise ConfigError(
                "malicious.fraction/clients/params set without malicious.name "
                f"(allowed: {', '.join(registry.names()) if registry else 'none'})"
            )
        return
    if registry is None:
        raise ConfigError("malicious clients are not available here (no malicious registry)")
    cls = _fill_params(cfg, "malicious", registry)
    _check_needs("malicious", name, cls, cfg, offers, components.workloads)
    num = cfg["clients"]["num"]
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


def _record_outside_modules(cfg: dict[str, Any], components: Components) -> None:
    """Add to ``cfg["plugins"]`` the module of each component that came from outside flowerbed
    (an installed package's entry point), so every process imports it by name: a Ray worker or a
    container that has the module but not the package's metadata still finds it."""
    used = [
        (components.datasets, cfg["dataset"]["name"]),
        (components.workloads, cfg["workload"]["name"]),
        (components.strategies, cfg["strategy"]["name"]),
        *([(components.attacks, cfg["attack"]["name"])] if cfg["attack"]["name"] else []),
        *((components.defenses, d["name"]) for d in cfg["defenses"]),
        *(
            [(components.malicious, cfg["malicious"]["name"])]
            if components.malicious is not None and cfg["malicious"]["name"]
            else []
        ),
    ]
    for registry, name in used:
        if registry.origin(name) == BUILTIN:
            continue
        module = registry.get(name).__module__
        if module != "__main__" and not module.startswith(FILE_MODULE_PREFIX):
            if module not in cfg["plugins"]:
                cfg["plugins"].append(module)


def _check_attacked(cfg: dict[str, Any]) -> None:
    """Attacked rounds and target clients must exist, else they are silently never attacked."""
    params, rounds, num = cfg["attack"]["params"], cfg["rounds"], cfg["clients"]["num"]
    outside = [r for r in params.get("rounds") or [] if not 1 <= r <= rounds]
    if outside:
        raise ConfigError(
            f"attack.params.rounds {outside} outside 1..{rounds} (rounds={rounds}): never attacked "
            f"(allowed: rounds 1..{rounds}; empty = every round)"
        )
    targets = [t for t in params.get("target_clients") or [] if not 0 <= t < num]
    if targets:
        raise ConfigError(
            f"attack.params.target_clients {targets} outside 0..{num - 1} (clients.num={num}): "
            f"never attacked (allowed: partition ids 0..{num - 1})"
        )


_UNSET = object()


@functools.cache
def _schema_defaults() -> dict[str, Any]:
    """Every shared key at its schema default (built once; read only)."""
    return OmegaConf.to_container(OmegaConf.structured(ExperimentConfig))  # type: ignore[return-value]


def _is_set(raw: dict[str, Any], dotted: str) -> bool:
    """The key is present with a value other than the schema default.

    A resolved config carries every key (at its default when nobody set it), so it resolves again
    unchanged (the ServerApp re-resolves what the CLI sent).
    """
    node: Any = raw
    default: Any = _schema_defaults()
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
        default = default.get(part) if isinstance(default, dict) else None
    if isinstance(node, dict) and isinstance(default, dict):
        return any(k not in default or value != default[k] for k, value in node.items())
    return node is not None and node != default


def _check_reads(
    cfg: dict[str, Any], workload_cls: type, raws: list[dict[str, Any]], workloads: Registry
) -> None:
    """A shared key set for a workload that ignores it is an error, not a silent no-op."""
    reads = set(getattr(workload_cls, "reads", ()))
    for key in OPTIONAL_KEYS:
        if key not in reads and any(_is_set(raw, key) for raw in raws):
            users = [n for n, c in workloads.items() if key in getattr(c, "reads", ())]
            raise ConfigError(
                f"workload '{cfg['workload']['name']}' does not use {key}; remove it "
                f"(workloads that do: {', '.join(users) or 'none'})"
            )


def _check_withheld(cfg: dict[str, Any], strategy_cls: type, defenses: Registry) -> None:
    """The strategy needs what a configured defense withholds from the server (secure aggregation
    hides the individual updates a robust aggregator needs): refused, naming both."""
    needs = getattr(strategy_cls, "needs", ())
    for defense in cfg["defenses"]:
        withheld = set(getattr(defenses.get(defense["name"]), "withholds", ()))
        if withheld and all(alt & withheld for alt in alternatives(needs)):
            raise ConfigError(
                f"strategy '{cfg['strategy']['name']}' needs {describe(needs)}, which defense "
                f"'{defense['name']}' withholds from the server; use one or the other"
            )


def _check_strategy_clients(cfg: dict[str, Any], strategy_cls: type) -> None:
    """A strategy whose rule needs a number of replies per round (Krum: n >= 2f+3) gets it from
    the clients a round samples (Flower's rule: ``max(int(num * fraction), min_clients)``)."""
    check = getattr(strategy_cls, "fits_clients", None)
    if check is None:
        return
    clients = cfg["clients"]
    num = int(clients["num"])
    sampled = max(int(num * clients["fraction"]), min(int(clients["min_clients"]), num))
    why = check(strategy_cls.Params(**cfg["strategy"]["params"]), sampled)
    if why:
        raise ConfigError(
            f"strategy '{cfg['strategy']['name']}': {why}, but a round samples {sampled} "
            f"(clients.num={num}, clients.fraction={clients['fraction']})"
        )


def _check_needs(
    kind: str, name: str, cls: type, cfg: dict[str, Any], offers: tuple[set[str], dict[str, str]],
    workloads: Registry,
) -> None:  # fmt: skip
    """A strategy, attack or defense runs only on a workload that offers what one of its
    alternatives needs
    (``offers`` = what the workload offers under its params, and why it withholds the rest)."""
    needs = getattr(cls, "needs", ())
    available, withheld = offers
    if fits(needs, available):
        return
    workload = cfg["workload"]["name"]
    reasons = [why for cap, why in sorted(withheld.items()) if fits(needs, available | {cap})]
    where = f" here ({'; '.join(reasons)})" if reasons else ""
    fitting = supported_workloads(needs, workloads.items())
    alts = alternatives(needs)
    what = describe(alts[0] - available) if len(alts) == 1 else describe(needs)
    raise ConfigError(
        f"{kind} '{name}' needs {what}, which workload '{workload}' does not offer"
        f"{where} (workloads that do: {', '.join(fitting) or 'none'})"
    )


def _fill_params(cfg: dict[str, Any], section: str, registry: Registry) -> type:
    name = cfg[section]["name"]
    if not name:
        raise ConfigError(f"{section}.name is required (allowed: {', '.join(registry.names())})")
    cls = registry.get(name)
    params = validate_structured(cls.Params, cfg[section]["params"], f"{section}.params")
    cfg[section]["params"] = plain(dataclasses.asdict(params))
    return cls


def load_base(name_or_path: str) -> dict[str, Any]:
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
    **forced: Any,
) -> dict[str, Any]:
    """Preset name (or YAML path) + dotlist overrides (+ forced values) -> resolved config dict.

    ``forced`` values (CLI options) are merged key by key over the overrides, so
    ``--superlink`` keeps a ``deployment.insecure=true`` given beside it.
    """
    base = load_base(name_or_path)
    extra = parse_overrides(overrides)
    merge_into(extra, {k: v for k, v in forced.items() if v is not None})
    cfg = resolve(base, extra, components)
    typed = overrides.split() if isinstance(overrides, str) else list(overrides or [])
    if typed:
        cfg["output"]["overrides"] = [str(o) for o in typed]
    return cfg


def merge_into(into: dict[str, Any], extra: dict[str, Any]) -> None:
    """Deep-merge ``extra`` into ``into`` (mappings merged key by key, anything else replaced)."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge_into(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def encode_config(cfg: dict[str, Any]) -> str:
    """Base64 JSON: survives Flower's flat, TOML-quoted run config on any transport."""
    return base64.b64encode(to_json(cfg).encode()).decode()


def decode_config(encoded: str) -> dict[str, Any]:
    return json.loads(base64.b64decode(encoded.encode()).decode())


def to_json(cfg: dict[str, Any]) -> str:
    return json.dumps(cfg, sort_keys=True)


def to_yaml(cfg: dict[str, Any]) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(cfg))
