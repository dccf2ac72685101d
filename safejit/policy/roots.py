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
from ..errors import PathConfinementError

__all__ = ["build_anchors", "confine"]


def build_anchors(
    source_roots: Iterable[str],
    toolchain_roots: Iterable[str],
    cache_roots: Iterable[str] = (),
    link_roots: Iterable[str] = (),
) -> Anchors:
    """Anchors ``s<i>`` (source roots), ``t<i>`` (toolchain), ``c<i>`` (cache), ``l<i>``
    (where the linker finds libraries: see :data:`LINK_ANCHOR`).

    Missing source roots are refused; missing toolchain roots are skipped.
    """
    named: dict[str, str] = {}
    for i, root in enumerate(source_roots):
        try:
            named[f"s{i}"] = real_path(os.path.expanduser(root), strict=True)
        except OSError as exc:
            raise PathConfinementError(f"source root {root!r} does not exist: {exc}", path=root) from exc
    for prefix, roots in (("t", toolchain_roots), ("c", cache_roots), (LINK_ANCHOR, link_roots)):
        for i, root in enumerate(roots):
            try:
                named[f"{prefix}{i}"] = real_path(os.path.expanduser(root), strict=True)
            except OSError:
                continue
    return Anchors(named)


def confine(path: str, anchors: Anchors, *, what: str, allow: Iterable[str] | None = None) -> str:
    """The resolved ``path`` if it lies under a root (of ``allow`` anchors when given,
    else of any but the linker's), else :class:`PathConfinementError`."""
    if "\0" in path:
        raise PathConfinementError(f"{what} path contains NUL", path=path)
    try:
        real = os.path.realpath(os.path.expanduser(path), strict=True)
    except OSError as exc:
        raise PathConfinementError(f"{what} {path!r} cannot be resolved: {exc.strerror}", path=path) from exc
    names = set(allow) if allow is not None else None
    for name, root in anchors.roots.items():
        if (name in names if names is not None else not name.startswith(LINK_ANCHOR)) and is_under(real, root):
            return real
    raise PathConfinementError(
        f"{what} {path!r} resolves to {real!r}, outside every declared root", path=path, resolved=real
    )
