"""Usage records: each process writes its counters and compile latencies into
the cache root when its Runtime closes (or the process exits), so that
``safejit stats`` can show hit rates and latency percentiles across processes.

One file per process (``<root>/v1/usage/<tenant>/<host>-<pid>-<rand>.json``):
no two writers share a file, so no lock is needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..closure.hashing import read_file
from .layout import CacheLayout

__all__ = ["MAX_SAMPLES", "read_usage", "usage_name", "write_usage"]

MAX_SAMPLES = 2000


def usage_name() -> str:
    """A record name unique to one Runtime; rewriting it replaces the record."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"


def write_usage(
    root: str, tenant: str, name: str, backend: str, counters: Mapping[str, int], compile_seconds: Iterable[float]
) -> None:
    """Write (replace) this process's record. Raises ``OSError`` when it cannot."""
    directory = CacheLayout(root).usage_dir(tenant)
    data = {
        "backend": backend,
        "counters": dict(counters),
        "compile_seconds": [round(s, 6) for s in list(compile_seconds)[-MAX_SAMPLES:]],
    }
    tmp = os.path.join(directory, f".{name}.tmp")
    try:
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{name}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, os.path.join(directory, name))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _listing(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []


def read_usage(root: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(tenant, record)`` for every usage record under ``root``."""
    base = CacheLayout(root).usage
    try:
        with os.scandir(base) as it:
            tenants = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    for tenant in tenants:
        if not tenant.is_dir(follow_symlinks=False):
            continue
        for entry in _listing(tenant.path):
            if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                continue
            try:
                record = json.loads(read_file(entry.path)[0])  # (never blocks on a FIFO)
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and isinstance(record.get("counters"), dict):
                yield tenant.name, record
