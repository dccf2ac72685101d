"""The walls around a compiler (issue 15, class 6): no network of any kind, never root,
a scratch bounded in total, bounded processes, no namespace, mount or other process of
its own; and ``sandbox="required"`` refusing, before anything runs, where a wall is missing.

Each attack is a compiled "compiler" (``attack.c``) run through the Sandbox directly,
and run unconfined (``sandbox="off"``) as a control where that can succeed: a test
that cannot fail proves nothing. Run as root and as an unprivileged user (the last
test reruns this module as ``nobody`` when it can).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import safejit
from safejit.sandbox import runner as sandbox_mod
from safejit.sandbox import seccomp
from safejit.sandbox.runner import SYSTEM_PATH, Limits, RunResult, Sandbox
from tests.conftest import ADD_C
from tests.security._support import assert_nothing_published, needs_landlock, write_wrapper

ROOT = os.geteuid() == 0
_HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def attack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hostile program, in a directory the sandbox may read."""
    out = tmp_path_factory.mktemp("bin") / "attack"
    subprocess.run(["cc", "-O1", "-o", str(out), str(_HERE / "attack.c")], check=True)
    return out


@pytest.fixture(params=["c-shim", "python-shim"])
def sandboxes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Sandbox]]:
    """Sandboxes made in the test (by :func:`_sandbox`), with the C shim or its Python twin."""
    if request.param == "python-shim":
        if not os.access(os.path.realpath(sys.executable), os.X_OK):
            pytest.skip("this interpreter cannot be run again by this user (it lies in another's home)")
        monkeypatch.setattr(sandbox_mod, "_ensure_shim", lambda state, cc: None)
    made: dict[str, Sandbox] = {}
    yield made
    for sb in made.values():
        sb.close()


def _sandbox(made: dict[str, Sandbox], mode: str = "auto", **limits: int) -> Sandbox:
    key = f"{mode}{sorted(limits.items())}"
    if key not in made:
        made[key] = Sandbox(mode, cc=shutil.which("cc", path=SYSTEM_PATH), limits=Limits(**limits))
    return made[key]


def _run(sb: Sandbox, attack: Path, tmp_path: Path, *args: str, timeout: float = 30) -> RunResult:
    work = tmp_path / f"work-{time.monotonic_ns()}"
    work.mkdir()
    return sb.run(
        [str(attack), *args],
        cwd=str(work),
        env={"PATH": SYSTEM_PATH, "LC_ALL": "C"},
        timeout=timeout,
        read_roots=[str(attack.parent)],
        write_roots=[str(work)],
    )


def _outcome(result: RunResult, mode: str) -> str:
    """ "ok" or the errno name the attack reported."""
    found = re.search(rf"^RESULT {re.escape(mode)} (ok|errno=(\d+))", result.log, re.M)
    assert found, result.log
    return "ok" if found.group(1) == "ok" else os.strerror(int(found.group(2)))


def _full_walls(sb: Sandbox) -> None:
    if not (sb.walls.seccomp and sb.walls.scratch):
        pytest.skip(f"this system offers only {sb.describe()}")


@contextlib.contextmanager
def _udp_listener() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(0.3)
        yield s


def _received(s: socket.socket) -> bytes:
    try:
        return s.recv(64)
    except TimeoutError:
        return b""


# -- network ------------------------------------------------------------------------


def test_udp_datagram_to_localhost_is_refused(attack, tmp_path, sandboxes):
    sb = _sandbox(sandboxes)
    _full_walls(sb)
    with _udp_listener() as listener:
        port = str(listener.getsockname()[1])
        assert _outcome(_run(_sandbox(sandboxes, "off"), attack, tmp_path, "udp", port), "udp") == "ok"
        assert _received(listener) == b"pwned"  # the control got through
        assert _outcome(_run(sb, attack, tmp_path, "udp", port), "udp") == os.strerror(13)
        assert _received(listener) == b""


def test_tcp_connect_to_localhost_is_refused(attack, tmp_path, sandboxes):
    sb = _sandbox(sandboxes)
    _full_walls(sb)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = str(listener.getsockname()[1])
        assert _outcome(_run(_sandbox(sandboxes, "off"), attack, tmp_path, "tcp", port), "tcp") == "ok"
        assert _outcome(_run(sb, attack, tmp_path, "tcp", port), "tcp") == os.strerror(13)


@pytest.mark.parametrize("kind", ["unix", "unix-dgram", "socketpair"])
def test_pathname_unix_socket_outside_is_unreachable(attack, tmp_path, sandboxes, kind):
    """A listening socket reachable by path (a docker or systemd socket, say): neither a
    stream, nor a datagram, nor one sent from an unnamed socket pair gets there."""
    sb = _sandbox(sandboxes)
    _full_walls(sb)
    path = tmp_path / "listen.sock"
    stream = kind == "unix"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM if stream else socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        os.chmod(path, 0o777)  # (reachable by any uid: only the sandbox stands in the way)
        os.chmod(tmp_path, 0o755)
        if stream:
            listener.listen(4)
        listener.settimeout(0.3)
        control = _run(_sandbox(sandboxes, "off"), attack, tmp_path, kind, str(path))
        assert _outcome(control, kind) == "ok"
        if not stream:
            assert listener.recv(64) == b"pwned"
        result = _run(sb, attack, tmp_path, kind, str(path))
        assert _outcome(result, kind) == os.strerror(13)
        if not stream:
            with pytest.raises(TimeoutError):
                listener.recv(64)


def test_abstract_unix_socket_outside_is_unreachable(attack, tmp_path, sandboxes):
    sb = _sandbox(sandboxes)
    _full_walls(sb)
    name = f"safejit-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind("\0" + name)
        listener.listen(4)
        assert _outcome(_run(_sandbox(sandboxes, "off"), attack, tmp_path, "abstract", name), "abstract") == "ok"
        assert _outcome(_run(sb, attack, tmp_path, "abstract", name), "abstract") == os.strerror(13)


@pytest.mark.parametrize("family", ["netlink", "raw", "packet", "inet6"])
def test_socket_of_any_other_family_is_refused(attack, tmp_path, sandboxes, family):
    sb = _sandbox(sandboxes)
    _full_walls(sb)
    if ROOT or family in ("netlink", "inet6"):  # (raw and packet sockets need root outside)
        assert _outcome(_run(_sandbox(sandboxes, "off"), attack, tmp_path, family), family) == "ok"
    assert _outcome(_run(sb, attack, tmp_path, family), family) == os.strerror(13)


def test_io_uring_which_makes_sockets_without_socket_is_refused(attack, tmp_path, sandboxes):
    sb = _sandbox(sandboxes)
    _full_walls(sb)
    assert _outcome(_run(sb, attack, tmp_path, "io_uring"), "io_uring") == os.strerror(1)


# -- namespaces, mounts, other processes -------------------------------------------


@pytest.mark.parametrize("mode", ["unshare", "clone-ns"])
def test_a_namespace_of_its_own_is_refused(attack, tmp_path, sandboxes, mode):
    """(In a user and network namespace of its own, it could bring up a network.)"""
    sb = _sandbox(sandboxes)
    _full_walls(sb)
    assert _outcome(_run(_sandbox(sandboxes, "off"), attack, tmp_path, mode), mode) == "ok"
    assert _outcome(_run(sb, attack, tmp_path, mode), mode) == os.strerror(1)


def test_the_scratch_tmpfs_cannot_be_unmounted(attack, tmp_path, sandboxes):
    """Unmounted, the work dir beneath would be written without a bound."""
    sb = _sandbox(sandboxes)
    _full_walls(sb)
    result = _run(sb, attack, tmp_path, "umount", ".")
    assert _outcome(result, "umount") == os.strerror(1)


@pytest.mark.parametrize("mode", ["ptrace", "vmread"])
def test_another_process_cannot_be_traced_or_read(attack, tmp_path, sandboxes, mode):
    sb = _sandbox(sandboxes)
    _full_walls(sb)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        result = _run(sb, attack, tmp_path, mode, str(victim.pid))
        assert _outcome(result, mode) == os.strerror(1)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize(("machine", "header"), [("x86_64", "asm/unistd_64.h"), ("aarch64", "asm-generic/unistd.h")])
def test_seccomp_numbers_match_the_kernel_headers(machine, header):
    found = [p for p in Path("/usr/include").rglob(header.rsplit("/", 1)[1]) if str(p).endswith(header)]
    if not found:
        pytest.skip(f"no {header} here")
    text = found[0].read_text()
    for name, number in seccomp.SYSCALLS[machine].items():
        defined = re.search(rf"#define __NR(?:3264)?_{name}\s+(\d+)", text)
        assert defined and int(defined.group(1)) == number, name


# -- never root ----------------------------------------------------------------------


@pytest.mark.skipif(not ROOT, reason="the caller is not root")
def test_a_root_callers_compiler_runs_as_an_unprivileged_uid(attack, tmp_path, sandboxes):
    sb = _sandbox(sandboxes)
    if not sb.walls.userns:
        pytest.skip("no user namespace here")
    result = _run(sb, attack, tmp_path, "ids")
    assert _outcome(result, "ids") == "ok"
    work = max(tmp_path.glob("work-*"))
    made = os.stat(work / "owned-by-compiler")  # copied back: as this process made it ...
    assert made.st_uid == 0
    status = {k: v.strip() for k, _, v in (line.partition(":") for line in result.log.splitlines())}
    assert status["Groups"] == "0"
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
    # No capability but, under Landlock, CAP_DAC_READ_SEARCH (2), in its namespace only.
    allowed = 1 << 2 if sb.landlock else 0
    for field in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"):
        assert int(status[field], 16) & ~allowed == 0, (field, status[field])
    assert sb.describe().split("+")[-3] == f"uid-{sb.walls.uid}" and sb.walls.uid != 0


def test_the_lookup_recorder_is_held_open_for_the_program_whatever_user_it_runs_as(tmp_path, sandboxes):
    """The recorder lies in the caller's private state dir, which a compiler run as
    another user cannot walk to: the shim opens it first and leaves it open, read-only,
    on the descriptor the preload names."""
    sb = _sandbox(sandboxes)
    recorder = sb.recorder()
    if recorder is None:
        pytest.skip("no lookup recorder here")
    work = tmp_path / "work"
    work.mkdir()
    script = "head -c 4 /proc/self/fd/200 | od -An -c; echo > /proc/self/fd/200 || echo refused"
    result = sb.run(
        ["/bin/sh", "-c", script],
        cwd=str(work),
        env={"PATH": SYSTEM_PATH, "LC_ALL": "C", **sb.preload_env()},  # (a run that preloads it may read it)
        timeout=30,
        write_roots=[str(work)],
    )
    assert result.returncode == 0, result.log
    assert "177   E   L   F" in result.log and "refused" in result.log, result.log
    assert sb.preload_env() == {"LD_PRELOAD": "/proc/self/fd/200", "SAFEJIT_LOOKUPS": "safejit-lookups.rec"}


@pytest.mark.skipif(not ROOT, reason="the caller is not root")
def test_a_root_owned_file_in_a_write_root_is_not_writable(attack, tmp_path, sandboxes):
    """Landlock lets it write there; as root it could. It is not root."""
    sb = _sandbox(sandboxes)
    target_dir = tmp_path / "rootdir"
    target_dir.mkdir()
    target = target_dir / "config"
    target.write_text("root's\n")
    os.chmod(target, 0o644)
    os.chmod(tmp_path, 0o755)
    work = tmp_path / "w"
    work.mkdir()
    result = sb.run(
        [str(attack), "append", str(target)],
        cwd=str(work),
        env={"PATH": SYSTEM_PATH},
        timeout=30,
        read_roots=[str(attack.parent)],
        write_roots=[str(work), str(target_dir)],
    )
    assert _outcome(result, "append") == os.strerror(13)
    assert target.read_text() == "root's\n"


@pytest.mark.skipif(not ROOT, reason="the caller is not root")
def test_a_root_callers_compile_reads_root_only_roots_and_works(make_runtime, tmp_path, cache_dir):
    """Its source root is 0700 root's, as pytest's own directories are: under Landlock
    the unprivileged compiler still reads it (and finds its TMPDIR, which gcc checks
    with access(2))."""
    root = tmp_path / "proj"
    (root / "include").mkdir(parents=True)
    (root / "include" / "v.h").write_text("#define V 7\n")
    os.chmod(root, 0o700)
    rt = make_runtime(source_roots=(str(root),))
    if not rt._init()[0].sandbox.landlock:
        pytest.skip("without Landlock a root-only root is unreadable to the compiler, by design")
    src = safejit.Source('#include "v.h"\nint v(void) { return V; }\n', "v")
    assert rt.compile(src, include_dirs=(str(root / "include"),)).kernel("v")() == 7


# -- bounds --------------------------------------------------------------------------


def test_the_scratch_is_bounded_in_total_not_per_file(attack, tmp_path, sandboxes):
    """48 files of 1 MiB under a 1 MiB file-size limit: the limit is per file; the
    scratch (8 MiB here) is the bound in total, and no more comes back out."""
    sb = _sandbox(sandboxes, file_size=1 << 20, scratch_bytes=8 << 20)
    _full_walls(sb)
    control = _run(_sandbox(sandboxes, "off", file_size=1 << 20), attack, tmp_path, "fill", "48", str(1 << 20))
    assert "WROTE 50331648" in control.log  # 48 MiB: what the attack got before
    result = _run(sb, attack, tmp_path, "fill", "48", str(1 << 20))
    wrote = int(re.search(r"WROTE (\d+)", result.log).group(1))  # type: ignore[union-attr]
    assert wrote <= 8 << 20
    work = max(tmp_path.glob("work-*"))
    assert sum(f.stat().st_size for f in work.iterdir() if f.is_file()) <= 8 << 20


def test_the_scratch_is_bounded_in_inodes(attack, tmp_path, sandboxes):
    sb = _sandbox(sandboxes, scratch_inodes=100)
    _full_walls(sb)
    result = _run(sb, attack, tmp_path, "files", "1000")
    made = int(re.search(r"MADE (\d+)", result.log).group(1))  # type: ignore[union-attr]
    assert made < 100


def test_processes_are_bounded(attack, tmp_path, sandboxes):
    """A fork bomb stops at the run's process limit (counted per run: the caller's own
    processes do not count against it)."""
    sb = _sandbox(sandboxes, processes=16)
    if not sb.walls.nproc:
        pytest.skip(f"no process limit here ({sb.describe()})")
    helpers = [subprocess.Popen(["sleep", "30"]) for _ in range(20)]  # more than the limit, ours
    try:
        result = _run(sb, attack, tmp_path, "forks", "200")
    finally:
        for h in helpers:
            h.kill()
            h.wait()
    forked = int(re.search(r"FORKED (\d+)", result.log).group(1))  # type: ignore[union-attr]
    assert 0 < forked < 16
    assert _outcome(result, "forks") == os.strerror(11)  # EAGAIN


def test_address_space_is_bounded(attack, tmp_path, sandboxes):
    sb = _sandbox(sandboxes, address_space=256 << 20)
    assert _outcome(_run(_sandbox(sandboxes, "off"), attack, tmp_path, "alloc", "512"), "alloc") == "ok"
    assert _outcome(_run(sb, attack, tmp_path, "alloc", "512"), "alloc") == os.strerror(12)


# -- the wait (issue 17) ---------------------------------------------------------------


def test_a_compiler_killed_by_sigkill_ends_the_wait_at_once(attack, tmp_path, sandboxes):
    """The symptom: a wait that went on for the full timeout polling a compiler whose
    return code was already 137."""
    sb = _sandbox(sandboxes)
    started = time.monotonic()
    result = _run(sb, attack, tmp_path, "sigkill-self", timeout=60)
    assert result.returncode == 137
    assert time.monotonic() - started < 10


def test_a_straggler_holding_the_output_pipe_does_not_hold_the_wait(attack, tmp_path, sandboxes):
    sb = _sandbox(sandboxes)
    started = time.monotonic()
    result = _run(sb, attack, tmp_path, "straggler", timeout=60)
    assert _outcome(result, "straggler") == "ok"
    assert time.monotonic() - started < 10


# -- what the modes give ---------------------------------------------------------------


def test_auto_says_what_each_run_got(sandboxes, attack, tmp_path):
    sb = _sandbox(sandboxes)
    walls = sb.describe().split("+")
    assert walls[-1] == "rlimits"
    w = sb.walls
    expected = [f"landlock-v{min(sandbox_mod.landlock_abi(), w.landlock)}"] if sb.landlock else []
    expected += [n for n, on in (("seccomp", w.seccomp), ("userns", w.userns), ("tmpfs", w.scratch)) if on]
    expected += [f"uid-{w.uid}"] if ROOT else []
    expected += ["nproc"] if w.nproc else []
    assert walls == [*expected, "rlimits"]
    assert _run(sb, attack, tmp_path, "ids").walls == sb.describe()
    assert _sandbox(sandboxes, "off").describe() == "rlimits"


def _required(make_runtime, tmp_path: Path, marker: Path) -> safejit.Runtime:
    project = tmp_path / "p"
    project.mkdir(exist_ok=True)
    cc = write_wrapper(project, f"touch {marker}\nexit 1", name="cc-marker")
    return make_runtime(source_roots=(str(project),), host_cc=str(cc), sandbox="required")


@pytest.mark.parametrize(
    ("wall", "drop"),
    [("seccomp", ("-S",)), ("tmpfs", ("-T", "-i")), ("userns", ("-U", "-T", "-i"))],
)
def test_required_without_a_wall_refuses_before_any_compiler_runs(
    make_runtime, tmp_path, cache_dir, monkeypatch, wall, drop
):
    """The shim prepares no such wall (as where the kernel offers none): the Runtime
    refuses at once, naming it, and no compiler (nor its probe) runs."""
    ahead = sandbox_mod.Sandbox._ahead_options

    def without(self: Sandbox, fewer: bool = False) -> list[str]:
        opts = ahead(self, fewer)
        for flag in drop:
            if flag in opts:
                at = opts.index(flag)
                del opts[at : at + (1 if flag == "-U" else 2)]
        return opts

    monkeypatch.setattr(sandbox_mod.Sandbox, "_ahead_options", without)
    marker = tmp_path / "compiler-ran"
    with pytest.raises(safejit.SandboxUnavailableError) as exc:
        rt = _required(make_runtime, tmp_path, marker)
        rt.compile(safejit.Source(ADD_C, "add"))
    # (without a user namespace: no scratch tmpfs, and a process limit only where it
    # counts the unprivileged uid's processes: a root caller's compiler's)
    expected = {"userns": {"tmpfs"} | (set() if ROOT else {"nproc"})}.get(wall, {wall})
    assert set(exc.value.missing) == expected  # type: ignore[attr-defined]
    assert all(name in str(exc.value) for name in expected)
    assert not marker.exists()
    assert_nothing_published(cache_dir)


@needs_landlock
def test_required_with_every_wall_compiles(make_runtime, tmp_path, cache_dir):
    rt = make_runtime(sandbox="required")
    sb = rt._init()[0].sandbox
    if sb.missing():
        pytest.skip(f"this system lacks {sb.missing()}")
    assert rt.compile(safejit.Source(ADD_C, "add")).kernel("add")(2, 3) == 5


# -- as an unprivileged caller ---------------------------------------------------------


@pytest.mark.skipif(not ROOT or not shutil.which("setpriv"), reason="needs root and setpriv to become nobody")
@pytest.mark.skipif(os.environ.get("SAFEJIT_TEST_AS_NOBODY") == "1", reason="already nobody")
def test_the_walls_hold_for_an_unprivileged_caller():
    """This module again, run by nobody: the same walls without root (the uid tests skip)."""
    home = Path(tempfile.mkdtemp(prefix="safejit-nobody-"))  # (in /tmp: nobody can reach it)
    try:
        os.chown(home, 65534, 65534)
        env = {
            "PATH": SYSTEM_PATH,
            "HOME": str(home),
            "SAFEJIT_TEST_AS_NOBODY": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # (only what this module needs: others may not import as nobody)
        }
        become = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--"]
        probe = [*become, sys.executable, "-c", "import safejit, pytest, pytest_timeout"]
        can = subprocess.run(probe, cwd=str(_HERE.parent.parent), env=env, capture_output=True, text=True, check=False)
        if can.returncode != 0:  # (an interpreter under root's 0700 home: nobody cannot load it)
            pytest.skip(f"nobody cannot run {sys.executable} with safejit: {can.stderr.strip()[-200:]}")
        args = ["-q", "-p", "no:cacheprovider", "-p", "pytest_timeout", "--basetemp", str(home / "t")]
        args += ["-k", "not unprivileged_caller"]
        proc = subprocess.run(
            [*become, sys.executable, "-m", "pytest", *args, __file__],
            cwd=str(_HERE.parent.parent),
            env=env,
            capture_output=True,
            text=True,
            timeout=280,
            check=False,
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\d+ passed", proc.stdout), proc.stdout[-2000:]


@pytest.mark.skipif(not ROOT, reason="the caller is not root")
def test_a_root_callers_compile_works_without_a_user_namespace(make_runtime, tmp_path, cache_dir, monkeypatch):
    """Where no user namespace is to be had (a container's default seccomp profile), a
    root caller's compiler still never runs as root: it runs as the unprivileged uid in
    a work dir handed over to it, and reads what others may read."""
    ahead = sandbox_mod.Sandbox._ahead_options
    monkeypatch.setattr(
        sandbox_mod.Sandbox, "_ahead_options", lambda self, fewer=False: [o for o in ahead(self, fewer) if o != "-U"]
    )
    top = Path(tempfile.mkdtemp(prefix="safejit-open-"))  # (pytest's own dirs are root's, 0700)
    try:
        root = top / "proj"
        (root / "include").mkdir(parents=True)
        (root / "include" / "v.h").write_text("#define V 9\n")
        for p in (top, root, root / "include"):
            p.chmod(0o755)
        rt = make_runtime(source_roots=(str(root),))
        sb = rt._init()[0].sandbox
        assert not sb.walls.userns and sb.walls.uid != 0 and f"uid-{sb.walls.uid}" in sb.describe()
        src = safejit.Source('#include "v.h"\nint v(void) { return V; }\n', "v")
        assert rt.compile(src, include_dirs=(str(root / "include"),)).kernel("v")() == 9
    finally:
        shutil.rmtree(top)


def test_a_shim_start_failing_for_want_of_descriptors_keeps_every_wall(tmp_path):
    """``auto`` runs with fewer walls where one is missing; a shim that could not start for
    a moment's shortage (out of descriptors) made every later run of the process go on
    with fewer walls for good. Such a failure is that run's error, and the next run has
    all the walls it had."""
    import resource

    sb = Sandbox("auto", cc=shutil.which("cc", path=SYSTEM_PATH))
    work = tmp_path / "w"
    work.mkdir()

    def run() -> RunResult:
        return sb.run(["/bin/true"], cwd=str(work), env={"PATH": SYSTEM_PATH}, timeout=30, write_roots=[str(work)])

    try:
        assert run().returncode == 0
        walls = sb.describe()
        from safejit._background import settle

        settle()  # (the spare made ahead, taken away: the next run starts a shim of its own)
        with sb._spare_lock:
            spares, sb._spares[:] = list(sb._spares), []
        for shim in spares:
            shim.retire()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        held = []
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        try:
            with contextlib.suppress(OSError):
                while True:
                    held.append(os.open("/dev/null", os.O_RDONLY))
            with pytest.raises(safejit.SandboxUnavailableError):
                run()
        finally:
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert run().returncode == 0
        assert sb.describe() == walls and not sb._degraded
    finally:
        sb.close()


def test_auto_runs_with_fewer_walls_for_a_while_not_for_good(tmp_path, monkeypatch):
    """A shim that said it could not put a wall up (exit 126: a uid map refused, or out of
    processes or memory as it forked) made ``auto`` run every later compile of the process
    with fewer walls. It does so for a while, and each run says the walls it had; then all
    of them are tried again, a spare made meanwhile is not used, and runs get them back.
    A shim that failed to start without saying so (killed: a compiler of the same uid
    could; its report late) is that run's error, never fewer walls."""
    sb = Sandbox("auto", cc=shutil.which("cc", path=SYSTEM_PATH))
    work = tmp_path / "w"
    work.mkdir()

    def run() -> RunResult:
        return sb.run(["/bin/true"], cwd=str(work), env={"PATH": SYSTEM_PATH}, timeout=30, write_roots=[str(work)])

    from safejit._background import settle

    def no_spare() -> None:
        settle()
        with sb._spare_lock:
            spares, sb._spares[:] = list(sb._spares), []
        for shim in spares:
            shim.retire()

    try:
        assert run().returncode == 0
        walls = sb.describe()
        if "userns" not in walls:
            pytest.skip("no walls here to run with fewer of")
        real, failed = sandbox_mod.launch, []

        def launch(argv, **kwargs):
            if "-U" in argv and len(failed) < 2:
                error = sandbox_mod.ShimStartError(f"the sandbox shim did not start: {len(failed)}")
                error.verdict = bool(failed)  # (first killed, without a word; then its own exit 126)
                failed.append(argv)
                raise error
            return real(argv, **kwargs)

        monkeypatch.setattr(sandbox_mod, "launch", launch)
        no_spare()
        with pytest.raises(safejit.SandboxUnavailableError):
            run()
        assert not sb._degraded
        got = run()
        assert got.returncode == 0 and len(failed) == 2
        fewer = got.walls
        assert "userns" not in fewer and sb._degraded and sb.describe() == fewer
        assert run().walls == fewer  # (for a while; the spare made meanwhile has fewer too)
        sb._degraded_until = 0.0  # (the while has passed: the spare waiting has fewer walls)
        assert run().walls == walls and not sb._degraded
    finally:
        sb.close()


def _short_of(sb: Sandbox, wrapper: list[str], tmp_path: Path) -> None:
    """Runs through a shim started by ``wrapper`` (a shortage of its own: descriptors,
    processes) fail as the sandbox's error for a moment: nothing runs, ``auto`` keeps
    every wall, and a shim started as before runs with all of them again."""
    work = tmp_path / "w"
    work.mkdir(exist_ok=True)
    work.chmod(0o777)  # (the program may run as another uid)
    argv = ["/bin/sh", "-c", "echo ran > out"]

    def run() -> RunResult:
        return sb.run(argv, cwd=str(work), env={"PATH": SYSTEM_PATH}, timeout=30, write_roots=[str(work)])

    assert run().returncode == 0 and (work / "out").exists()
    walls = sb.describe()
    (work / "out").unlink()
    own = sb._executable()
    sb._exe = ([*wrapper, *own[0]], own[1])
    from safejit._background import settle

    settle()
    with sb._spare_lock:
        spares, sb._spares[:] = list(sb._spares), []
    for shim in spares:
        shim.retire()
    for _ in range(3):  # (a spare made meanwhile: short of the same)
        with pytest.raises(safejit.SandboxUnavailableError, match=r"Too many open files|temporarily unavailable"):
            run()
        assert not sb._degraded and not (work / "out").exists()
    sb._exe = own
    settle()
    with sb._spare_lock:
        spares, sb._spares[:] = list(sb._spares), []
    for shim in spares:
        shim.retire()
    assert run().returncode == 0 and sb.describe() == walls and (work / "out").exists()


@pytest.mark.parametrize("nofile", [3, 4, 6])
def test_a_shim_short_of_descriptors_says_so_and_keeps_every_wall(tmp_path, nofile):
    """A shim out of descriptors said it could not put a wall up (exit 126): before its
    report, ``auto`` ran every compile for ten minutes with fewer walls (as though the
    walls could not be had here); after it, the run was a ``ConfigError`` ("sandbox
    sandbox setup failed"). Either is now the sandbox's error for a moment (exit 123)."""
    prlimit = shutil.which("prlimit", path=SYSTEM_PATH)
    if prlimit is None:
        pytest.skip("no prlimit here")
    sb = Sandbox("auto", cc=shutil.which("cc", path=SYSTEM_PATH))
    try:
        if sb.walls.userns is False:
            pytest.skip("no walls here to run with fewer of")
        _short_of(sb, [prlimit, f"--nofile={nofile}:{nofile}", "--"], tmp_path)
    finally:
        sb.close()


@pytest.mark.skipif(not ROOT, reason="started as nobody by root: a limit on processes binds no root")
def test_a_shim_short_of_processes_says_so(tmp_path):
    """A shim that could not fork its program (out of processes: RLIMIT_NPROC) failed the
    run as a ``ConfigError``, or, where it died before taking the command, as a
    ``CompileError`` ("could not start /bin/sh: Broken pipe"): the user's compile blamed.
    It is the sandbox's error for a moment."""
    setpriv, prlimit = (shutil.which(p, path=SYSTEM_PATH) for p in ("setpriv", "prlimit"))
    if setpriv is None or prlimit is None:
        pytest.skip("no setpriv or prlimit here")
    sb = Sandbox("auto", cc=shutil.which("cc", path=SYSTEM_PATH))
    top = Path(tempfile.mkdtemp(prefix="safejit-test-"))  # (one nobody may walk to)
    try:
        top.chmod(0o755)
        if not sb.walls.userns:
            pytest.skip("no user namespace here")
        shim = top / "shim"
        shim.write_bytes(Path(sb._executable()[0][0]).read_bytes())
        shim.chmod(0o755)
        sb._recorder = (None,)  # (the recorder lies in root's private dir)
        sb._ids_known = (None,)  # (nobody already: no other uid to run as)
        nobody = ["--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        sb._exe = ([setpriv, *nobody, str(shim)], ())  # (as nobody, with processes to spare: runs)
        assert sb.run(["/bin/true"], cwd="/", env={"PATH": SYSTEM_PATH}, timeout=30).returncode == 0
        sb._exe = ([str(shim)], ())
        _short_of(sb, [setpriv, *nobody, prlimit, "--nproc=1:1", "--"], top)  # (a work dir nobody may open)
    finally:
        sb.close()
        shutil.rmtree(top)
