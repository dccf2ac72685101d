"""Shared pieces of the command line: the output, which cache roots a command looks
at, argument types with their units, and how numbers are shown."""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass

from .. import _env
from ..cache import maintenance
from ..config import Config
from ._out import Out

__all__ = [
    "EXIT_ERROR",
    "EXIT_FINDINGS",
    "EXIT_OK",
    "CliError",
    "Finding",
    "Roots",
    "age_text",
    "ago",
    "cache_roots",
    "config_for",
    "layout_findings",
    "parse_age",
    "parse_size",
    "positive_int",
    "show_findings",
    "size_text",
]

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class CliError(Exception):
    """A usage or environment error the command reports as ``error: …`` (exit 2)."""

    def __init__(self, message: str, *more: str) -> None:
        super().__init__(message)
        self.more = more


def config_for(cache_dir: str | None, **changes: object) -> Config:
    """``Config.from_env()``, with ``--cache-dir`` and the given fields (None: unchanged)."""
    cfg = Config.from_env()
    if cache_dir is not None:
        changes["cache_dirs"] = (cache_dir,)
    changes = {k: v for k, v in changes.items() if v not in (None, (), [])}
    return cfg.replace(**changes) if changes else cfg


@dataclass(frozen=True, slots=True)
class Finding:
    """Something wrong found in a cache: ``kind`` is ``layout`` (an entry where a
    directory should be), ``leaf`` (a leaf that does not verify or cannot be read) or
    ``usage`` (a usage record); ``reason`` a stable label (a ``Miss`` value, or
    ``usage``); ``detail`` for people; ``fixed`` what ``--fix`` did (``quarantined``,
    ``removed``), empty when nothing."""

    kind: str
    path: str
    reason: str
    detail: str
    id: str = ""
    fixed: str = ""

    def as_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "path": self.path,
            "id": self.id or None,
            "reason": self.reason,
            "detail": self.detail,
            "fixed": self.fixed or None,
        }


def layout_findings(root: str) -> list[Finding]:
    """What stands where the cache wants a directory (``maintenance.damaged``)."""
    return [Finding("layout", path, "damaged", why) for path, why in maintenance.damaged(root)]


def show_findings(out: Out, findings: list[Finding]) -> None:
    """One ``FAIL <path>: <reason>: <detail>`` line per finding (on stdout: they are the
    command's result), the leaf's id and what ``--fix`` did after it."""
    for f in findings:
        tail = [(f" [id {f.id}]", "dim")] if f.id else []
        tail += [(f" ({f.fixed})", "warn")] if f.fixed else []
        out.line(("FAIL", "bad"), f" {f.path}: {f.reason}: {f.detail}", *tail)


@dataclass(frozen=True, slots=True)
class Roots:
    """The cache roots a command looks at (real directories, as given), and the
    per-user default when it does not exist yet (no cache there, nothing to show)."""

    dirs: tuple[str, ...]
    missing_default: str | None = None


def cache_roots(cache_dir: str | None) -> Roots:
    """``--cache-dir``, else ``SAFEJIT_CACHE_DIRS``, else the per-user default. A root
    that was named (by the option or the variable) must be a directory: a typo in a
    cron job's ``verify`` is an error (exit 2), never "0/0 leaves verify"."""
    named: tuple[str, ...]
    if cache_dir is not None:
        named, origin = (cache_dir,), "--cache-dir"
    else:
        cfg = Config.from_env()
        named, origin = cfg.cache_dirs, "SAFEJIT_CACHE_DIRS"
        if not named:
            default = cfg.resolved_cache_dirs()[0]
            return Roots((default,)) if os.path.isdir(default) else Roots((), missing_default=default)
    for path in named:
        real = os.path.expanduser(path)
        if not os.path.exists(real):
            raise CliError(f"{origin} {path}: no such directory")
        if not os.path.isdir(real):
            raise CliError(f"{origin} {path}: not a directory")
    return Roots(tuple(os.path.expanduser(p) for p in named))


# -- argument types (argparse calls them; their errors name the accepted forms) ---
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(text: str) -> int:
    """``500M``, ``2G``, ``1024`` (bytes; k/M/G/T are powers of 1024)."""
    try:
        return _env.parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (a number of bytes, or with a unit: 512k, 500M, 10G, 1T)"
        ) from None


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``, ``3600`` (seconds)."""
    t = text.strip().lower()
    unit = t[-1:] if t[-1:] in _AGE_UNITS else ""
    try:
        value = float(t[: len(t) - len(unit)]) * _AGE_UNITS.get(unit, 1)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"not an age: {text!r} (a non-negative number with a unit: s, m, h, d or w, e.g. 30d; plain = seconds)"
        )
    return value


def directory(text: str) -> str:
    """A directory's path, never empty: ``--cache-dir "$CACHE"`` with the variable unset
    must not mean the default cache (a cron job's ``prune`` would empty it)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset variable?)")
    return text


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    try:
        value = int(text, 10)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r} (at least 1)")
    return value


# -- how numbers are shown ----------------------------------------------------------
def age_text(seconds: float) -> str:
    """``3d``, ``5h``, ``12m``, ``40s`` (rounded down)."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def size_text(n: int) -> str:
    """``512 B``, ``16.2 KiB``, ``3.0 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # (not reached)


def ago(mtime: float) -> str:
    return age_text(time.time() - mtime)
