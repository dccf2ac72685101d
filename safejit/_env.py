"""The only module that reads the process environment.

Every ``SAFEJIT_*`` variable is listed in :data:`VARIABLES` with its type; a
bad value raises :class:`~safejit.errors.ConfigError` naming the variable.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = [
    "VARIABLES",
    "ascend_home_candidates",
    "config_overrides",
    "default_cache_dir",
    "faults_spec",
    "passthrough_values",
    "safejit_variables",
    "sandbox_ids",
    "state_dir_candidates",
]


def _float(text: str) -> float:
    return float(text)


def _int(text: str) -> int:
    return int(text, 10)


def _paths(text: str) -> tuple[str, ...]:
    return tuple(p for p in text.split(os.pathsep) if p)


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


# variable -> (Config field, parser)
VARIABLES: Mapping[str, tuple[str, Callable[[str], Any]]] = {
    "SAFEJIT_BACKEND": ("backend", str),
    "SAFEJIT_CACHE_DIRS": ("cache_dirs", _paths),
    "SAFEJIT_SOURCE_ROOTS": ("source_roots", _paths),
    "SAFEJIT_ENV_PASSTHROUGH": ("env_passthrough", _names),
    "SAFEJIT_DECLARED_EXTRAS": ("declared_extras", _names),
    "SAFEJIT_MAX_STALENESS_S": ("max_staleness_s", _float),
    "SAFEJIT_TENANT": ("tenant", str),
    "SAFEJIT_COMPILE_TIMEOUT_S": ("compile_timeout_s", _float),
    "SAFEJIT_LOCK_TIMEOUT_S": ("lock_timeout_s", _float),
    "SAFEJIT_MEMORY_MAX_ENTRIES": ("memory_max_entries", _int),
    "SAFEJIT_MEMORY_MAX_BYTES": ("memory_max_bytes", _int),
    "SAFEJIT_SANDBOX": ("sandbox", str),
    "SAFEJIT_ON_CACHE_ERROR": ("on_cache_error", str),
    "SAFEJIT_TRACE_MEMORY_HITS": ("trace_memory_hits", _bool),
    "SAFEJIT_TRUST_STAT": ("trust_stat", _bool),
    "SAFEJIT_SCRATCH": ("scratch", str),
    "SAFEJIT_INVENTORY": ("inventory", str),
    "SAFEJIT_CUDA_COMPILER": ("cuda_compiler", str),
    "SAFEJIT_NVRTC_WORKER": ("nvrtc_worker", _bool),
    "SAFEJIT_CUDA_SPILLS": ("cuda_spills", str),
    "SAFEJIT_NVCC": ("nvcc", str),
    "SAFEJIT_ASCEND_HOME": ("ascend_home", str),
    "SAFEJIT_HOST_CC": ("host_cc", str),
    "SAFEJIT_HOST_CXX": ("host_cxx", str),
}


def config_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Config fields set by ``SAFEJIT_*`` variables, parsed and typed."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for var, (field, parse) in VARIABLES.items():
        raw = env.get(var)
        if raw is None:
            continue
        try:
            out[field] = parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{var}={raw!r}: {exc}", variable=var) from exc
    return out


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/safejit``, else ``~/.cache/safejit``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "safejit"
    return Path.home() / ".cache" / "safejit"


def state_dir_candidates() -> tuple[str, ...]:
    """Where this user's private state (the sandbox shim, the stat memo, the toolchain
    probes) may live, in order: ``$XDG_STATE_HOME/safejit``, ``~/.local/state/safejit``,
    ``$XDG_RUNTIME_DIR/safejit`` (else ``/run/user/<uid>/safejit``). Relative values
    are ignored, as the XDG specification asks."""
    found = []
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):
        found.append(os.path.join(xdg, "safejit"))
    with contextlib.suppress(KeyError, RuntimeError):  # (no HOME and no passwd entry)
        found.append(str(Path.home() / ".local" / "state" / "safejit"))
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not (runtime and os.path.isabs(runtime)):
        runtime = f"/run/user/{os.geteuid()}"
    found.append(os.path.join(runtime, "safejit"))
    return tuple(dict.fromkeys(p for p in found if os.path.isabs(p)))


def sandbox_ids() -> tuple[int, int] | None:
    """``SAFEJIT_SANDBOX_UID``: ``uid[:gid]``, the unprivileged ids a compiler runs as
    when the caller is root (default: ``nobody``); None when unset. 0 is refused."""
    raw = os.environ.get("SAFEJIT_SANDBOX_UID")
    if raw is None:
        return None
    try:
        uid_text, _, gid_text = raw.partition(":")
        uid = int(uid_text, 10)
        gid = int(gid_text, 10) if gid_text else uid
        if uid <= 0 or gid <= 0 or uid >= 1 << 32 or gid >= 1 << 32:
            raise ValueError("ids must be unprivileged: 1 .. 2**32-1")
    except ValueError as exc:
        raise ConfigError(f"SAFEJIT_SANDBOX_UID={raw!r}: {exc}", variable="SAFEJIT_SANDBOX_UID") from exc
    return uid, gid


def passthrough_values(names: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """The current values of the variables a compiler may see, sorted."""
    return tuple(sorted((n, os.environ[n]) for n in set(names) if n in os.environ))


def faults_spec() -> str:
    """``SAFEJIT_FAULTS``: ``point=action[@probability][;...]`` or empty."""
    return os.environ.get("SAFEJIT_FAULTS", "")


def safejit_variables() -> tuple[str, ...]:
    """Names of every ``SAFEJIT_*`` variable set now (for tests and the CLI)."""
    return tuple(sorted(k for k in os.environ if k.startswith("SAFEJIT_")))


def ascend_home_candidates() -> tuple[str, ...]:
    """Where an Ascend toolkit may live, in order of preference."""
    found = [os.environ.get(v, "") for v in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")]
    found.append("/usr/local/Ascend/ascend-toolkit/latest")
    return tuple(p for p in found if p)
