"""The arguments of ``Runtime.compile``/``build``/``explain``, checked as ``Config``
checks its fields: a bare string where a sequence of strings belongs, a non-mapping
``defines``/``extras`` — each a :class:`ConfigError` naming the argument. (An unknown
keyword is Python's own TypeError, which names it: a ``**`` catch-all on ``compile``
would cost every memory hit a dict.)

``compile`` calls this on the slow path only (the first compile of a request, or
when building the request failed): an invalid request is never stored, so it never
reaches the memory tier, and a memory hit pays nothing for the checks::

    check_arguments("compile", include_dirs="/opt/x")
    # ConfigError: compile(include_dirs=...) must be a tuple or list of strings, not
    # the single str '/opt/x'; pass ('/opt/x',)
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from typing import Any, Final

from .errors import ConfigError
from .spec import Source

__all__ = ["argument_error", "check_arguments"]

_VALUES: Final = (str, int, float, bool)


def check_arguments(
    call: str,
    source: Any,
    *,
    include_dirs: Any = (),
    defines: Any = None,
    flags: Any = (),
    extras: Any = None,
    arch: Any = None,
    name_expressions: Any = (),
) -> None:
    """Raise :class:`ConfigError` naming the first argument of ``call`` that is wrong."""
    if not isinstance(source, Source):
        raise ConfigError(f"{call}(source) must be a safejit.Source, got {type(source).__name__}", argument="source")
    _strings(call, "include_dirs", include_dirs, paths=True)
    _strings(call, "flags", flags)
    _strings(call, "name_expressions", name_expressions)
    _mapping(call, "defines", defines, none_ok=True)
    _mapping(call, "extras", extras, none_ok=False)
    if arch is not None and not isinstance(arch, str):
        raise ConfigError(f"{call}(arch=...) must be a str or None, got {type(arch).__name__}", argument="arch")


def argument_error(call: str, source: Any, **arguments: Any) -> ConfigError:
    """The error for a request that could not be made into a cache key: the argument at
    fault, else what could not be hashed."""
    try:
        check_arguments(call, source, **arguments)
    except ConfigError as exc:
        return exc
    for name, value in arguments.items():
        items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (tuple, list)) else ()
        for item in items:
            try:
                hash(item)
            except TypeError:
                return ConfigError(
                    f"{call}({name}=...) holds {type(item).__name__} {item!r:.60}: its values must be str, int, "
                    "float or bool",
                    argument=name,
                )
    return ConfigError(f"{call}(): the source and arguments must be hashable values (str, int, float, bool)")


def _strings(call: str, name: str, value: Any, *, paths: bool = False) -> None:
    """The sequence itself; its items are the resolver's and the flag policy's to judge
    (a flag that is no string is a FlagPolicyError, counted as a policy violation)."""
    if type(value) in (tuple, list):  # (what nearly every call passes: no ABC checks, ~50 us in a new process)
        return
    what = "paths" if paths else "strings"
    if isinstance(value, (str, bytes, os.PathLike)):
        raise ConfigError(
            f"{call}({name}=...) must be a tuple or list of {what}, not the single {type(value).__name__} "
            f"{value!r}; pass ({value!r},)",
            argument=name,
        )
    if not isinstance(value, Iterable) or isinstance(value, Mapping):
        raise ConfigError(
            f"{call}({name}=...) must be a tuple or list of {what}, got {type(value).__name__}", argument=name
        )


def _mapping(call: str, name: str, value: Any, *, none_ok: bool) -> None:
    if value is None:
        return
    if type(value) is not dict and not isinstance(value, Mapping):
        raise ConfigError(
            f"{call}({name}=...) must be a mapping (a dict of name to value), got {type(value).__name__}",
            argument=name,
        )
    for key, item in value.items():
        if not isinstance(key, str):
            raise ConfigError(f"{call}({name}=...) has the key {key!r}: names must be str", argument=name)
        if not (isinstance(item, _VALUES) or (none_ok and item is None)):
            allowed = "str, int, float, bool" + (" or None" if none_ok else "")
            raise ConfigError(
                f"{call}({name}=...)[{key!r}] must be {allowed}, got {type(item).__name__}", argument=name
            )
        if isinstance(item, float) and not math.isfinite(item):
            # (written "nan", "inf": a name in C, not a number; and a NaN, equal to no other,
            # missed the memory tier on every call, each adding an entry)
            raise ConfigError(
                f"{call}({name}=...)[{key!r}] is {item!r}, not a finite number (give the text meant as a str)",
                argument=name,
            )
