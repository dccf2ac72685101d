"""The sandboxed compiler run: scrubbed environment, process-group kill on
timeout, Landlock file and network rules, a private shim, closed stdin and no
shell. Misbehaving compilers are shell-script wrappers placed in the declared
source root and configured as ``Config.host_cc``.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

import safejit
import safejit.sandbox.runner as sandbox_mod
from safejit.cache import staging as spares
from safejit.cache.staging import settle
from safejit.sandbox import statedir
from safejit.sandbox.runner import SYSTEM_PATH, landlock_abi
from tests.conftest import ADD_C, assert_cache_sound, leaves, names_under
from tests.security._support import (
    SECRET_TOKEN,
    assert_no_secret,
    assert_nothing_published,
    needs_landlock,
    write_wrapper,
)

ADD = safejit.Source(ADD_C, "add")
#: The variables the sandbox itself sets, plus what /bin/sh adds on its own.
SANDBOX_ENV = {"PATH", "LC_ALL", "TZ", "TMPDIR", "PWD", "OLDPWD", "SHLVL", "_"}  # (TZ=UTC0: no zone file read)
#: Where the lookup recorder can run: it is preloaded from the descriptor the shim holds.
RECORDER_ENV = {"LD_PRELOAD": "/proc/self/fd/200", "SAFEJIT_LOOKUPS": "safejit-lookups.rec"}


def _rt(make_runtime, project: Path, **config) -> safejit.Runtime:
    return make_runtime(source_roots=(str(project),), **config)


def _env_names(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines() if re.match(r"[A-Za-z_][A-Za-z0-9_]*=", line))


def _gone(pid: int) -> bool:
    """Dead: no such process, or a zombie nobody has reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_compiler_environment_is_scrubbed(make_runtime, project, cache_dir, monkeypatch, outside):
    monkeypatch.setenv("SAFEJIT_TEST_SECRET", SECRET_TOKEN)
    monkeypatch.setenv("CPATH", str(outside))
    monkeypatch.setenv("C_INCLUDE_PATH", str(outside))
    monkeypatch.setenv("GCC_EXEC_PREFIX", str(outside) + "/")
    monkeypatch.setenv("DEPENDENCIES_OUTPUT", str(outside / "deps.d"))
    cc = write_wrapper(project, "echo ENV-DUMP; env; exit 1")
    rt = _rt(make_runtime, project, host_cc=str(cc))
    with pytest.raises(safejit.CompileError) as exc:
        rt.compile(ADD)
    assert "ENV-DUMP" in exc.value.log
    env = _env_names(exc.value.log)
    assert set(env) <= SANDBOX_ENV | set(RECORDER_ENV), sorted(set(env) - SANDBOX_ENV)
    assert {k: v for k, v in env.items() if k in RECORDER_ENV} in ({}, RECORDER_ENV)
    assert env["PATH"] == SYSTEM_PATH
    # The compile's own private scratch dir: in memory, or in the cache root. (The log names
    # what lies in it relative to it: CompileError keeps the work dir out of the log; the
    # argv, what ran, names it.)
    scratch = spares.memory_scratch() or str(cache_dir / "v1" / "tmp")
    workdir = exc.value.argv[exc.value.argv.index("-o") + 1].rsplit("/", 1)[0]
    assert workdir.startswith(scratch + f"/p{os.getpid()}." if spares.memory_scratch() else scratch + "/")
    assert env["TMPDIR"] == ".tmp" and env["PWD"] == "." and workdir not in exc.value.log
    assert str(outside) not in exc.value.log
    assert_no_secret(exc.value, exc.value.log)
    assert_nothing_published(cache_dir)


def test_header_reachable_only_through_cpath_is_not_found(make_runtime, project, cache_dir, monkeypatch, outside):
    (outside / "cpath_only.h").write_text(f"#define ONLY 7\n/* {SECRET_TOKEN} */\n")
    monkeypatch.setenv("CPATH", str(outside))
    monkeypatch.setenv("C_INCLUDE_PATH", str(outside))
    rt = _rt(make_runtime, project, sandbox="off")  # the environment alone must keep it out
    with pytest.raises(safejit.CompileError) as exc:
        rt.compile(safejit.Source('#include "cpath_only.h"\nint only(void) { return ONLY; }\n', "only"))
    assert "cpath_only.h: not found (or outside the declared roots)" in exc.value.log
    assert_no_secret(exc.value, exc.value.log)
    assert_nothing_published(cache_dir)


def test_env_passthrough_reaches_the_compiler_and_the_key(make_runtime, project, cache_dir, monkeypatch):
    cc = write_wrapper(project, 'exec /usr/bin/cc "$@" "-DKNOB=$SAFEJIT_TEST_KNOB"')
    src = safejit.Source("int knob(void) { return KNOB; }\n", "knob")
    keys, values = [], []
    for knob in ("1", "2"):
        monkeypatch.setenv("SAFEJIT_TEST_KNOB", knob)
        rt = _rt(make_runtime, project, host_cc=str(cc), env_passthrough=("SAFEJIT_TEST_KNOB",))
        keys.append(rt.build(src).build_key)
        values.append(rt.compile(src).kernel("knob")())
    assert keys[0] != keys[1]
    assert values == [1, 2]
    assert len(leaves(cache_dir)) == 2
    assert_cache_sound(cache_dir)


def test_hung_compiler_is_killed_with_its_process_group(make_runtime, project, cache_dir):
    cc = write_wrapper(project, 'sleep 100 &\necho "grandchild=$!"\necho "shell=$$"\nwait')
    rt = _rt(make_runtime, project, host_cc=str(cc), compile_timeout_s=1)
    started = time.monotonic()
    with pytest.raises(safejit.CompileTimeout) as exc:
        rt.compile(ADD)
    assert time.monotonic() - started < 10
    pids = {k: int(v) for k, v in re.findall(r"(grandchild|shell)=(\d+)", exc.value.log)}
    assert set(pids) == {"grandchild", "shell"}
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {name: _gone(pid) for name, pid in pids.items()} == {"grandchild": True, "shell": True}
    assert isinstance(exc.value, TimeoutError)
    assert_nothing_published(cache_dir)


@needs_landlock
def test_landlock_blocks_reads_and_writes_outside_roots(make_runtime, project, cache_dir, outside):
    body = (
        "echo WRAPPER-RAN\n"
        f"cat {outside / 'secret'}\n"
        f"echo pwned > {outside / 'pwned'}\n"
        f"echo pwned > {project / 'pwned'}\n"
        f"echo pwned > {cache_dir / 'pwned'}\n"
        "exit 1"
    )
    cc = write_wrapper(project, body)
    rt = _rt(make_runtime, project, host_cc=str(cc))
    with pytest.raises(safejit.CompileError) as exc:
        rt.compile(ADD)
    log = exc.value.log
    assert "WRAPPER-RAN" in log
    assert log.count("Permission denied") == 4
    assert_no_secret(exc.value, log)
    assert not (outside / "pwned").exists()
    assert not (project / "pwned").exists()  # source roots are read-only
    assert not (cache_dir / "pwned").exists()  # only the staging dir is writable
    assert_nothing_published(cache_dir)


@needs_landlock
def test_landlock_denies_tcp_connect_to_localhost(make_runtime, project, cache_dir):
    if sandbox_mod.landlock_abi() < 4:
        pytest.skip("Landlock network rules need ABI 4")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        body = f"if exec 3<>/dev/tcp/127.0.0.1/{port}; then echo CONNECTED; else echo REFUSED; fi\nexit 1"
        cc = write_wrapper(project, body, shell="/bin/bash")

        control = _rt(make_runtime, project, host_cc=str(cc), sandbox="off")  # the wrapper can connect
        with pytest.raises(safejit.CompileError) as unconfined:
            control.compile(ADD)
        assert "CONNECTED" in unconfined.value.log
        conn, _ = listener.accept()
        conn.close()

        rt = _rt(make_runtime, project, host_cc=str(cc))
        with pytest.raises(safejit.CompileError) as exc:
            rt.compile(ADD)
        assert "REFUSED" in exc.value.log and "CONNECTED" not in exc.value.log
        with pytest.raises(TimeoutError):
            listener.accept()
    assert_nothing_published(cache_dir)


@needs_landlock
def test_sandbox_required_compiles_under_landlock(make_runtime, project, cache_dir):
    rt = _rt(make_runtime, project, sandbox="required")
    assert rt.compile(ADD).kernel("add")(2, 3) == 5
    assert len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)


def test_sandbox_required_without_landlock_is_refused(make_runtime, project, cache_dir, monkeypatch):
    monkeypatch.setattr(sandbox_mod, "landlock_abi", lambda: 0)
    rt = _rt(make_runtime, project, sandbox="required")
    with pytest.raises(safejit.SandboxUnavailableError):
        rt.compile(ADD)
    with pytest.raises(safejit.SandboxUnavailableError):  # and again: no half-initialised state
        rt.compile(ADD)
    assert rt.stats()["compiles"] == 0
    assert_nothing_published(cache_dir)


def test_shim_is_built_in_the_private_state_dir_outside_the_cache(make_runtime, project, cache_dir):
    rt = _rt(make_runtime, project)
    rt.compile(ADD)
    state = Path(statedir.state_dir().shown)
    assert not state.is_relative_to(cache_dir)
    assert names_under(cache_dir, "shim-*") == []
    shims = list(state.glob("shim-*"))
    assert len(shims) == 1
    st = os.lstat(state)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
    assert stat.S_IMODE(st.st_mode) & 0o077 == 0
    sst = os.lstat(shims[0])
    assert stat.S_ISREG(sst.st_mode) and sst.st_uid == os.geteuid()
    assert stat.S_IMODE(sst.st_mode) & 0o077 == 0
    assert [p.name for p in state.iterdir() if p.name.endswith(".tmp")] == []  # no leftover build file


@pytest.mark.parametrize("hijack", ["world-writable", "foreign-owner", "symlink"])
def test_planted_shim_in_a_shared_tools_dir_is_not_run(make_runtime, project, cache_dir, tmp_path, hijack):
    """Someone who controls ``v1/tools/u<uid>`` plants a shim there: it must not run."""
    marker = tmp_path / "planted-shim-ran"
    tools = cache_dir / "v1" / "tools"
    tools.mkdir(parents=True)
    private = tools / f"u{os.geteuid()}"
    planted_dir = tmp_path / "attacker" if hijack == "symlink" else private
    planted_dir.mkdir()
    if hijack == "symlink":
        private.symlink_to(planted_dir, target_is_directory=True)
    for tag in ("", *_shim_tags()):
        planted = planted_dir / f"shim-{tag}"
        planted.write_text(f'#!/bin/sh\ntouch {marker}\nwhile [ "$1" != -- ]; do shift; done; shift; exec "$@"\n')
        planted.chmod(0o755)
    if hijack == "world-writable":
        planted_dir.chmod(0o777)
    elif hijack == "foreign-owner":
        os.chown(planted_dir, 65534, 65534)
        for planted in planted_dir.iterdir():
            os.chown(planted, 65534, 65534)
    rt = _rt(make_runtime, project)
    assert rt.compile(ADD).kernel("add")(2, 3) == 5
    assert not marker.exists()
    assert_cache_sound(cache_dir)


def _shim_tags() -> list[str]:
    """The tags the shim would be stored under for the compilers this test may use."""
    import shutil
    from importlib import resources

    from safejit.keys import digest_bytes
    from safejit.sandbox._shim_build import shim_name

    source = resources.files("safejit.sandbox").joinpath("shim.c").read_bytes()
    ccs = {c for c in (shutil.which("cc", path=SYSTEM_PATH), "/usr/bin/cc") if c}
    return [digest_bytes(source + b"\0" + cc.encode())[:16] for cc in ccs] + [
        shim_name(cc).removeprefix("shim-") for cc in ccs
    ]


def test_compiler_stdin_is_closed(make_runtime, project, cache_dir):
    body = 'if IFS= read -r line; then echo "STDIN-GOT:$line"; else echo STDIN-EOF; fi\nexit 1'
    cc = write_wrapper(project, body)
    rt = _rt(make_runtime, project, host_cc=str(cc), compile_timeout_s=20)
    read_end, write_end = os.pipe()
    os.write(write_end, f"{SECRET_TOKEN}\n".encode())  # what the compiler would see if it inherited fd 0
    saved = os.dup(0)
    try:
        os.dup2(read_end, 0)
        with pytest.raises(safejit.CompileError) as exc:
            rt.compile(ADD)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert "STDIN-EOF" in exc.value.log
    assert "STDIN-GOT" not in exc.value.log
    assert_no_secret(exc.value.log)
    assert_nothing_published(cache_dir)


def test_shell_metacharacters_in_defines_and_flags_are_not_run(make_runtime, project, cache_dir, tmp_path):
    markers = [tmp_path / f"pwned{i}" for i in range(4)]
    values = {
        "X": f"$(touch {markers[0]})",
        "Y": f"1; touch {markers[1]}",
        "Z": f"`touch {markers[2]}`",
    }
    flag_value = f"1 && touch {markers[3]}"
    code = (
        "#define S_(x) #x\n#define S(x) S_(x)\n"
        "const char *x(void) { return S(X); }\n"
        "const char *y(void) { return S(Y); }\n"
        "const char *z(void) { return S(Z); }\n"
        "const char *w(void) { return S(W); }\n"
    )
    rt = _rt(make_runtime, project, sandbox="off")  # no Landlock to hide a shell's side effects
    mod = rt.compile(safejit.Source(code, "meta"), defines=values, flags=[f"-DW={flag_value}"])
    got = {n: mod.kernel(n.lower(), restype=ctypes.c_char_p)().decode() for n in ("X", "Y", "Z", "W")}
    assert got == {**values, "W": flag_value}  # arrived byte for byte, as one argv item each
    assert [m for m in markers if m.exists()] == []
    assert len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)


@needs_landlock
def test_compiler_that_cannot_build_the_shim_still_runs_landlocked(make_runtime, project, cache_dir, outside):
    cc = project / "cc-noshim"
    cc.write_text(
        "#!/bin/sh\n"
        'case "$*" in *shim.c*) echo "no shim for you" >&2; exit 1;; esac\n'
        'case "$*" in *"-MD -MF"*) ;; *) exec /usr/bin/cc "$@";; esac\n'
        f"echo WRAPPER-RAN; cat {outside / 'secret'}; exit 1\n"
    )
    cc.chmod(0o755)
    rt = _rt(make_runtime, project, host_cc=str(cc))
    with pytest.raises(safejit.CompileError) as exc:
        rt.compile(ADD)
    assert "WRAPPER-RAN" in exc.value.log
    assert_no_secret(exc.value.log)
    assert_nothing_published(cache_dir)


@pytest.mark.parametrize("ending", ["timeout", "normal-exit"])
def test_process_that_leaves_the_group_with_setsid_is_still_killed(make_runtime, project, cache_dir, ending):
    tail = "wait" if ending == "timeout" else "exit 1"
    cc = write_wrapper(project, f'setsid sleep 100 &\necho "escapee=$!"\n{tail}')
    rt = _rt(make_runtime, project, host_cc=str(cc), compile_timeout_s=1)
    error = safejit.CompileTimeout if ending == "timeout" else safejit.CompileError
    with pytest.raises(error) as exc:
        rt.compile(ADD)
    (pid,) = [int(p) for p in re.findall(r"escapee=(\d+)", exc.value.log)]
    deadline = time.monotonic() + 5
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid)
    assert_nothing_published(cache_dir)


@needs_landlock
def test_sandboxed_compiler_cannot_signal_outside_processes(make_runtime, project, cache_dir):
    if landlock_abi() < 6:
        pytest.skip("signal scoping needs Landlock ABI 6")
    victim = subprocess.Popen(["sleep", "60"])
    try:
        cc = write_wrapper(project, f"kill -TERM {victim.pid} && echo SENT || echo DENIED\nexit 1")
        rt = _rt(make_runtime, project, host_cc=str(cc))
        with pytest.raises(safejit.CompileError) as exc:
            rt.compile(ADD)
        assert "DENIED" in exc.value.log and "SENT" not in exc.value.log
        assert victim.poll() is None  # still alive
    finally:
        victim.kill()
        victim.wait()
    assert_nothing_published(cache_dir)


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD",
        "GCC_EXEC_PREFIX",
        "CPATH",
        "DEPENDENCIES_OUTPUT",
        "PATH",
        "NVCC_APPEND_FLAGS",
        "LD_AUDIT",
        # nvcc.profile's: appended to nvcc's phases through its shell, unquoted
        "PTXAS_FLAGS",
        "CUDAFE_FLAGS",
        "INCLUDES",
        "SYSTEM_INCLUDES",
        "LIBRARIES",
    ],
)
def test_passthrough_of_a_variable_that_acts_as_a_flag_is_refused(name):
    with pytest.raises(safejit.ConfigError, match=name):
        safejit.Config(env_passthrough=(name,))


def test_python_shim_fallback_keeps_landlock_and_reaping(make_runtime, project, cache_dir, outside, monkeypatch):
    from safejit.sandbox import runner as sandbox

    monkeypatch.setattr(sandbox, "_ensure_shim", lambda tools_dir, cc: None)
    cc = write_wrapper(project, f'setsid sleep 100 &\necho "escapee=$!"\ncat {outside / "secret"}\nexit 1')
    rt = _rt(make_runtime, project, host_cc=str(cc))
    with pytest.raises(safejit.CompileError) as exc:
        rt.compile(ADD)
    if landlock_abi() > 0:
        assert "Permission denied" in exc.value.log
    assert_no_secret(exc.value.log)
    (pid,) = [int(p) for p in re.findall(r"escapee=(\d+)", exc.value.log)]
    deadline = time.monotonic() + 5
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid)
    ok = _rt(make_runtime, project)
    assert ok.compile(ADD).kernel("add")(2, 3) == 5
    assert len(leaves(cache_dir)) == 1


@needs_landlock
def test_a_shim_started_ahead_sandboxes_its_run_like_a_fresh_one(tmp_path, outside):
    """The shim that waits for the next run (-R) gets its limits, Landlock rules, working
    dir and environment with the command: nothing of it is decided before."""
    import shutil

    sb = sandbox_mod.Sandbox("auto", cc=shutil.which("cc"))
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": SYSTEM_PATH, "LC_ALL": "C", "TMPDIR": str(work)}
    assert sb.run(["/bin/true"], cwd=str(work), env=env, timeout=30, write_roots=[str(work)]).returncode == 0
    settle()  # the next shim is started in the background
    assert sb._spare is not None, "no shim was started ahead"
    waiting = sb._spare.proc
    script = (
        f"pwd; env; cat {outside / 'secret'}; echo pwned > {outside / 'pwned'}; "
        "cat; ulimit -v; exit 3"  # stdin is /dev/null: cat ends at once
    )
    result = sb.run(["/bin/sh", "-c", script], cwd=str(work), env=env, timeout=30, write_roots=[str(work)])
    try:
        waiting.wait(timeout=10)  # (reaped in the background once it has reported the run's end)
        assert waiting.returncode == 3, "the run did not go to the waiting shim"
        assert result.returncode == 3
        lines = result.log.splitlines()
        assert lines[0] == str(work)
        names = {line.split("=", 1)[0] for line in lines if "=" in line}
        assert names <= SANDBOX_ENV, sorted(names - SANDBOX_ENV)
        assert result.log.count("Permission denied") == 2
        assert str(sb.limits.address_space // 1024) in lines  # ulimit -v, in KiB
        assert_no_secret(result.log)
        assert not (outside / "pwned").exists()
    finally:
        sb.close()
    assert sb._spare is None


#: Runs the real compile, then replaces its output (``-o``) with $1 of the body's choosing.
_SWAP_OUTPUT = (
    'prev=""\n'
    'for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\n'
    '/usr/bin/cc "$@" || exit $?\n'
    'rm -f "$out"\n'
)


def test_an_output_swapped_for_a_symlink_out_is_never_read(make_runtime, project, cache_dir, outside):
    """The compiler's output turned into a symlink to a file outside the roots: that file
    must not be read in place of the artifact (nor published as one)."""
    cc = write_wrapper(project, _SWAP_OUTPUT + f'ln -s {outside / "secret"} "$out"\n')
    rt = _rt(make_runtime, project, host_cc=str(cc))
    with pytest.raises(safejit.CompileError) as exc:
        rt.compile(ADD)
    assert "compiler output" in str(exc.value)
    assert_no_secret(exc.value, exc.value.log)
    assert_nothing_published(cache_dir)


def test_an_output_swapped_for_a_fifo_does_not_hang_the_caller(make_runtime, project, cache_dir):
    """A FIFO in place of the output would block a plain open() for reading forever. (In
    the scratch tmpfs, it is not even copied out: only regular files are.)"""
    cc = write_wrapper(project, _SWAP_OUTPUT + 'mkfifo "$out"\n')
    rt = _rt(make_runtime, project, host_cc=str(cc))
    with pytest.raises(safejit.CompileError) as exc:
        rt.compile(ADD)
    assert re.search("not a regular file|compiler output missing", str(exc.value))
    assert_nothing_published(cache_dir)
