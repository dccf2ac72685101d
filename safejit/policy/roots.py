"""Declared roots and strict path confinement.

A path is confined when its fully resolved form (symlinks followed, must
exist) lies under one of the resolved declared roots. ``..`` that escapes,
symlinks that point outside and absolute paths elsewhere all fail with
:class:`~safejit.errors.PathConfinementError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..closure.anchors import LINK_ANCHOR, Anchors, is_under, real_path
from ..closure.depfiles import UNLISTABLE
from ..errors import ConfigError, PathConfinementError

__all__ = ["anchors_of", "build_anchors", "confine", "resolve_root"]


def resolve_root(root: str) -> str:
    """A declared source root, resolved now (symlinks followed, through the kernel);
    :class:`ConfigError` when it does not exist or is no directory."""
    expanded = os.path.expanduser(root)
    try:
        real = real_path(expanded, strict=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"source root {root!r} does not exist ({getattr(exc, 'strerror', None) or exc}); "
            "fix Config.source_roots (or SAFEJIT_SOURCE_ROOTS)",
            path=root,
        ) from None
    if not os.path.isdir(real):
        raise ConfigError(f"source root {root!r} is not a directory", path=root)
    return real


def overlaps(source_roots: Iterable[str], private: Iterable[tuple[str, str]]) -> list[str]:
    """What is wrong, in words, where a source root holds or lies in one of the ``private``
    places (``(what, path)``: the cache roots, the private state dir): a compiler reads
    all under its roots, so its tenants' sources could read every tenant's cached builds
    (or learn which exist: a build key can be computed) and this user's private state."""
    source_roots = list(source_roots)
    if not source_roots:  # (none: nothing to resolve, at each Runtime's set-up)
        return []
    places = []
    for what, path in private:
        expanded = os.path.abspath(os.path.expanduser(path))
        places += [(what, path, expanded), (what, path, real_path(expanded))]
    found: dict[str, None] = {}
    for root in source_roots:
        real = real_path(os.path.abspath(os.path.expanduser(root)))
        for what, path, place in places:
            if is_under(place, real) or is_under(real, place):
                verb = "holds" if is_under(place, real) else "lies in"
                found[f"source root {root!r} {verb} the {what} {path!r}"] = None
    return list(found)


def anchors_of(
    source_roots: Iterable[str],
    toolchain_roots: Iterable[str],
    cache_roots: Iterable[str] = (),
    link_roots: Iterable[str] = (),
) -> Anchors:
    """Anchors ``s<i>`` (``source_roots``, already resolved: :func:`resolve_root`),
    ``t<i>`` (toolchain), ``c<i>`` (cache), ``l<i>`` (where the linker finds libraries:
    see :data:`LINK_ANCHOR`). Missing toolchain, cache and link roots are skipped."""
    named = {f"s{i}": root for i, root in enumerate(source_roots)}
    for prefix, roots in (("t", toolchain_roots), ("c", cache_roots), (LINK_ANCHOR, link_roots)):
        for i, root in enumerate(roots):
            try:
                named[f"{prefix}{i}"] = real_path(os.path.expanduser(root), strict=True)
            except OSError:
                continue
    return Anchors(named)


def build_anchors(
    source_roots: Iterable[str],
    toolchain_roots: Iterable[str],
    cache_roots: Iterable[str] = (),
    link_roots: Iterable[str] = (),
) -> Anchors:
    """:func:`anchors_of` with the source roots resolved now."""
    return anchors_of([resolve_root(r) for r in source_roots], toolchain_roots, cache_roots, link_roots)


def confine(path: str, anchors: Anchors, *, what: str, allow: Iterable[str] | None = None) -> str:
    """The resolved ``path`` if it lies under a root (of ``allow`` anchors when given,
    else of any but the linker's), else :class:`PathConfinementError`. An error about a
    path outside the roots says only that: not whether it exists, nor where it led."""
    if not isinstance(path, str) or "\0" in path:
        raise PathConfinementError(f"{what} path contains NUL", path=str(path))
    try:
        expanded = os.path.expanduser(path)
        real = os.path.realpath(expanded)
        os.fsencode(real)
    except (OSError, ValueError, UnicodeError):
        raise PathConfinementError(f"{what} {path!r} is not a usable path", path=path) from None
    names = set(allow) if allow is not None else None
    for name, root in anchors.roots.items():
        if (name in names if names is not None else not name.startswith(LINK_ANCHOR)) and is_under(real, root):
            if not os.path.exists(real):
                raise PathConfinementError(f"{what} {path!r} does not exist", path=path)
            if UNLISTABLE.search(real):
                # (what gcc writes raw in its depfile: a line break splits a name, a
                # backslash reads as an escape; a file read under it would go unrecorded)
                raise PathConfinementError(
                    f"{what} {path!r} holds a control character or a backslash, which no compiler's "
                    "list of the files it read can carry",
                    path=path,
                )
            return real
    raise PathConfinementError(
        f"{what} {path!r} is outside the declared roots; declare its directory in Config.source_roots "
        "(or SAFEJIT_SOURCE_ROOTS)",
        path=path,
    )
