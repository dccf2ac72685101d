"""Key completeness: every file the compiler read lies under a declared root."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..deps import Anchors, Dep, hash_file
from ..errors import LimitExceededError, UndeclaredDependencyError
from .roots import is_under

__all__ = ["record_closure"]

DepState = tuple[str, tuple[int, int, int, int, int], str]


def record_closure(
    paths: Sequence[str], anchors: Anchors, *, max_deps: int, started_ns: int
) -> tuple[list[Dep], list[DepState], list[str]]:
    """Anchor and hash the closure the compiler reported.

    Returns the deps, their stat states, and the paths that changed while the
    compiler ran (ctime after ``started_ns``): such a build must not be published.
    Raises :class:`UndeclaredDependencyError` for a file outside every root.
    """
    if len(paths) > max_deps:
        raise LimitExceededError(f"{len(paths)} dependencies exceed the limit of {max_deps}", limit=max_deps)
    roots = list(anchors.roots.values())
    deps: list[Dep] = []
    states: list[DepState] = []
    too_new: list[str] = []
    dirs: dict[str, str] = {}
    for path in paths:
        head, tail = os.path.split(path)
        real_dir = dirs.get(head)
        if real_dir is None:
            real_dir = dirs[head] = os.path.realpath(head)
        real = os.path.join(real_dir, tail)
        if os.path.islink(real):
            real = os.path.realpath(real)
        if not any(is_under(real, r) for r in roots):
            raise UndeclaredDependencyError(
                f"the compiler read {path!r} ({real}), outside every declared root; declare it in Config.source_roots",
                path=path,
                resolved=real,
            )
        anchored = anchors.anchor(path) or anchors.anchor(real)
        if anchored is None:  # pragma: no cover - real is under a root, so it anchors
            raise UndeclaredDependencyError(f"{path!r} cannot be anchored", path=path)
        lexical = anchors.expand(*anchored) or real
        digest, snap = hash_file(lexical)
        if max(snap[3], snap[4]) > started_ns:
            too_new.append(lexical)
        deps.append(Dep(anchored[0], anchored[1], digest))
        states.append((lexical, snap, digest))
    return deps, states, too_new
