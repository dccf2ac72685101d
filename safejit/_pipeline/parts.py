"""What the first compile sets up: disk tier, sandbox, backend, anchors — and the
sandboxed runner every compiler and probe goes through."""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence

from .. import _env
from ..backends import Backend, get_backend
from ..backends.base import Runner, RunOutcome
from ..cache.disk import DiskCache
from ..cache.staging import Spares, memory_scratch, settle
from ..cache.statmemo import StatMemo
from ..closure.anchors import Anchors
from ..config import Config
from ..policy import roots as root_policy
from ..policy.trust import HmacSigner
from ..sandbox import SYSTEM_PATH
from ..sandbox.runner import Sandbox
from ..sandbox.statedir import state_dir
from ..spec import Toolchain

__all__ = ["Setup"]


class Setup:
    """What the first compile sets up: backend, sandbox, disk tier."""

    def __init__(self, config: Config) -> None:
        dirs = config.resolved_cache_dirs()
        self.disk = DiskCache(
            dirs,
            tenant=config.tenant,
            backend=config.backend,
            signer=HmacSigner(config.signing_key) if config.signing_key else None,
            require_signed=config.require_signed,
            max_artifact_bytes=config.max_artifact_bytes,
        )
        # Executables and private state (the shim, the stat memo, the probes) live in this
        # user's private directory outside every cache root: a cache is data, never code.
        self.state = state_dir(avoid=dirs)
        private = self.state.path
        # The shim is built by the system compiler, never by a configured one: a
        # configured compiler is what the sandbox is there to contain.
        cc = shutil.which("cc", path=SYSTEM_PATH)
        self.sandbox = Sandbox(config.sandbox, state=self.state, cc=cc)
        self.sandbox.check_available()
        if config.trust_stat:
            self.disk.stat_memo = StatMemo(private)
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
            ascend_homes=(config.ascend_home,) if config.ascend_home else _env.ascend_home_candidates(),
        )
        # A compiler process works in a scratch dir; one in this process (NVRTC) writes none.
        scratch = not getattr(self.backend, "compiles_in_process", False)
        in_memory = scratch and config.scratch == "memory" and memory_scratch() is not None
        self.disk.spares = Spares(f"artifact.{self.backend.artifact_ext}", scratch=scratch and not in_memory)
        self.disk.memory_scratch = in_memory
        self._probe_dir: str | None = None
        self._probe_cleanup: weakref.finalize[[str, int], Setup] | None = None
        self._anchors: dict[Toolchain, Anchors] = {}
        self._toolchain_roots: dict[tuple[str, ...], list[str]] = {}
        self.source_roots = config.source_roots

    @property
    def probe_dir(self) -> str:
        """A scratch directory for toolchain probes, made on first need."""
        if self._probe_dir is None:
            self._probe_dir = tempfile.mkdtemp(prefix="safejit-probe-")
            # Removed by close(), else when this Setup is collected or at exit.
            self._probe_cleanup = weakref.finalize(self, _remove_probe_dir, self._probe_dir, os.getpid())
        return self._probe_dir

    def anchors(self, toolchain: Toolchain) -> Anchors:
        found = self._anchors.get(toolchain)
        if found is None:
            found = root_policy.build_anchors(self.source_roots, toolchain.roots, link_roots=toolchain.link_roots)
            self._anchors[toolchain] = found
        return found

    def _read_roots(self, source_roots: Sequence[str], toolchain_roots: tuple[str, ...]) -> list[str]:
        """Resolved: the shim silently skips a path that does not exist as given ("~/x",
        relative). Toolchain roots were resolved by the probe; source roots are
        resolved again on every compile (a re-pointed symlink takes effect at once)."""
        tc = self._toolchain_roots.get(toolchain_roots)
        if tc is None:
            tc = self._toolchain_roots[toolchain_roots] = [os.path.realpath(r) for r in toolchain_roots]
        return [*(os.path.realpath(os.path.expanduser(r)) for r in source_roots), *tc]

    def close(self) -> None:
        self.sandbox.close()  # (a shim that background work starts after this is ended at once)
        settle()
        self.backend.close()
        if self.disk.spares is not None:
            self.disk.spares.discard_all()
        if self._probe_cleanup is not None:
            self._probe_cleanup()

    def runner(
        self,
        config: Config,
        env: Sequence[tuple[str, str]],
        toolchain_roots: Sequence[str] = (),
        on_start: Callable[[], None] | None = None,
        on_closed: Callable[[str, bytes], None] | None = None,
    ) -> Runner:
        """Run argv lists in the sandbox: fixed PATH, TMPDIR in the work dir, only
        ``env_passthrough`` variables; read access to the source roots. ``on_start``
        runs once, when the first process has started; ``on_closed(path, data)`` while
        a process runs, when it has closed a file the step named in ``watch``."""
        pending = [on_start] if on_start is not None else []
        base_env = {"PATH": SYSTEM_PATH, "LC_ALL": "C", **dict(env)}
        roots = self._read_roots(config.source_roots, tuple(toolchain_roots))

        def run(
            argv: Sequence[str],
            *,
            cwd: str,
            timeout: float | None = None,
            extra_read: Sequence[str] = (),
            watch: Sequence[str] = (),
        ) -> RunOutcome:
            where = cwd or self.probe_dir
            tmp = os.path.join(where, ".tmp")
            os.makedirs(tmp, mode=0o700, exist_ok=True)  # (private: see the shim's hand_over)
            return self.sandbox.run(
                argv,
                cwd=where,
                env={**base_env, "TMPDIR": tmp},
                timeout=timeout or config.compile_timeout_s,
                read_roots=[*roots, *extra_read],
                write_roots=[where],
                on_start=pending.pop() if pending else None,
                watch=watch,
                on_closed=on_closed,
            )

        return run


def _remove_probe_dir(path: str, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)
