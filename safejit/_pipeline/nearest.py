"""When no leaf has a request's build key: the other build of the same kernel whose
inputs differ least from the request's, and which of them differ (``Manifest.inputs``:
source, language, arch, flags, defines, include dirs, extras, environment, toolchain).
``Runtime.explain`` reports it; ``safejit explain`` shows it."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..cache import maintenance
from ..cache.leaf import Manifest, ManifestError
from ..closure.hashing import digest_bytes
from ..spec import BuildSpec

__all__ = ["MAX_MANIFESTS", "Difference", "Nearest", "differences", "nearest_build"]

#: The most manifests one search reads (a diagnostic's bound on a large cache).
MAX_MANIFESTS: Final = 4096

_TOKEN: Final = re.compile("\0([a-z][0-9]+)\0")


@dataclass(frozen=True, slots=True)
class Difference:
    """One input of the build key that differs: ``input`` is ``source``, ``language``,
    ``arch``, ``flags``, ``defines``, ``include_dirs``, ``extras``, ``env``,
    ``toolchain`` or ``other``; ``detail`` says how, for people (as the other build's
    manifest has it: unverified text, to be escaped where it is shown)."""

    input: str
    detail: str


@dataclass(frozen=True, slots=True)
class Nearest:
    """The other build of a kernel (same tenant and backend) whose inputs differ least
    from a request's, the newest of those: its leaf (``id``, ``leaf`` path, ``build_key``,
    ``created``, a Unix time) and what differs."""

    id: str
    leaf: str
    build_key: str
    created: float
    differs: tuple[Difference, ...]


def _shown(text: str | None) -> str:
    return "-" if text is None else _TOKEN.sub(lambda m: "{" + m.group(1) + "}", text)


def _pairs(
    what: str, label: str, here: Iterable[tuple[str, Any]], there: Iterable[tuple[str, Any]]
) -> list[Difference]:
    """Differences between two name → value listings (defines, extras, env)."""
    mine, theirs = dict(here), dict(there)
    found = []
    for name in sorted(mine.keys() | theirs.keys()):
        if name not in theirs:
            found.append(Difference(what, f"{label} {name}: here only"))
        elif name not in mine:
            found.append(Difference(what, f"{label} {name}: there only"))
        elif mine[name] != theirs[name]:
            if what == "env":  # (only digests are kept: the values are not shown)
                found.append(Difference(what, f"{label} {name}: its value differs"))
            else:
                found.append(
                    Difference(what, f"{label} {name}: {_shown(mine[name])} here, {_shown(theirs[name])} there")
                )
    return found


def _lists(what: str, label: str, here: Sequence[str], there: Sequence[str]) -> list[Difference]:
    """Differences between two ordered lists (flags, include dirs)."""
    if list(here) == list(there):
        return []
    found = [Difference(what, f"{label} {_shown(x)}: here only") for x in here if x not in there]
    found += [Difference(what, f"{label} {_shown(x)}: there only") for x in there if x not in here]
    return found or [Difference(what, f"the {label}s are in another order")]


def differences(spec: BuildSpec, man: Manifest) -> list[Difference]:
    """Which inputs of ``spec`` (a request, resolved) differ from those ``man`` was built with."""
    i = man.inputs
    if i is None:
        return [Difference("other", "the other build's inputs were not recorded (an older safejit built it)")]
    found = []
    if spec.source_digest != i.source_digest:
        found.append(Difference("source", "the source text differs"))
    if spec.language != i.language:
        found.append(Difference("language", f"language {spec.language} here, {i.language} there"))
    if spec.arch != i.arch:
        found.append(Difference("arch", f"arch {spec.arch or '-'} here, {i.arch or '-'} there"))
    found += _lists("flags", "flag", spec.flags, i.flags)
    found += _pairs("defines", "define", spec.defines, i.defines)
    incs = [f"{a}/{r}" for a, r in spec.include_dirs], [f"{a}/{r}" for a, r in i.include_dirs]
    found += _lists("include_dirs", "include dir", *incs)
    found += _pairs("extras", "extra", spec.extras, i.extras)
    # (the manifest keeps the environment's value digests, never the values)
    found += _pairs("env", "environment variable", [(n, digest_bytes(v.encode())) for n, v in spec.env], i.env)
    if spec.toolchain.digest != man.toolchain.get("digest"):
        versions = (
            (spec.toolchain.version.splitlines() or ["?"])[0],
            (man.toolchain.get("version", "").splitlines() or ["?"])[0],
        )
        found.append(Difference("toolchain", f"the toolchain differs: {versions[0]} here, {versions[1]} there"))
    if not found and tuple(spec.argv) != tuple(man.argv):
        found.append(Difference("other", "the compiler command line differs"))
    if not found:
        found.append(Difference("other", "the key's schema or the backend's ABI differs (another safejit version)"))
    return found


def nearest_build(roots: Iterable[str], spec: BuildSpec, backend: str) -> Nearest | None:
    """The other build of ``spec``'s kernel (same tenant and backend) in ``roots`` whose
    inputs differ least from ``spec``'s; the newest of those. Only this tenant's and
    backend's directories are walked, and at most :data:`MAX_MANIFESTS` manifests read;
    unreadable ones are skipped."""
    best: tuple[tuple[int, float], Nearest] | None = None
    read = 0
    for root in roots:
        for info in maintenance.iter_leaves(root, spec.tenant, backend):
            if read >= MAX_MANIFESTS:
                return best[1] if best is not None else None
            read += 1
            try:
                man = maintenance.read_manifest(info)
            except (OSError, ManifestError):
                continue
            if man.name != spec.name:
                continue
            found = differences(spec, man)
            rank = (len(found), -man.created)
            if best is None or rank < best[0]:
                best = (rank, Nearest(info.id, info.path, info.build_key, man.created, tuple(found)))
    return best[1] if best is not None else None
