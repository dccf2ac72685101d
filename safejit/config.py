"""Config: roots, cache dirs, limits, trust and staleness — frozen, no I/O."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from . import _env
from .cache.layout import RESERVED
from .closure.depfiles import UNLISTABLE
from .errors import ConfigError

__all__ = ["BACKENDS", "BackendName", "Config"]

#: ``fake`` needs no compiler: for tests (see ``safejit.backends.fake``).
#: A backend's name (``Config.backend``).
BackendName = Literal["host", "cuda", "ascend", "fake"]
BACKENDS: tuple[BackendName, ...] = get_args(BackendName)
_TENANT = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}\Z")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MiB = 1 << 20
#: Variables that would act as refused flags (search paths, output redirection,
#: program swaps, preloads) or that the sandbox sets itself: never passed through.
_ENV_REFUSED = frozenset(
    {
        "PATH",
        "TMPDIR",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "GCC_EXEC_PREFIX",
        "COMPILER_PATH",
        "LIBRARY_PATH",
        "CPATH",
        "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH",
        "OBJC_INCLUDE_PATH",
        "DEPENDENCIES_OUTPUT",
        "SUNPRO_DEPENDENCIES",
        "GCC_COMPARE_DEBUG",
        "NVCC_APPEND_FLAGS",
        "NVCC_PREPEND_FLAGS",
        "NVCC_CCBIN",
        "CCACHE_DIR",
        "SOURCE_DATE_EPOCH_OVERRIDE",
        "GCONV_PATH",
        "PYTHONPATH",
        "OBJCPLUS_INCLUDE_PATH",
        # nvcc.profile's variables: nvcc appends them to its phases' command lines, through
        # its shell, unquoted (``PTXAS_FLAGS='$(cmd)'`` runs cmd).
        "INCLUDES",
        "SYSTEM_INCLUDES",
        "LIBRARIES",
        "CUDAFE_FLAGS",
        "PTXAS_FLAGS",
        "CICC_PATH",
        "NVVMIR_LIBRARY_DIR",
    }
)


def _absolute(path: str, name: str) -> str:
    """``path`` with ``~`` expanded, made absolute against the working directory now
    (lexically: symlinks are left for each compile to resolve). A control character or a
    backslash is refused: a compiler lists what it read under these paths in text that
    cannot carry them; so is a path that is not UTF-8 (manifests and keys are UTF-8 text)."""
    if UNLISTABLE.search(path):
        raise ConfigError(f"Config.{name}: {path!r} holds a control character or a backslash")
    expanded = os.path.expanduser(path)
    try:
        absolute = expanded if os.path.isabs(expanded) else os.path.abspath(expanded)
    except OSError as exc:  # (the working directory was removed)
        raise ConfigError(f"Config.{name}: {path!r} is relative, and there is no working directory: {exc}") from None
    try:
        absolute.encode("utf-8")
    except UnicodeEncodeError:  # (bytes that are not UTF-8, as os.fsdecode gives them)
        raise ConfigError(f"Config.{name}: {absolute!r} is not UTF-8: manifests and keys cannot name it") from None
    return absolute


@dataclass(frozen=True, slots=True)
class Config:
    """Everything a :class:`~safejit.Runtime` needs to know, fixed at creation.

    Cache and source roots given relative (or with ``~``) are made absolute here, against
    the working directory and home of the moment: a later ``chdir`` changes nothing.
    Symlinks in them are resolved (and paths confined) on each compile, so building a
    Config touches no file.
    """

    backend: BackendName = "host"
    #: Cache roots. The first writable one takes new entries; the rest are read-only.
    cache_dirs: tuple[str, ...] = ()
    #: Directories the compiler may read user files from (include dirs, sources).
    source_roots: tuple[str, ...] = ()
    #: Environment variables the compiler may see; their values enter the key.
    env_passthrough: tuple[str, ...] = ()
    #: Names of non-file key inputs every compile must supply through ``extras``.
    declared_extras: tuple[str, ...] = ()
    #: Seconds a memory-tier entry is trusted before its dependencies are re-stat'ed.
    max_staleness_s: float = 1.0
    tenant: str = "default"
    compile_timeout_s: float = 300.0
    #: Seconds to wait for another process compiling the same key (the disk is looked at
    #: again meanwhile); then compile anyway. The lock only saves work: anyone who can
    #: open a lock file can hold it, so a long wait would let them stall compiles.
    lock_timeout_s: float = 60.0
    memory_max_entries: int = 1024
    #: The memory tier's bound on what its entries hold, in bytes: each artifact and the
    #: closure kept to revalidate it, estimated (``Entry.charge``; the newest entry is kept
    #: even when it alone is larger; the request's source text is not counted). An evicted
    #: module's library is unloaded once nothing holds it: its kernels refer to it through
    #: cycles, so that is at the next collection that reaches them (``gc.collect()`` makes
    #: it now).
    memory_max_bytes: int = 1 << 30
    sandbox: Literal["auto", "required", "off"] = "auto"
    on_cache_error: Literal["raise", "bypass"] = "raise"
    trace_memory_hits: bool = False
    #: Let a verification trust an unchanged stat recorded by this user on this boot
    #: (see cache/statmemo.py). Turn off where stat may lag content (NFS attribute caching).
    trust_stat: bool = True
    #: Where compilers write their scratch files (the source, outputs, temporaries):
    #: "memory", a private directory on /dev/shm when there is one (else as "cache");
    #: "cache", the cache root's ``tmp/``. Leaves are staged in the cache root either way.
    scratch: Literal["memory", "cache"] = "memory"
    #: Append each distinct compile request here (JSON lines) for ``safejit warm``.
    inventory: str | None = None
    #: CUDA: "nvrtc" (in process, or in an isolated worker) or "nvcc" (sandboxed argv).
    cuda_compiler: Literal["nvrtc", "nvcc"] = "nvrtc"
    #: CUDA: run NVRTC in a persistent worker that may read only the declared and toolchain roots
    #: and records every path it looks up (one NVRTC run per compile). In process (False) is for
    #: trusted sources only, and hands headers over in memory: one NVRTC run per header it asks for.
    nvrtc_worker: bool = True
    #: CUDA: what register spills / local memory do: "warn" (SpillWarning), "error", "ignore".
    cuda_spills: Literal["warn", "error", "ignore"] = "warn"
    #: CUDA: the nvcc to use (absolute path); None: the toolkit's.
    nvcc: str | None = None
    #: Ascend: the CANN toolkit; None: ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME, /usr/local/Ascend/...
    ascend_home: str | None = None
    max_source_bytes: int = 4 * _MiB
    max_artifact_bytes: int = 512 * _MiB
    #: The most files a build's closure may hold. It may also hold at most 4 times as many
    #: negative lookups (paths looked for and not there), and at least 100,000, and its
    #: compiler look up at most as many distinct paths (``LimitExceededError`` past either).
    max_deps: int = 20_000
    #: An opt-in cap on the disk cache's size, in bytes: what ``safejit prune`` keeps
    #: the first cache root under when it is given no limit (least recently used
    #: leaves go first). None: no cap. The library itself never prunes.
    cache_max_bytes: int | None = None
    #: Host compilers (absolute paths); None: ``cc``/``c++`` from a fixed system PATH.
    host_cc: str | None = None
    host_cxx: str | None = None
    #: Optional signing key: HMAC (bytes, at least 16) or an Ed25519 private key (PKCS#8
    #: PEM). Leaves this process publishes are signed with it; a signed leaf is used only
    #: if its signature verifies.
    signing_key: bytes | str | None = field(default=None, repr=False)
    #: Ed25519 public keys by key id (raw, hex, base64, PEM or ssh-ed25519): readers can
    #: check leaves signed by a builder without being able to sign any.
    verify_keys: tuple[tuple[str, bytes | str], ...] = ()
    #: A remote cache a fleet shares (DESIGN.md §11): ``redis://``, ``rediss://``,
    #: ``unix://`` (Redis/Valkey) or ``s3://bucket/prefix?endpoint=...`` (S3-compatible).
    #: Credentials in the URL's userinfo, or SAFEJIT_REMOTE_USERNAME / _PASSWORD.
    remote: str | None = field(default=None, repr=False)
    #: ``read-write`` (look up, publish, take leases), ``read-only`` (look up only; pair it
    #: with a read-only server user) or ``off``.
    remote_mode: Literal["read-write", "read-only", "off"] = "read-write"
    remote_connect_timeout_s: float = 0.1
    #: The floor of each remote operation's deadline (None: 50 ms Redis, 500 ms S3); a
    #: transfer's grows with its size (200 MB/s), up to 2 s.
    remote_timeout_s: float | None = None
    #: The largest artifact fetched from or sent to the remote.
    remote_max_bytes: int = 512 * _MiB
    #: The largest artifact also kept as its build key's head on a Redis remote: read with
    #: the index, a hit in one round trip. Each build key's first such artifact is stored
    #: twice; 0: no heads.
    remote_head_max_bytes: int = 1 * _MiB
    #: How long a build lease lives without its holder's heartbeat (a dead node's expires).
    remote_lease_ttl_s: float = 30.0
    #: Whether an unsigned leaf is a miss. None (the default): yes when any key is set.
    #: ``False`` with a key reads signed and unsigned leaves but writes signed ones
    #: (moving a cache to signatures).
    require_signed: bool | None = None

    def __post_init__(self) -> None:
        for name in ("cache_dirs", "source_roots", "env_passthrough", "declared_extras"):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, (tuple, list)):
                raise ConfigError(f"Config.{name} must be a tuple of strings, got {value!r}")
            if not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"Config.{name} holds an empty or non-string item: {value!r}")
            object.__setattr__(self, name, tuple(value))
        for name in ("cache_dirs", "source_roots"):
            object.__setattr__(self, name, tuple(_absolute(p, name) for p in getattr(self, name)))
        if self.backend not in BACKENDS:
            raise ConfigError(f"Config.backend must be one of {BACKENDS}, got {self.backend!r}")
        self._check_types()
        if not _TENANT.match(self.tenant):
            raise ConfigError(
                f"Config.tenant {self.tenant!r} must be 1 to 63 of a-z 0-9 _ . - (lowercase), "
                "starting with a letter or digit"
            )
        if self.tenant in RESERVED:  # (the cache's own directories beside the tenants')
            raise ConfigError(f"Config.tenant {self.tenant!r} is reserved (not one of {sorted(RESERVED)})")
        for name in self.declared_extras:
            if not _IDENT.match(name):
                raise ConfigError(f"declared extra {name!r} is not an identifier")
        for name in self.env_passthrough:
            if not _ENV_NAME.match(name):
                raise ConfigError(f"env_passthrough name {name!r} is not a variable name")
            if name in _ENV_REFUSED or name.startswith(("LD_", "DYLD_", "CCC_", "GCC_", "NVCC_")):
                raise ConfigError(
                    f"env_passthrough may not include {name}: it changes what the compiler reads, "
                    "writes or runs outside the policy",
                    name=name,
                )
        self._check_numbers()
        if self.cache_max_bytes is not None and (
            isinstance(self.cache_max_bytes, bool)
            or not isinstance(self.cache_max_bytes, int)
            or self.cache_max_bytes <= 0
        ):
            raise ConfigError(f"Config.cache_max_bytes must be a positive int or None, got {self.cache_max_bytes!r}")
        if self.sandbox not in ("auto", "required", "off"):
            raise ConfigError(f"Config.sandbox must be auto|required|off, got {self.sandbox!r}")
        if self.scratch not in ("memory", "cache"):
            raise ConfigError(f"Config.scratch must be memory|cache, got {self.scratch!r}")
        if self.on_cache_error not in ("raise", "bypass"):
            raise ConfigError(f"Config.on_cache_error must be raise|bypass, got {self.on_cache_error!r}")
        if self.cuda_compiler not in ("nvrtc", "nvcc"):
            raise ConfigError(f"Config.cuda_compiler must be nvrtc|nvcc, got {self.cuda_compiler!r}")
        self._check_remote()
        if self.cuda_spills not in ("warn", "error", "ignore"):
            raise ConfigError(f"Config.cuda_spills must be warn|error|ignore, got {self.cuda_spills!r}")
        if self.signing_key is not None:
            from .policy.trust import signer_of

            signer_of(self.signing_key)  # (a bad key is refused here, not at the first compile)
        self._check_verify_keys()
        if self.require_signed is None:
            object.__setattr__(self, "require_signed", self.signing_key is not None or bool(self.verify_keys))
        elif not isinstance(self.require_signed, bool):
            raise ConfigError(f"Config.require_signed must be a bool or None, got {self.require_signed!r}")
        if self.require_signed and not self.signing_key and not self.verify_keys:
            raise ConfigError("Config.require_signed needs Config.signing_key or Config.verify_keys")

    def _check_remote(self) -> None:
        if self.remote_mode not in ("read-write", "read-only", "off"):
            raise ConfigError(f"Config.remote_mode must be read-write|read-only|off, got {self.remote_mode!r}")
        if self.remote is not None:
            self.remote_settings(env=True)  # (the URL, numbers and credentials parse; no I/O)

    def check_remote_keys(self) -> None:
        """Raise ``ConfigError`` when a remote tier this configuration would look up in has
        no key to check its leaves with, or one it would upload to none to sign with (the
        operator commands, which load nothing, need none)."""
        if self.remote is not None and self.remote_mode != "off":
            # A remote leaf is used only when signed by a key this node trusts: anyone who
            # can write the keyspace could otherwise hand every node the bytes they chose.
            if not self.signing_key and not self.verify_keys:
                raise ConfigError(
                    "Config.remote needs the keys its leaves are signed with: Config.signing_key "
                    "(a node that uploads signs with it) or Config.verify_keys (one that only reads); "
                    "a remote leaf is used only when signed by a key this node trusts"
                )
            if self.remote_mode == "read-write" and not self.signing_key:
                raise ConfigError(
                    "Config.remote_mode 'read-write' needs Config.signing_key: what a node uploads is "
                    "signed (a node holding only verify_keys reads: remote_mode='read-only')"
                )

    def remote_settings(self, *, env: bool = False) -> Any:
        """The remote's settings (``safejit.cache.remote.RemoteSettings``), or None when
        no remote is configured or it is off. ``env``: with the credentials the URL lacks
        taken from the environment (:func:`safejit._env.remote_credentials`)."""
        if self.remote is None or self.remote_mode == "off":
            return None
        from .cache.remote.settings import RemoteSettings
        from .cache.remote.url import ENGINES

        if not isinstance(self.remote, str):
            raise ConfigError("Config.remote must be a URL string")
        fields: dict[str, Any] = {
            "connect_timeout_s": self.remote_connect_timeout_s,
            "timeout_s": self.remote_timeout_s,
            "max_bytes": self.remote_max_bytes,
            "head_max_bytes": self.remote_head_max_bytes,
            "lease_ttl_s": self.remote_lease_ttl_s,
        }
        if not env:
            return RemoteSettings.from_url(self.remote, **fields)
        try:  # (what the URL holds, before it is parsed with what the environment adds)
            parts = urlsplit(self.remote)
            has = (bool(parts.username), parts.password is not None)  # ("redis://:pw@h": no user)
            engine = ENGINES.get(parts.scheme.lower(), "")
        except ValueError:  # (the parse below says what is wrong)
            has, engine = (False, False), ""
        creds = _env.remote_credentials(engine, has_user=has[0], has_password=has[1])
        return RemoteSettings.from_url(self.remote, **creds, **fields)

    def _check_verify_keys(self) -> None:
        keys = self.verify_keys
        if isinstance(keys, dict):
            keys = tuple(keys.items())
            object.__setattr__(self, "verify_keys", keys)
        if not isinstance(keys, tuple) or not all(isinstance(k, tuple) and len(k) == 2 for k in keys):
            raise ConfigError("Config.verify_keys must map key ids to Ed25519 public keys")
        if keys:
            from .policy.trust import Verifier

            Verifier(dict(keys))  # (each key parses, each id is well formed)

    def _check_types(self) -> None:
        """Switches are bools (``trust_stat="false"`` is true to Python: refused, not taken
        for yes), names and paths are strings."""
        for name in ("trace_memory_hits", "trust_stat", "nvrtc_worker"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"Config.{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.tenant, str):
            raise ConfigError(f"Config.tenant must be a string, got {self.tenant!r}")
        for name in ("inventory", "nvcc", "ascend_home", "host_cc", "host_cxx"):
            value = getattr(self, name)
            if value == "":  # (a variable set to nothing: unset, as it always was)
                object.__setattr__(self, name, None)
            elif value is not None and not isinstance(value, str):
                raise ConfigError(f"Config.{name} must be a path (a string) or None, got {value!r}")

    def _check_numbers(self) -> None:
        positive = (
            "compile_timeout_s",
            "lock_timeout_s",
            "memory_max_entries",
            "memory_max_bytes",
            "max_source_bytes",
            "max_artifact_bytes",
            "max_deps",
        )
        counts = ("memory_max_entries", "memory_max_bytes", "max_source_bytes", "max_artifact_bytes", "max_deps")
        for name in (*positive, "max_staleness_s"):
            value = getattr(self, name)
            if name in counts and isinstance(value, float) and math.isfinite(value) and value.is_integer():
                value = int(value)  # (2e9 bytes: a whole number written as a float)
                object.__setattr__(self, name, value)
            if name in counts and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"Config.{name} must be a whole number, got {value!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"Config.{name} must be a finite number, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"Config.{name} must be a finite number, got {value!r}")
            if name in positive and value <= 0:
                raise ConfigError(f"Config.{name} must be positive, got {value!r}")
            if value < 0:
                raise ConfigError(f"Config.{name} must be 0 or more, got {value!r}")

    @classmethod
    def from_env(cls, **overrides: Any) -> Config:
        """A Config from ``SAFEJIT_*`` variables; keyword overrides win. A value the
        Config refuses is a ConfigError naming the variable that set it."""
        from_env = _env.config_overrides()
        try:
            return cls(**{**from_env, **overrides})
        except ConfigError:
            for var, (name, _) in _env.VARIABLES.items():
                if name in from_env and name not in overrides:
                    try:
                        cls(**{name: from_env[name]})
                    except ConfigError as exc:
                        raise ConfigError(f"{var}: {exc}", variable=var) from None
            raise

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    def resolved_cache_dirs(self) -> tuple[str, ...]:
        """``cache_dirs``, or the per-user default when none is configured."""
        return self.cache_dirs or (_absolute(str(_env.default_cache_dir()), "cache_dirs"),)
