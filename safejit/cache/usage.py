"""Usage records: each process writes its counters and compile latencies into
the cache root when its Runtime closes (or the process exits), so that
``safejit stats`` can show hit rates and latency percentiles across processes.

One file per process (``<root>/v1/usage/<tenant>/<host>-<pid>-<rand>.json``):
no two writers share a file, so no lock is needed.

A record is hostile input when read back (others write the shared root): it is
decoded by one strict schema, :class:`UsageRecord` — counters are bounded
non-negative integers, latencies bounded non-negative seconds, the file at most
:data:`RECORD_LIMIT` bytes — and anything else is a :class:`UsageError`, which
``safejit stats`` reports as a finding (``maintenance.read_usage``). Fields a newer
writer adds are ignored, so mixed versions can share a root.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterable, Mapping
from typing import Annotated, Final

import msgspec

from .layout import VERSION

__all__ = [
    "MAX_SAMPLES",
    "RECORD_LIMIT",
    "UsageError",
    "UsageRecord",
    "decode_usage",
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
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=fd)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd
