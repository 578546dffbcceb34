"""Content fingerprints of the files a config refers to, for caches keyed on a config.

A cache keyed on the config text alone would keep serving a table that was rewritten at the same
path; keys built with :func:`content_key` change when any referenced file's bytes change.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from flowerbed.clients.core.values import JsonObject

#: sections whose string values may name input files (``dataset.path``, ``workload.params.*``)
INPUT_SECTIONS = ("dataset", "workload", "strategy", "attack", "defenses")


def referenced_files(cfg: Mapping[str, object]) -> list[Path]:
    """Every existing file named by a string value in the config's input sections, sorted."""
    found: set[Path] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)
        elif isinstance(value, str) and value and ("/" in value or "." in value):
            path = Path(value).expanduser()
            if path.is_file():
                found.add(path.resolve())

    for section in INPUT_SECTIONS:
        walk(cfg.get(section))
    return sorted(found)


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes (cached per path, size and modification time)."""
    stat = path.stat()
    return _digest(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def content_key(cfg: Mapping[str, object]) -> str:
    """``cfg`` as canonical JSON plus the digest of every file it references."""
    digests = {str(p): file_digest(p) for p in referenced_files(cfg)}
    return json.dumps({"cfg": cfg, "files": digests}, sort_keys=True, default=os.fspath)


# ---- files that travel with a config to machines without the driver's filesystem --------------

#: run-config key naming the Ray actor that holds a run's input files (simulation on a cluster)
FILE_STORE_KEY = "ray-files"
#: config keys that name an input file; a Ray worker gets the file's bytes, not the path
SHIPPED_KEYS = ("dataset.path", "workload.params.table_path")


def dotted_get(cfg: Mapping[str, object], dotted: str, default: object = None) -> object:
    """``cfg["a"]["b"]`` for ``"a.b"``; ``default`` where a part is missing."""
    node: object = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def shipped_files(cfg: Mapping[str, object]) -> list[str]:
    """The paths in ``cfg`` (:data:`SHIPPED_KEYS`, plugin files) that name a file on this machine."""
    from flowerbed.clients.core.plugins import is_path

    paths = [dotted_get(cfg, key) for key in SHIPPED_KEYS]
    paths += [p for p in cast(list[str], cfg.get("plugins", [])) if is_path(p)]
    return [p for p in paths if isinstance(p, str) and p and Path(p).is_file()]


def _write_once(local: Path, data: bytes) -> None:
    """``data`` at ``local`` unless already there, written whole (another process may read it)."""
    if not local.is_file():
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(f".{local.name}.{os.getpid()}.tmp")
        partial.write_bytes(data)
        os.replace(partial, local)


def localise(cfg: JsonObject, files: dict[str, bytes], into: Path) -> JsonObject:
    """A copy of ``cfg`` whose file paths point at private copies of the shipped ``files``.

    Each copy keeps its file name (formats are chosen by suffix; errors name the file). A copy
    already in ``into`` is kept: callers name ``into`` after the files' content.
    """
    cfg = copy.deepcopy(cfg)
    plugins = cast(list[str], cfg.get("plugins", []))
    for i, spec in enumerate(plugins):
        if spec in files:  # a plugin file: same name, so the same module (content hash)
            local = into / "plugins" / str(i) / Path(spec).name
            _write_once(local, files[spec])
            plugins[i] = str(local)
    for i, key in enumerate(SHIPPED_KEYS):
        path = dotted_get(cfg, key)
        if isinstance(path, str) and path in files:
            local = into / "files" / str(i) / Path(path).name
            _write_once(local, files[path])
            *parents, last = key.split(".")
            node = cfg
            for part in parents:
                node = cast(JsonObject, node[part])
            node[last] = str(local)
    return cfg
