"""What the first compile sets up, wired once by constructor: the backend, the
sandbox, the disk tier (with its staging and stat memo), the signer and verifier —
and the sandboxed runner every compiler and probe goes through."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .. import _env
from ..backends import Backend, get_backend
from ..backends.base import Runner, RunOutcome
from ..cache.disk import DiskTier
from ..cache.staging import Staging, settle
from ..cache.statmemo import StatMemo
from ..closure.anchors import Anchors
from ..config import Config
from ..policy import roots as root_policy
from ..policy.trust import Signer, config_policy, signature_policy, signer_of
from ..sandbox import SYSTEM_PATH
from ..sandbox.runner import Sandbox
from ..sandbox.statedir import state_dir
from ..spec import Toolchain
from ..telemetry import ATTR, instruments

if TYPE_CHECKING:
    from ..cache.remote.tier import RemoteTier

__all__ = ["Parts"]

logger = logging.getLogger(__name__)


class Parts:
    """Every component a Runtime's data path uses, built once from its Config."""

    def __init__(self, config: Config, env: Sequence[tuple[str, str]]) -> None:
        self.config = config
        self._env = tuple(env)
        dirs = config.resolved_cache_dirs()
        # Executables and private state (the shim, the stat memo, the probes) live in this
        # user's private directory outside every cache root: a cache is data, never code.
        self.state = state_dir(avoid=dirs)
        private = self.state.path
        # The shim is built by the system compiler (Sandbox's default), never by a
        # configured one: a configured compiler is what the sandbox is there to contain.
        self.sandbox = Sandbox(config.sandbox, state=self.state)
        self.sandbox.check_available()
        self.backend: Backend = get_backend(
            config.backend,
            cc=config.host_cc,
            cxx=config.host_cxx,
            state_dir=private,
            compiler=config.cuda_compiler,
            nvcc=config.nvcc,
            worker=config.nvrtc_worker,
            spills=config.cuda_spills,
            require_landlock=config.sandbox == "required",
            state=self.state,
            ascend_homes=(config.ascend_home,) if config.ascend_home else _env.ascend_home_candidates(),
        )
        # A compiler process works in a scratch dir; one in this process (NVRTC) writes none.
        scratch = self.backend.needs_workdir
        in_memory = scratch and config.scratch == "memory"  # (where /dev/shm allows: Staging sees)
        signer = signer_of(config.signing_key) if config.signing_key else None
        self.disk = DiskTier(
            dirs,
            tenant=config.tenant,
            backend=config.backend,
            signer=signer,
            verifier=config_policy(config, signer),
            max_artifact_bytes=config.max_artifact_bytes,
            memo=StatMemo(private) if config.trust_stat else None,
            staging=Staging(f"artifact.{self.backend.artifact_ext}", scratch=scratch, memory=in_memory, marks=private),
        )
        self.remote = self._open_remote(config, signer)
        self._anchors: dict[tuple[Toolchain, tuple[str, ...]], Anchors] = {}
        kept = [*(("cache root", d) for d in dirs), ("private state dir", self.state.shown)]
        for overlap in root_policy.overlaps(config.source_roots, kept):
            logger.warning(
                "%s: the compilers of its sources can read what lies there (other tenants' builds, "
                "this user's private state); declare roots that keep them apart",
                overlap,
            )

    def _open_remote(self, config: Config, signer: Signer | None) -> RemoteTier | None:
        """The remote tier, when one is configured (its engine's client library is
        imported now, not before; no connection is made until the first lookup)."""
        settings = config.remote_settings(env=True)
        if settings is None:
            return None
        from ..cache.remote import open_store
        from ..cache.remote.tier import RemoteTier

        attrs = {ATTR.BACKEND: config.backend, ATTR.TENANT: config.tenant, ATTR.REMOTE_ENGINE: settings.engine}
        store = open_store(
            settings,
            tenant=config.tenant,
            backend=config.backend,
            on_transition=lambda old, new: instruments.breaker_transitions.add(1, {**attrs, ATTR.TO: str(new)}),
            observer=_RemoteObserver(attrs),
        )
        return RemoteTier(
            store,
            writable=config.remote_mode == "read-write",
            # Signed, whatever require_signed says of this node's own disk: the keyspace is
            # written by others (Config refuses a remote without a key).
            verifier=signature_policy(config.verify_keys, signer, require=True),
            memo=self.disk.memo,
            max_artifact_bytes=config.max_artifact_bytes,
            attrs=attrs,
        )

    def anchors(self, toolchain: Toolchain, seen: list[tuple[str, str]] | None = None) -> Anchors:
        """The anchors of this compile's roots: the source roots resolved now (a root
        given as a symlink that was re-pointed takes effect at once, for confinement,
        anchors and the sandbox alike), the toolchain's as probed. ``seen`` is given each
        source root and what it resolved to."""
        roots = self.config.source_roots
        resolved = tuple(root_policy.resolve_root(r) for r in roots)
        if seen is not None:
            seen.extend(zip(roots, resolved, strict=True))
        key = (toolchain, resolved)
        found = self._anchors.get(key)
        if found is None:
            if len(self._anchors) >= 64:
                self._anchors.clear()
            found = root_policy.anchors_of(resolved, toolchain.roots, link_roots=toolchain.link_roots)
            self._anchors[key] = found
        return found

    def runner(
        self,
        config: Config,
        toolchain_roots: Sequence[str] = (),
        on_start: Callable[[], None] | None = None,
        *,
        record: bool = False,
        on_recorded: Callable[[str], None] | None = None,
    ) -> Runner:
        """Run argv lists in the sandbox: fixed PATH, TMPDIR in the work dir, only
        ``env_passthrough`` variables; read access to the source roots and
        ``toolchain_roots``. ``on_start`` runs once, when the first process has started.
        ``record``: with the lookup recorder preloaded, where it can be (``Sandbox.recorder``);
        ``on_recorded(cwd)`` is told of each run it was preloaded into."""
        pending = [on_start] if on_start is not None else []
        # (TZ fixed, whatever is passed through: no compiler looks for a zone file — nvcc's cicc
        # reads /etc/localtime, or /usr/share/zoneinfo/<TZ>, at every compile, outside the roots)
        base_env = {"PATH": SYSTEM_PATH, "LC_ALL": "C", **dict(self._env), "TZ": "UTC0"}
        roots = [*(root_policy.resolve_root(r) for r in config.source_roots), *toolchain_roots]
        preload = self.sandbox.preload_env() if record else {}

        def run(
            argv: Sequence[str],
            *,
            cwd: str,
            timeout: float | None = None,
            extra_read: Sequence[str] = (),
            watch: Sequence[str] = (),
            on_closed: Callable[[str, bytes], None] | None = None,
        ) -> RunOutcome:
            if not cwd:  # (a probe: in a scratch dir of its own, gone when it ends)
                with tempfile.TemporaryDirectory(prefix="safejit-probe-", ignore_cleanup_errors=True) as scratch:
                    return run(
                        argv, cwd=scratch, timeout=timeout, extra_read=extra_read, watch=watch, on_closed=on_closed
                    )
            where = cwd
            tmp = os.path.join(where, ".tmp")
            os.makedirs(tmp, mode=0o700, exist_ok=True)  # (private: see the shim's hand_over)
            env = {**base_env, "TMPDIR": tmp, **preload}
            if preload and on_recorded is not None:
                on_recorded(where)
            return self.sandbox.run(
                argv,
                cwd=where,
                env=env,
                timeout=timeout or config.compile_timeout_s,
                read_roots=[*roots, *extra_read],
                write_roots=[where],
                on_start=pending.pop() if pending else None,
                watch=watch,
                on_closed=on_closed,
                watch_limit=config.max_artifact_bytes,  # (a file larger is read after, if at all)
            )

        return run

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()
        self.sandbox.close()  # (a shim that background work starts after this is ended at once)
        settle()
        self.backend.close()
        self.disk.close()


class _RemoteObserver:
    """Remote operations into ``safejit.remote.duration{op}`` and ``.bytes{direction}``."""

    def __init__(self, attrs: dict[str, str]) -> None:
        self._attrs = attrs

    def __call__(self, op: str, seconds: float, reason: str | None, sent: int, received: int) -> None:
        instruments.remote_duration.record(seconds, {**self._attrs, ATTR.OP: op})
        if sent:
            instruments.remote_bytes.add(sent, {**self._attrs, ATTR.DIRECTION: "sent"})
        if received:
            instruments.remote_bytes.add(received, {**self._attrs, ATTR.DIRECTION: "received"})
