"""Outside code a config names: ``plugins: [a.module, ./my_method.py]``.

Every process imports a config's plugins before it resolves or uses the config (the CLI and the
ServerApp in :func:`flowerbed.clients.core.config.resolve`, every ClientApp in
``flowerbed.clients.runtime``, every run in ``flowerbed.server.runner``), so what they register
is there on every engine. An entry is a dotted module name (importable where the run goes:
installed, or on ``PYTHONPATH``) or the path of a ``.py`` file (relative paths are resolved
against the working directory when the config is resolved; the resolved config holds the absolute
path). A file is imported as a module named after its stem and content hash, so a copy at another
path (a Ray worker's) is the same module, and importing it twice does nothing.

Installed packages need no ``plugins`` entry: their entry points are found by the registries.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path

from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.registry import loading

#: module-name prefix of plugins imported from a file
FILE_MODULE_PREFIX = "flowerbed_plugin_"
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_loaded: set[str] = set()


def is_path(spec: str) -> bool:
    """A file (``./x.py``, ``/a/b.py``) rather than a module name."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def normalise(specs: Iterable[str]) -> list[str]:
    """Module names as given, paths made absolute; a malformed entry is a ``ConfigError``."""
    out = []
    for spec in specs:
        spec = str(spec).strip()
        if is_path(spec):
            spec = str(Path(spec).expanduser().resolve())
        elif not _MODULE.fullmatch(spec):
            raise ConfigError(
                f"plugin '{spec}' is neither a module name (a.module) nor a .py file path"
            )
        if spec not in out:
            out.append(spec)
    return out


def load_plugins(specs: Iterable[str]) -> None:
    """Import every plugin (each once per process); registrations record ``plugin SPEC``."""
    for spec in specs:
        if spec not in _loaded:
            _load(spec)
            _loaded.add(spec)


def file_module_name(path: Path) -> str:
    """``flowerbed_plugin_<stem>_<sha256 of the content>``: the same file is the same module."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", path.stem)
    return f"{FILE_MODULE_PREFIX}{stem}_{digest}"


def _load(spec: str) -> None:
    with loading(f"plugin {spec}"):
        if not is_path(spec):
            try:
                importlib.import_module(spec)
            except ModuleNotFoundError as exc:
                raise ConfigError(
                    f"plugin '{spec}' could not be imported ({exc}): install it, put it on "
                    "PYTHONPATH, or name its .py file"
                ) from None
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - the plug-in's own bug, named in one line
                raise ConfigError(import_failure(f"plugin '{spec}'", exc)) from None
            return
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"plugin file not found: {spec} (plugins: module names or .py files)")
        name = file_module_name(path)
        if name in sys.modules:
            return
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ConfigError(f"plugin file {spec} cannot be imported (is it a .py file?)")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except SyntaxError as exc:
            del sys.modules[name]
            raise ConfigError(
                f"plugin file {spec}: SyntaxError at line {exc.lineno}: {exc.msg}"
            ) from None
        except ConfigError:
            del sys.modules[name]
            raise
        except Exception as exc:  # noqa: BLE001 - the plug-in's own bug, named in one line
            del sys.modules[name]
            raise ConfigError(import_failure(f"plugin file {spec}", exc, path)) from None
        except BaseException:
            del sys.modules[name]
            raise


def import_failure(what: str, exc: Exception, path: Path | None = None) -> str:
    """``plugin file X raised RuntimeError at import (line 3): boom`` (the line in the plug-in's
    own file where the traceback leaves it)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if path is not None and Path(f.filename) == path] or frames[-1:]
    where = f" (line {own[-1].lineno} of {Path(own[-1].filename).name})" if own else ""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (
        f"{what} raised {type(exc).__name__} at import{where}: {message} (fix the plug-in or "
        "remove it from plugins)"
    )
