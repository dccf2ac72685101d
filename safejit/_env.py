"""The only module that reads the process environment.

Every ``SAFEJIT_*`` variable is listed in :data:`VARIABLES` with its type; a
bad value raises :class:`~safejit.errors.ConfigError` naming the variable.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = [
    "HELP",
    "OTHER_VARIABLES",
    "VARIABLES",
    "ascend_home_candidates",
    "config_overrides",
    "cuda_per_thread_default_stream",
    "default_cache_dir",
    "faults_spec",
    "parse_size",
    "passthrough_values",
    "remote_credentials",
    "safejit_variables",
    "sandbox_ids",
    "state_dir_candidates",
    "table",
    "warn_unknown",
]

logger = logging.getLogger("safejit.config")


def _float(text: str) -> float:
    return float(text)


def _int(text: str) -> int:
    return int(text, 10)


def _paths(text: str) -> tuple[str, ...]:
    return tuple(p for p in text.split(os.pathsep) if p)


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """A size in bytes: ``1024``, ``500M``, ``2G``, ``1.5T`` (``k``/``M``/``G``/``T``, powers
    of 1024; a trailing ``B`` or ``iB`` is allowed). ``ValueError`` unless it is a finite,
    non-negative number."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = t[-1:] if t[-1:] in _SIZE_UNITS and not t[-1:].isdigit() else ""
    number = float(t[: len(t) - len(unit)])  # (ValueError when it is not a number)
    if not number >= 0 or number == float("inf"):
        raise ValueError(f"not a size: {text!r} (a non-negative number of bytes, or with k, M, G or T)")
    return int(number * _SIZE_UNITS[unit])


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _key_list(text: str) -> tuple[tuple[str, str], ...]:
    """``id=key;id=key``: Ed25519 public keys (hex, base64 or an ssh-ed25519 line) by key id."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(";"))):
        key_id, sep, key = item.partition("=")
        if not sep or not key_id.strip() or not key.strip():
            raise ValueError(f"expected id=key, got {item!r}")
        out.append((key_id.strip(), key.strip()))
    return tuple(out)


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
    "SAFEJIT_MEMORY_MAX_BYTES": ("memory_max_bytes", parse_size),
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
    "SAFEJIT_CACHE_MAX_BYTES": ("cache_max_bytes", parse_size),
    "SAFEJIT_REMOTE": ("remote", str),
    "SAFEJIT_REMOTE_MODE": ("remote_mode", str),
    "SAFEJIT_REMOTE_CONNECT_TIMEOUT_S": ("remote_connect_timeout_s", _float),
    "SAFEJIT_REMOTE_TIMEOUT_S": ("remote_timeout_s", _float),
    "SAFEJIT_REMOTE_MAX_BYTES": ("remote_max_bytes", parse_size),
    "SAFEJIT_REMOTE_HEAD_MAX_BYTES": ("remote_head_max_bytes", parse_size),
    "SAFEJIT_REMOTE_LEASE_TTL_S": ("remote_lease_ttl_s", _float),
    "SAFEJIT_VERIFY_KEYS": ("verify_keys", _key_list),
}

#: Variables that are no Config field: read where they are used, never kept in a Config
#: (credentials), or read once at import (fault injection).
OTHER_VARIABLES: Mapping[str, str] = {
    "SAFEJIT_FAULTS": "fault points to enable: point=action[@probability][;...] (safejit.faults)",
    "SAFEJIT_REMOTE_USERNAME": "the remote's user (S3: access key id) when the URL holds none",
    "SAFEJIT_REMOTE_PASSWORD": "the remote's password (S3: secret access key) when the URL holds none",
    "SAFEJIT_REMOTE_SESSION_TOKEN": "S3: a session token for temporary credentials",
    "SAFEJIT_SANDBOX_UID": "`uid[:gid]`: the unprivileged ids a root caller's compilers run as (`nobody`'s)",
    "SAFEJIT_LOOKUPS": "set by safejit in a compiler run's environment, not by users: where the preprocessors "
    "(GCC's, clang's) write the paths they looked up (the lookup recorder, preloaded)",
}


#: What each variable is for (the README's table is made from this: see :func:`table`).
HELP: Mapping[str, str] = {
    "SAFEJIT_BACKEND": "`host` (default), `cuda`, `ascend` or `fake`",
    "SAFEJIT_CACHE_DIRS": "cache roots, `:`-separated; the first writable one takes new entries",
    "SAFEJIT_SOURCE_ROOTS": "where the compiler may read user files, `:`-separated",
    "SAFEJIT_ENV_PASSTHROUGH": "variables the compiler may see (their values enter the key), `,`-separated",
    "SAFEJIT_DECLARED_EXTRAS": "names every compile must give in `extras`, `,`-separated",
    "SAFEJIT_MAX_STALENESS_S": "seconds a memory entry is trusted before its files are checked again (1.0)",
    "SAFEJIT_TENANT": "the namespace of this process's entries (`default`)",
    "SAFEJIT_COMPILE_TIMEOUT_S": "seconds a compile may run (300)",
    "SAFEJIT_LOCK_TIMEOUT_S": "seconds to wait for another process compiling the same key (60)",
    "SAFEJIT_MEMORY_MAX_ENTRIES": "memory tier bound, entries (1024)",
    "SAFEJIT_MEMORY_MAX_BYTES": "memory tier bound, bytes or a size (`1G`, the default)",
    "SAFEJIT_SANDBOX": "`auto` (default), `required` or `off`",
    "SAFEJIT_ON_CACHE_ERROR": "`raise` (default) or `bypass`: compile privately when the cache cannot be used",
    "SAFEJIT_TRACE_MEMORY_HITS": "a span for every memory hit too (`0`)",
    "SAFEJIT_TRUST_STAT": "let an unchanged stat stand for an unchanged file (`1`; `0` on NFS with attribute caching)",
    "SAFEJIT_SCRATCH": "where compilers write their temporaries: `memory` (default) or `cache`",
    "SAFEJIT_INVENTORY": "a file to append each distinct compile request to (for `safejit warm`)",
    "SAFEJIT_CUDA_COMPILER": "`nvrtc` (default) or `nvcc`",
    "SAFEJIT_NVRTC_WORKER": "run NVRTC in a confined worker process (`1`)",
    "SAFEJIT_CUDA_SPILLS": "register spills: `warn` (default), `error` or `ignore`",
    "SAFEJIT_NVCC": "the nvcc to use (absolute path)",
    "SAFEJIT_ASCEND_HOME": "the CANN toolkit (else CANN's ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME, /usr/local/Ascend)",
    "SAFEJIT_HOST_CC": "the host C compiler (absolute path)",
    "SAFEJIT_HOST_CXX": "the host C++ compiler (absolute path)",
    "SAFEJIT_CACHE_MAX_BYTES": "an opt-in disk cache cap (`10G`): what `safejit prune` keeps under when given no limit",
    "SAFEJIT_REMOTE": "a remote cache: `redis://…`, `rediss://…`, `unix://…` or `s3://bucket/prefix?endpoint=…`; "
    "a Runtime with one needs `verify_keys` (reading) or `signing_key` (uploading): "
    "a remote leaf is used only when signed",
    "SAFEJIT_REMOTE_MODE": "`read-write` (default), `read-only` or `off`",
    "SAFEJIT_REMOTE_CONNECT_TIMEOUT_S": "seconds to connect to the remote (0.1)",
    "SAFEJIT_REMOTE_TIMEOUT_S": "the floor of a remote operation's deadline (0.05 Redis, 0.5 S3)",
    "SAFEJIT_REMOTE_MAX_BYTES": "the largest artifact fetched or sent, bytes or a size (`512M`, the default)",
    "SAFEJIT_REMOTE_HEAD_MAX_BYTES": "the largest artifact also kept as its build key's head, read with the index "
    "(Redis; `1M`, the default; `0`: none)",
    "SAFEJIT_REMOTE_LEASE_TTL_S": "seconds a build lease lives without its holder's heartbeat (30; 0.001 to 86400)",
    "SAFEJIT_VERIFY_KEYS": "Ed25519 public keys that may sign leaves: `id=key;id=key`",
    **OTHER_VARIABLES,
}


def table() -> str:
    """Every variable as a Markdown table (what the README shows)."""
    rows = ["| variable | Config field | meaning |", "| --- | --- | --- |"]
    for name in [*VARIABLES, *OTHER_VARIABLES]:
        field = f"`{VARIABLES[name][0]}`" if name in VARIABLES else "—"
        rows.append(f"| `{name}` | {field} | {HELP[name]} |")
    return "\n".join(rows) + "\n"


_warned: set[str] = set()


def warn_unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """Log, once per process each, ``SAFEJIT_*`` names safejit does not know (a typo
    would otherwise be silently ignored); returns them."""
    env = os.environ if environ is None else environ
    unknown = sorted(n for n in env if n.startswith("SAFEJIT_") and n not in VARIABLES and n not in OTHER_VARIABLES)
    for name in unknown:
        if name not in _warned:
            _warned.add(name)
            logger.warning("%s is not a safejit variable; it is ignored (the variables: README, or safejit._env)", name)
    return unknown


def config_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Config fields set by ``SAFEJIT_*`` variables, parsed and typed. A bad value is a
    ``ConfigError`` naming the variable; an unknown name is logged once."""
    env = os.environ if environ is None else environ
    warn_unknown(env)
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


def remote_credentials(engine: str, *, has_user: bool = False, has_password: bool = False) -> dict[str, str]:
    """The remote's credentials from the environment (only those set) that the URL lacks
    (``has_user``, ``has_password``: what its userinfo holds; the URL's win):
    SAFEJIT_REMOTE_*, and for S3 the AWS_* variables its SDKs read — a key and its
    secret together, only where neither the URL nor SAFEJIT_REMOTE_* gives either, and
    their session token with them (never attached to another key)."""
    env = os.environ
    found = {
        # (given with a URL's user but no password too: the same one is taken, another
        # refused, never the environment's password paired with another's user)
        "username": None if has_user and has_password else env.get("SAFEJIT_REMOTE_USERNAME"),
        "password": None if has_password else env.get("SAFEJIT_REMOTE_PASSWORD"),
        # (S3's temporary credentials only: another engine has none to take)
        "session_token": env.get("SAFEJIT_REMOTE_SESSION_TOKEN") if engine == "s3" else None,
    }
    if engine == "s3" and not (has_user or has_password or found["username"] or found["password"]):
        # (the AWS_* pair: only where no key is named at all)
        key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        if key and secret:  # (a pair, or none: obstore's own chain then)
            found.update(username=key, password=secret, session_token=env.get("AWS_SESSION_TOKEN"))
    return {k: v for k, v in found.items() if v}


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
    home = os.path.expanduser("~")  # ("~" itself when there is no HOME and no passwd entry)
    if home != "~":
        found.append(os.path.join(home, ".local", "state", "safejit"))
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


def cuda_per_thread_default_stream() -> bool:
    """Whether ``cuda.bindings`` resolves the driver's per-thread default-stream entry
    points (its own variable, ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM``, read as it
    reads it: a nonzero integer)."""
    try:
        return bool(int(os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0")))
    except ValueError:
        return False
