"""Arrays built once per machine and memory-mapped by every process that needs them.

A deployed federation starts a process per message (Flower's ``flwr-clientapp``, or a child
forked by ``flowerbed superexec``) on every node; each would rebuild the same encoded table.
With ``$FLOWERBED_CACHE_DIR`` set (``flowerbed deploy up`` and ``flowerbed superexec`` set it),
the first process builds it under a file lock and writes ``.npy`` files; every other process,
of any node on the machine, maps them (copy-on-write: one copy in the page cache, shared).

The cache key is the caller's key plus the content of the files its result depends on (the
code that computes it, the data it reads), so neither an edited table nor edited code reads a
stale entry. Without the variable nothing is written anywhere and :func:`cached_arrays` just
builds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar, cast

import numpy as np

from flowerbed.clients.core.files import file_digest
from flowerbed.clients.core.values import JsonObject

#: the JSON metadata an entry's ``build`` returns (a ``TypedDict`` of the caller's)
M = TypeVar("M", bound=Mapping[str, object])

CACHE_ENV = "FLOWERBED_CACHE_DIR"
_META = "meta.json"


def cache_dir() -> Path | None:
    """``$FLOWERBED_CACHE_DIR``, or None (no disk cache)."""
    value = os.environ.get(CACHE_ENV, "")
    return Path(value) if value else None


def entry_name(kind: str, key: str, depends_on: Iterable[Path]) -> str:
    """The directory name of one entry: ``kind`` and the digest of the key and the files."""
    digest = hashlib.sha256(key.encode())
    for path in sorted(Path(p).resolve() for p in depends_on):
        digest.update(b"\0" + str(path).encode() + b"\0" + file_digest(path).encode())
    return f"{kind}-{digest.hexdigest()[:32]}"


def cached_arrays(
    kind: str,
    key: str,
    depends_on: Iterable[Path],
    build: Callable[[], tuple[dict[str, np.ndarray], M]],
) -> tuple[dict[str, np.ndarray], M]:
    """``build()``'s ``(arrays, JSON metadata)``, from the machine's cache when it holds them.

    Arrays come back memory-mapped copy-on-write (writable; a write stays in this process).
    One process builds an entry while the others wait on its lock; a failed build leaves
    nothing behind, and the next caller builds again.
    """
    root = cache_dir()
    if root is None:
        return build()
    root.mkdir(parents=True, exist_ok=True)
    entry = root / entry_name(kind, key, depends_on)
    if not (entry / _META).is_file():
        with open(root / f".{entry.name}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not (entry / _META).is_file():
                _write(entry, *build())
    arrays, meta = _read(entry)
    return arrays, cast(M, meta)  # the metadata ``build`` returned, read back from JSON


def _write(entry: Path, arrays: dict[str, np.ndarray], meta: Mapping[str, object]) -> None:
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for name, array in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(array), allow_pickle=False)
        (tmp / _META).write_text(json.dumps({"arrays": sorted(arrays), "meta": meta}))
        shutil.rmtree(entry, ignore_errors=True)  # an entry without its metadata is no entry
        os.replace(tmp, entry)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)


def _read(entry: Path) -> tuple[dict[str, np.ndarray], JsonObject]:
    saved = json.loads((entry / _META).read_text())
    return {name: _load(entry / f"{name}.npy") for name in saved["arrays"]}, saved["meta"]


def _load(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="c", allow_pickle=False)
    except ValueError:  # an empty array has no pages to map
        return np.load(path, allow_pickle=False)
