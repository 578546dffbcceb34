"""Content fingerprints of the files a config refers to, for caches keyed on a config.

A cache keyed on the config text alone would keep serving a table that was rewritten at the same
path; keys built with :func:`content_key` change when any referenced file's bytes change.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

#: sections whose string values may name input files (``dataset.path``, ``workload.params.*``)
INPUT_SECTIONS = ("dataset", "workload", "strategy", "attack", "defenses")


def referenced_files(cfg: dict[str, Any]) -> list[Path]:
    """Every existing file named by a string value in the config's input sections, sorted."""
    found: set[Path] = set()

    def walk(value: Any) -> None:
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


def content_key(cfg: dict[str, Any]) -> str:
    """``cfg`` as canonical JSON plus the digest of every file it references."""
    digests = {str(p): file_digest(p) for p in referenced_files(cfg)}
    return json.dumps({"cfg": cfg, "files": digests}, sort_keys=True, default=os.fspath)
