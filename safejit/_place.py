"""Where a request's paths point: whether it names one from the process's working dir
or home (``inc``, ``~/lib``, ``-I=/inc``, a source read as ``k.c``), and that dir and
home themselves, which the memory tier's key then holds (``Runtime``): after a ``chdir``
the same request names other files."""

from __future__ import annotations

import os

from ._pipeline.resolve import Request
from .policy.flag_tables import FAMILIES

__all__ = ["placed", "where"]

#: Every compiler family's options whose value is a path (``-I``, ``-include``...).
_PATH_FLAGS = tuple({p for family in FAMILIES.values() for p in family.path_flags})


def placed(key: Request) -> bool:
    """Whether a request names a path from this process's working dir or home (``inc``,
    ``~/lib``, ``-I=/inc``, a source read as ``k.c``): then what it names depends on where
    the process is, which its memory key does not say. A path is judged as confinement
    judges it (absolute or not, as given); one of another type is taken for such a path
    (the resolver refuses it)."""
    origin = key[0][3]
    if origin is not None and not _absolute(origin):
        return True
    if not all(_absolute(d) for d in key[1]):
        return True
    after_path_flag = False
    for flag in key[3]:
        if after_path_flag:  # (``-I inc``: the path is the next argument)
            after_path_flag = False
            if not _absolute(flag):
                return True
        elif isinstance(flag, str) and flag.startswith(_PATH_FLAGS):
            prefix = max((p for p in _PATH_FLAGS if flag.startswith(p)), key=len)
            if flag == prefix:
                after_path_flag = True
            elif not _absolute(flag[len(prefix) :]):
                return True
    return False


def _absolute(path: object) -> bool:
    try:
        given = os.fspath(path)  # type: ignore[call-overload]
    except TypeError:
        return False
    return isinstance(given, str) and os.path.isabs(given)


def where() -> tuple[int, int, str] | object:
    """This process's working dir (the directory itself: a path given again to another
    dir is another place) and home, as a memory key's part."""
    try:
        st = os.stat(".")
    except OSError:  # (gone: a relative path resolves to nothing; never a hit)
        return object()
    return (st.st_dev, st.st_ino, os.path.expanduser("~"))
