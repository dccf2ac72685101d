"""Usage records: each process writes its counters and compile latencies into
the cache root when its Runtime closes (or the process exits), so that
``safejit stats`` can show hit rates and latency percentiles across processes.

One file per process (``<root>/v1/usage/<tenant>/<host>-<pid>-<rand>.json``):
no two writers share a file, so no lock is needed.

A record is hostile input when read back (others write the shared root): it is
decoded by one strict schema, :class:`UsageRecord` — counters are bounded
non-negative integers, latencies bounded non-negative seconds, the file at most
:data:`RECORD_LIMIT` bytes — and anything else is a :class:`UsageError`, which
``safejit stats`` reports as a finding (:func:`read_usage`). Fields a newer
writer adds are ignored, so mixed versions can share a root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Final

import msgspec

from ._walk import kind_of, read_at, real_layout, remove_at
from .fsio import group_writable, mkdir_shared, readable_by_group
from .layout import O_DIR, VERSION, entries

__all__ = [
    "MAX_SAMPLES",
    "RECORD_LIMIT",
    "UsageEntry",
    "UsageError",
    "UsageRecord",
    "decode_usage",
    "read_usage",
    "remove_usage",
    "usage_name",
    "write_usage",
]

MAX_SAMPLES: Final = 2000
#: A usage record larger than this is not read (MAX_SAMPLES latencies take ~30 KB).
RECORD_LIMIT: Final = 1 << 20

#: A backend or counter name (what ``Runtime.stats()`` and ``Config.backend`` use).
_Name = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_.-]{0,63}$")]
_Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]
_Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=1e7)]


class UsageError(ValueError):
    """A usage record that does not match the schema."""


class UsageRecord(msgspec.Struct, frozen=True):
    """One process's counters (``Runtime.stats()``) and its compile latencies."""

    backend: _Name
    counters: Annotated[dict[_Name, _Count], msgspec.Meta(max_length=256)]
    compile_seconds: Annotated[tuple[_Seconds, ...], msgspec.Meta(max_length=MAX_SAMPLES)] = ()


_DECODER: Final = msgspec.json.Decoder(UsageRecord)
_ENCODER: Final = msgspec.json.Encoder()


def decode_usage(raw: bytes) -> UsageRecord:
    """Decode and validate a record; any deviation raises :class:`UsageError`."""
    if len(raw) > RECORD_LIMIT:
        raise UsageError(f"larger than {RECORD_LIMIT} bytes")
    try:
        return _DECODER.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise UsageError(str(exc)) from None


def usage_name() -> str:
    """A record name unique to one Runtime; rewriting it replaces the record."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"


def write_usage(
    root: str, tenant: str, name: str, backend: str, counters: Mapping[str, int], compile_seconds: Iterable[float]
) -> None:
    """Write (replace) this process's record. Raises ``OSError`` when it cannot — also
    when a directory on the way below ``root`` is a symlink: a record is never written
    through one (out of the cache)."""
    record = UsageRecord(
        backend=backend,
        counters=dict(counters),
        compile_seconds=tuple(round(s, 6) for s in list(compile_seconds)[-MAX_SAMPLES:]),
    )
    tmp = f".{name}.tmp"
    fd = _made_dirs(root, (VERSION, "usage", tenant))
    try:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        if group_writable(root):
            readable_by_group(out)  # (the group's `safejit stats` reads it)
        with open(out, "wb") as fh:
            fh.write(_ENCODER.encode(record))
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=fd)
        raise
    finally:
        os.close(fd)


def _made_dirs(root: str, parts: tuple[str, ...]) -> int:
    """A descriptor of ``root/<parts…>``, each part made when absent and opened without
    following a symlink (``ELOOP``/``ENOTDIR`` when one is not a real directory)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    group = group_writable(root)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                mkdir_shared(part, dir_fd=fd, group=group)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- reading records back ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class UsageEntry:
    """A usage record as found: decoded, or the ``problem`` that kept it from being."""

    tenant: str
    path: str
    record: UsageRecord | None
    problem: str = ""
    #: Another user's, which this one may not read (in a root a group shares, made under a
    #: umask of 077): reported, never removed as damaged.
    foreign: bool = False


def read_usage(root: str) -> Iterator[UsageEntry]:
    """Every usage record under ``root`` (``<root>/v1/usage/<tenant>/*.json``), each
    decoded by the strict schema or reported with its problem (a symlink, a FIFO, a
    file too large, JSON that does not match); a writer's temporary (``.``) is skipped."""
    layout = real_layout(root)
    try:
        usage = layout.open_dirs(("usage",))
    except OSError:
        return  # absent; or not a directory: damaged() reports it
    try:
        for tenant in entries(usage):
            where = os.path.join(layout.usage, tenant.name)
            if not tenant.is_dir(follow_symlinks=False):
                yield UsageEntry(tenant.name, where, None, f"not a directory ({kind_of(tenant)})")
                continue
            try:
                fd = os.open(tenant.name, O_DIR, dir_fd=usage)
            except OSError as exc:
                yield UsageEntry(tenant.name, where, None, f"cannot be read: {exc.strerror}")
                continue
            try:
                yield from _records_at(fd, tenant.name, where)
            finally:
                os.close(fd)
    finally:
        os.close(usage)


def _records_at(fd: int, tenant: str, where: str) -> Iterator[UsageEntry]:
    for entry in entries(fd):
        if entry.name.startswith("."):
            continue
        path = os.path.join(where, entry.name)
        try:
            record = decode_usage(read_at(fd, entry.name, RECORD_LIMIT))
        except OSError as exc:
            foreign = exc.errno in (errno.EACCES, errno.EPERM)
            yield UsageEntry(tenant, path, None, f"cannot be read: {exc.strerror or exc}", foreign=foreign)
            continue
        except UsageError as exc:
            yield UsageEntry(tenant, path, None, f"not a usage record: {exc}")
            continue
        yield UsageEntry(tenant, path, record)


def remove_usage(root: str, entry: UsageEntry) -> bool:
    """Delete a usage record :func:`read_usage` found bad — or whatever stands in a
    record's or a tenant directory's place — relative to descriptors, never followed."""
    layout = real_layout(root)
    try:
        if os.path.dirname(entry.path) == layout.usage:  # the tenant's entry itself
            with layout.open_dir("usage") as fd:
                os.unlink(entry.tenant, dir_fd=fd)  # (a directory it could not open stays: EISDIR)
        else:
            with layout.open_dir("usage", entry.tenant) as fd:
                remove_at(fd, os.path.basename(entry.path))
    except OSError:
        return False
    return True
