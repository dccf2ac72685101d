"""Named fault-injection points, for safejit's tests and users' own fault runs.

Enable with ``SAFEJIT_FAULTS="point=action[@probability][;...]"`` or::

    with safejit.faults.inject("disk.rename", "raise:EROFS"):
        rt.compile(src)

Actions: ``raise:ENOSPC`` / ``raise:EIO`` / ``raise:EROFS`` / ``raise:ETIMEDOUT`` /
``raise:ECONNREFUSED`` (an ``OSError`` with that errno; the last two are for the
``remote.*`` points), ``crash`` (the process dies at once, as under SIGKILL),
``delay:SECONDS``, ``corrupt`` (bytes written at the point are damaged).
When nothing is enabled a point costs one flag check.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

from . import _env, _forksafe
from .errors import ConfigError

__all__ = ["ACTIONS", "POINTS", "inject", "mangle", "point", "reset"]

POINTS: Final = frozenset(
    {
        "disk.write",
        "disk.fsync",
        "disk.rename",
        "disk.read",
        "publish.before_commit",
        "publish.before_rename",
        "publish.after_rename",
        "compiler.spawn",
        "lock.acquire",
        "load",
        "remote.connect",
        "remote.get",
        "remote.put",
        "remote.lease",
    }
)
ACTIONS: Final = (
    "raise:ENOSPC",
    "raise:EIO",
    "raise:EROFS",
    "raise:ETIMEDOUT",
    "raise:ECONNREFUSED",
    "crash",
    "delay:SECONDS",
    "corrupt",
)
_ERRNOS: Final = {
    "ENOSPC": errno.ENOSPC,
    "EIO": errno.EIO,
    "EROFS": errno.EROFS,
    "ETIMEDOUT": errno.ETIMEDOUT,
    "ECONNREFUSED": errno.ECONNREFUSED,
}


@dataclass(frozen=True, slots=True)
class _Rule:
    kind: str  # raise | crash | delay | corrupt
    arg: float | int = 0
    probability: float = 1.0


_lock = _forksafe.Lock()
_rules: dict[str, list[_Rule]] = {}
_enabled = False


def parse_action(text: str) -> _Rule:
    body, _, prob_text = text.partition("@")
    try:
        prob = float(prob_text) if prob_text else 1.0
    except ValueError:
        raise ConfigError(f"fault probability {prob_text!r} is not a number") from None
    if not 0.0 <= prob <= 1.0:
        raise ConfigError(f"fault probability {prob} is outside [0, 1]")
    kind, _, arg = body.partition(":")
    if kind == "raise" and arg in _ERRNOS:
        return _Rule("raise", _ERRNOS[arg], prob)
    if kind == "delay":
        try:
            return _Rule("delay", float(arg), prob)
        except ValueError:
            raise ConfigError(f"fault delay {arg!r} is not a number") from None
    if kind in ("crash", "corrupt") and not arg:
        return _Rule(kind, 0, prob)
    raise ConfigError(f"unknown fault action {text!r}; expected one of {ACTIONS}")


def _parse_spec(spec: str) -> dict[str, list[_Rule]]:
    rules: dict[str, list[_Rule]] = {}
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        name, sep, action = item.partition("=")
        if not sep or name not in POINTS:
            raise ConfigError(f"SAFEJIT_FAULTS item {item!r}: expected point=action with point in {sorted(POINTS)}")
        rules.setdefault(name, []).append(parse_action(action))
    return rules


def _set(rules: dict[str, list[_Rule]]) -> None:
    global _enabled, _rules
    _rules = rules
    _enabled = bool(rules)


def reset() -> None:
    """Disable every fault (and forget ``SAFEJIT_FAULTS``)."""
    global _pending
    with _lock:
        _pending = None
        _set({})


def _current() -> dict[str, list[_Rule]]:
    """The rules, ``SAFEJIT_FAULTS`` parsed on first need: a bad value never breaks
    ``import safejit``; it is an error, naming the variable, where faults are used."""
    global _pending
    if _pending is not None:
        with _lock:
            spec, _pending = _pending, None
            if spec is not None:
                try:
                    parsed = _parse_spec(spec)
                except ConfigError as exc:
                    _pending = spec  # (every use says so, not only the first)
                    raise ConfigError(f"SAFEJIT_FAULTS={spec!r}: {exc}", variable="SAFEJIT_FAULTS") from None
                merged = {k: [*parsed.get(k, []), *_rules.get(k, [])] for k in {*parsed, *_rules}}
                _set(merged)
    return _rules


def _matching(name: str, kinds: tuple[str, ...]) -> _Rule | None:
    for rule in _current().get(name, ()):
        if rule.kind in kinds and (rule.probability >= 1.0 or random.random() < rule.probability):
            return rule
    return None


def point(name: str) -> None:
    """Fire the fault configured at ``name``, if any."""
    if not _enabled:
        return
    rule = _matching(name, ("raise", "crash", "delay"))
    if rule is None:
        return
    if rule.kind == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if rule.kind == "delay":
        time.sleep(float(rule.arg))
        return
    code = int(rule.arg)
    raise OSError(code, f"{os.strerror(code)} (injected at {name})")


def mangle(name: str, data: bytes) -> bytes:
    """``data``, damaged when a ``corrupt`` fault is set at ``name``."""
    if not _enabled or not data or _matching(name, ("corrupt",)) is None:
        return data
    buf = bytearray(data)
    for i in range(0, len(buf), max(1, len(buf) // 8)):
        buf[i] ^= 0xFF
    return bytes(buf)


@contextmanager
def inject(name: str, action: str) -> Iterator[None]:
    """Enable one fault for the duration of the block (this process only)."""
    if name not in POINTS:
        raise ConfigError(f"unknown fault point {name!r}; expected one of {sorted(POINTS)}")
    rule = parse_action(action)
    _current()
    with _lock:
        saved = {k: list(v) for k, v in _rules.items()}
        new = {k: list(v) for k, v in _rules.items()}
        new.setdefault(name, []).append(rule)
        _set(new)
    try:
        yield
    finally:
        with _lock:
            _set(saved)


#: ``SAFEJIT_FAULTS`` as set at import, until it is first needed (see :func:`_current`).
_pending: str | None = _env.faults_spec() or None
_enabled = _pending is not None
