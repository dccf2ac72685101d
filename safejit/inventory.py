"""Prewarm inventories: each distinct compile request, recorded portably.

With ``Config.inventory`` set, every request that reaches the compile path is
appended (once per process) as one JSON line whose paths are anchored
(``["s0", "include"]``), so ``safejit warm`` can replay it on another machine
or checkout with its own roots — e.g. to fill a shared cache before a cluster
job's ranks start.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from . import _forksafe
from .closure.anchors import Anchors
from .closure.hashing import digest_bytes
from .spec import BuildSpec

__all__ = ["InventoryWriter", "Request", "read_inventory"]

logger = logging.getLogger(__name__)

_VERSION = 1


@dataclass(frozen=True, slots=True)
class Request:
    """One replayable compile request."""

    data: dict[str, Any]

    @property
    def digest(self) -> str:
        return digest_bytes(json.dumps(self.data, sort_keys=True).encode())

    def roots_named(self) -> tuple[str, ...]:
        """The anchors (``s0``: the first declared source root, …) its include dirs, its
        quote dir and its flags name, in order, each once."""
        from .closure.anchors import _TOKEN

        d = self.data
        names = [a for a, _ in d["include_dirs"]]
        if d["quote_dir"] is not None:
            names.append(d["quote_dir"][0])
        names += [m.group(1) for f in d["flags"] for m in _TOKEN.finditer(f)]
        return tuple(dict.fromkeys(str(n) for n in names))

    def arguments(self, anchors: Anchors) -> dict[str, Any] | None:
        """``Runtime.build`` keyword arguments with anchors expanded; None when a
        root it names is not declared here."""
        d = self.data
        incs = [anchors.expand(a, rel) for a, rel in d["include_dirs"]]
        origin = None
        if d["quote_dir"] is not None:
            qdir = anchors.expand(*d["quote_dir"])
            origin = None if qdir is None else os.path.join(qdir, d["filename"])
            if origin is None:
                return None
        if any(p is None for p in incs):
            return None
        try:
            flags = [anchors.expand_text(f) for f in d["flags"]]
        except KeyError:
            return None
        from .spec import Source

        source = Source(d["code"], d["name"], filename=d["filename"], origin=origin)
        return {
            "source": source,
            "include_dirs": tuple(incs),
            "defines": dict(d["defines"]),
            "flags": tuple(flags),
            "extras": {k: json.loads(v) for k, v in d["extras"]},
            "arch": d["arch"],
        }


class InventoryWriter:
    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: set[str] = set()
        self._lock = _forksafe.Lock()

    def record(self, spec: BuildSpec, backend: str) -> None:
        data = {
            "v": _VERSION,
            "backend": backend,
            "tenant": spec.tenant,
            "name": spec.name,
            "filename": spec.filename,
            "code": spec.code.decode("utf-8"),
            "include_dirs": [list(a) for a in spec.include_dirs],
            "quote_dir": list(spec.quote_dir) if spec.quote_dir else None,
            "defines": [list(d) for d in spec.defines],
            "flags": list(spec.flags),
            "extras": [list(e) for e in spec.extras],
            "arch": spec.arch,
        }
        line = json.dumps(data, sort_keys=True)
        key = digest_bytes(line.encode())
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, (line + "\n").encode())  # one append: lines never interleave
            finally:
                os.close(fd)
        except OSError as exc:  # (a record, never the compile's failure; tried again next time)
            with self._lock:
                self._seen.discard(key)
            logger.warning("could not record %s in the inventory %s: %s", spec.name, self.path, exc)


def read_inventory(path: str, skipped: list[int] | None = None) -> Iterator[Request]:
    """Distinct, well-formed requests of an inventory file; the numbers of the lines that
    are none (malformed, or of another version) are appended to ``skipped``."""
    seen: set[str] = set()
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            try:
                data = json.loads(line)
            except ValueError:
                data = None
            if not isinstance(data, dict) or data.get("v") != _VERSION:
                if skipped is not None and line.strip():
                    skipped.append(number)
                continue
            request = Request(data)
            if request.digest not in seen:
                seen.add(request.digest)
                yield request
