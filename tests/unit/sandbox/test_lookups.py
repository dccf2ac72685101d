"""The lookup recorder (safejit.sandbox.lookups): every path a process looks up, by
whatever route, is recorded — or refused; never missed."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from safejit.backends.cuda.recorded import sort_lookups
from safejit.sandbox import lookups
from safejit.sandbox.statedir import StateDir
from tests.conftest import CLANG

CC = shutil.which("cc", path="/usr/local/bin:/usr/bin:/bin")
pytestmark = pytest.mark.skipif(CC is None or not lookups.supported(), reason="no C compiler or no seccomp")


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> str:
    private = tmp_path_factory.mktemp("state")
    private.chmod(0o700)
    built = lookups.build(StateDir(os.open(private, os.O_RDONLY | os.O_DIRECTORY), str(private)), CC)
    assert built is not None
    return built


def _run(library: str, body: str, tmp_path: Path) -> dict:
    """Run ``body`` in a fresh process with the recorder installed and recording;
    returns its JSON output plus the records."""
    script = (
        textwrap.dedent(
            """
        import ctypes, json, os, sys, threading
        from safejit.sandbox.lookups import Recorder
        out = {}
        rec = Recorder(sys.argv[1])
        rec.install()
        rec.begin()
        """
        )
        + textwrap.dedent(body)
        + textwrap.dedent(
            """
        out["records"] = [[r.kind, r.path, r.error] for r in rec.end()]
        print(json.dumps(out))
        """
        )
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, library], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_lookups_by_every_route_are_recorded_with_their_outcome(library, tmp_path):
    (tmp_path / "there.h").write_text("x")
    got = _run(
        library,
        f"""
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        base = {str(tmp_path)!r}
        os.path.exists(base + "/missing-stat.h")                     # stat through Python
        libc.fopen((base + "/there.h").encode(), b"r")                 # fopen: libc's own open
        libc.fopen((base + "/missing-fopen.h").encode(), b"r")
        if os.uname().machine == "x86_64":
            libc.syscall(257, -100, (base + "/raw-openat.h").encode(), 0)  # a raw openat(2), not libc's
        os.access(base + "/missing-access.h", os.R_OK)
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.stat("there.h", dir_fd=fd)                              # relative to a directory fd
        finally:
            os.close(fd)
        t = threading.Thread(target=lambda: os.path.exists(base + "/from-a-thread.h"))
        t.start(); t.join()
        """,
        tmp_path,
    )
    seen = {(kind, os.path.basename(path), error) for kind, path, error in got["records"]}
    assert ("stat", "missing-stat.h", 2) in seen
    assert ("open", "there.h", 0) in seen
    assert ("open", "missing-fopen.h", 2) in seen
    assert ("stat", "from-a-thread.h", 2) in seen
    assert ("access", "missing-access.h", 2) in seen
    assert ("stat", "there.h", 0) in seen
    if os.uname().machine == "x86_64":
        assert ("open", "raw-openat.h", 2) in seen
    dir_fd_stat = next(path for kind, path, _ in got["records"] if kind == "stat" and path.endswith("there.h"))
    assert dir_fd_stat == str(tmp_path / "there.h")  # made absolute


def test_what_would_escape_the_record_is_refused(library, tmp_path):
    (tmp_path / "kept").write_text("")
    got = _run(
        library,
        """
        calls = [("fork", os.fork), ("mkdir", lambda: os.mkdir("made"))]
        calls.append(("exec", lambda: os.execv("/bin/true", ["true"])))
        calls.append(("rename", lambda: os.rename("kept", "moved")))
        for name, call in calls:
            try:
                pid = call()
                if pid == 0:
                    os._exit(0)
                out[name] = "allowed"
            except OSError as exc:
                out[name] = exc.errno
        """,
        tmp_path,
    )
    assert got["fork"] == got["mkdir"] == got["exec"] == got["rename"] == 1  # EPERM
    assert not (tmp_path / "made").exists() and (tmp_path / "kept").exists()


def test_a_handler_of_its_own_for_sigsys_is_refused_and_recording_goes_on(library, tmp_path):
    """LLVM sets handlers for SIGSYS (its crash reports): the trapped lookups then went
    to it, and clang's preprocessor died at its first stat. Setting one is refused;
    asking which is set is not."""
    got = _run(
        library,
        f"""
        import signal
        try:
            signal.signal(signal.SIGSYS, lambda *a: None)
            out["set"] = "allowed"
        except OSError as exc:
            out["set"] = exc.errno
        libc = ctypes.CDLL(None, use_errno=True)
        old = ctypes.create_string_buffer(256)
        out["query"] = libc.sigaction(signal.SIGSYS, None, old)
        os.path.exists({str(tmp_path / "after.h")!r})
        """,
        tmp_path,
    )
    assert got["set"] == 1 and got["query"] == 0  # EPERM; a query answered
    assert ["stat", str(tmp_path / "after.h"), 2] in got["records"]


def test_a_fifo_where_a_header_was_is_refused_not_a_hang(library, tmp_path):
    os.mkfifo(tmp_path / "fifo.h")
    got = _run(
        library,
        f"try:\n    open({str(tmp_path / 'fifo.h')!r})\nexcept OSError as exc:\n    out['errno'] = exc.errno\n",
        tmp_path,
    )
    assert got["errno"] == 22  # EINVAL: not a regular file


def test_records_that_are_malformed_raise():
    good = struct.pack("<IiqI", 20 + 3, 1, 0, 0) + b"a.h"
    assert lookups.parse(good) == [lookups.Lookup("open", "a.h", 0, 0)]
    for bad in (good[:-1], struct.pack("<IiqI", 19, 1, 0, 0), struct.pack("<IiqI", 23, 99, 0, 0) + b"a.h"):
        with pytest.raises(ValueError):
            lookups.parse(bad)


def test_sorting_lookups_into_reads_found_absent_and_denied():
    rows = [
        ("stat", 2, 0, "/r/a/x.h"),  # looked for in an earlier dir, not there
        ("stat", 0, 0, "/r/b/x.h"),
        ("open", 0, os.O_RDONLY, "/r/b/x.h"),
        ("stat", 0, 0, "/r/probe.h"),  # __has_include: found, never read
        ("stat", 0, 0, "/r/b"),  # a search dir
        ("open", 13, os.O_RDONLY, "/etc/passwd"),
        ("open", 2, os.O_RDONLY, "/nonexistent-safejit-nvrtc/y.h"),  # NVRTC's made-up program dir
        ("open", 0, os.O_RDONLY | os.O_DIRECTORY, "/r/listed"),
    ]
    reads = sort_lookups(rows, is_dir=lambda p: p in ("/r/b", "/r/listed"))
    assert reads.deps == ("/r/b/x.h", "/r/probe.h")
    assert reads.absent == ("/r/a/x.h",)
    assert reads.denied == ("/etc/passwd",)
    assert reads.unknown == ("/r/listed",)


STRACE = shutil.which("strace")


@pytest.mark.skipif(STRACE is None, reason="no strace")
def test_an_nvrtc_compile_records_exactly_what_the_kernel_saw(library, tmp_path):
    """strace's view of the same compile: every path syscall in the recorded window,
    and nothing else, is in the record."""
    pytest.importorskip("cuda.bindings.nvrtc")
    inc = tmp_path / "inc"
    (inc / "sub").mkdir(parents=True)
    (inc / "a.h").write_text('#include "sub/b.h"\n#if __has_include(<nope.h>)\n#error\n#endif\n')
    (inc / "sub" / "b.h").write_text("#include <cuda/std/cstdint>\n#define B 2\n")
    from safejit.backends.cuda.backend import CudaBackend

    search = [str(inc), *CudaBackend()._include_dir()]
    script = textwrap.dedent(
        """
        import json, os, sys
        from safejit.backends.cuda.nvrtc import NvrtcRequest, nvrtc_compile_once
        from safejit.sandbox.lookups import Recorder
        opts = ["--gpu-architecture=sm_90"] + ["-I" + d for d in json.loads(sys.argv[2])]
        nvrtc_compile_once(NvrtcRequest(b"__global__ void w() {}", "w", opts[:1], []))
        rec = Recorder(sys.argv[1]); rec.install()
        os.path.exists("/safejit-window-begins")
        rec.begin()
        r = nvrtc_compile_once(NvrtcRequest(b'#include <a.h>\\n__global__ void k(int* p) { *p = B; }', "k", opts, []))
        found = rec.end()
        os.path.exists("/safejit-window-ends")
        assert r.ok, r.log
        print(json.dumps([[f.path, f.error] for f in found]))
        """
    )
    trace = tmp_path / "trace"
    proc = subprocess.run(
        [
            STRACE,
            "-f",
            "-qq",
            "-e",
            "trace=%file",
            "-o",
            str(trace),
            sys.executable,
            "-c",
            script,
            library,
            json.dumps(search),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    recorded = {(os.path.normpath(os.path.join(str(tmp_path), p)), e != 0) for p, e in json.loads(proc.stdout)}
    lines = trace.read_text().splitlines()
    begin = max(i for i, line in enumerate(lines) if "/safejit-window-begins" in line)
    end = min(i for i, line in enumerate(lines) if "/safejit-window-ends" in line)
    # Each lookup shows twice: attempted (and trapped: a SIGSYS follows), then made by the
    # handler. A path syscall made without a trap would have escaped the record.
    attempted, made, untrapped = set(), set(), []
    last: dict[str, str] = {}  # pid -> what its previous line was
    window = lines[begin + 1 : end]
    for i, line in enumerate(window):
        pid = line.split(" ", 1)[0]
        if "--- SIGSYS" in line:
            last[pid] = "trap"
            continue
        m = re.match(r'^\d+\s+(\w+)\((?:AT_FDCWD, |\d+, )?"([^"]*)".*= (-?\d+)', line)
        if not m or not m.group(2) or m.group(1) == "getcwd":  # (getcwd's string is what it returns)
            last[pid] = "other"
            continue
        path = os.path.normpath(os.path.join(str(tmp_path), m.group(2)))
        trapped_next = any(w.startswith(pid + " ") and "--- SIGSYS" in w for w in window[i + 1 : i + 2])
        if trapped_next:
            attempted.add(path)
            last[pid] = "attempt"
        elif last.get(pid) == "trap":
            made.add((path, m.group(3) == "-1"))
            last[pid] = "made"
        else:
            untrapped.append(line)
    assert untrapped == []
    assert made == recorded
    assert attempted == {p for p, _ in recorded}
    assert (str(inc / "sub" / "b.h"), False) in recorded
    assert any(p.endswith("/nope.h") and failed for p, failed in recorded)  # __has_include's negative


# -- preloaded into GCC's preprocessors ---------------------------------------------

_PASTED = (
    "#define HASINC(x) __has_include(x)\n#define CAT(a, b) a##b\n#define PROBE(n, h) CAT(HAS, n)(h)\n"
    "#if PROBE(INC, <feat.h>)\nint yes;\n#endif\n#include <one.h>\n"
)


def _preloaded_gcc(library: str, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C", **(lookups.preload_env(library) or {})}
    return subprocess.run(
        [str(CC), *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _pasted_project(tmp_path: Path) -> Path:
    """``t.c`` (a pasted probe of ``<feat.h>``, then ``<one.h>``), the include dirs
    ``first`` (empty) and ``inc`` (``one.h``): the run's directory, ``work``, made."""
    for d in ("first", "inc", "work"):
        (tmp_path / d).mkdir()
    (tmp_path / "inc/one.h").write_text("#define ONE 1\n")
    (tmp_path / "t.c").write_text(_PASTED)
    return tmp_path / "work"


def test_gccs_preprocessor_records_each_lookup_a_pasted_probe_made(library, tmp_path):
    """What no reading of the source can know (a probe whose macro's name token pasting
    made) the preprocessor's own lookups hold: not there, in each dir searched."""
    work = _pasted_project(tmp_path)
    proc = _preloaded_gcc(library, work, "-c", f"-I{tmp_path}/first", f"-I{tmp_path}/inc", "../t.c", "-o", "t.o")
    assert proc.returncode == 0 and "ld.so" not in proc.stderr, proc.stderr
    looked = dict(lookups.read_preloaded(str(work)) or ())
    assert looked[f"{tmp_path}/first/feat.h"] is False and looked[f"{tmp_path}/inc/feat.h"] is False
    assert looked[f"{tmp_path}/first/one.h"] is False and looked[f"{tmp_path}/inc/one.h"] is True
    assert looked[str(work / "../t.c")] is True  # (relative: from the run's directory)
    assert not [p for p in looked if os.path.normpath(p).startswith(f"{work}/")]  # (the run's own files: none)
    assert not [p for p in looked if p.endswith("t.o")]  # (opened to write: no lookup of an input)


@pytest.mark.skipif(CLANG is None, reason="no clang")
@pytest.mark.parametrize("language", ["c", "c++"])
def test_clangs_preprocessor_run_apart_records_each_lookup(library, tmp_path, language):
    """clang preprocesses in its driver's process unless told not to (-fno-integrated-cc1):
    then ``clang -cc1`` records, as GCC's cc1 does, and its object is renamed into place."""
    work = _pasted_project(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", **(lookups.preload_env(library) or {})}
    argv = [str(CLANG), "-fno-integrated-cc1", "-c", "-x", language, f"-I{tmp_path}/first", f"-I{tmp_path}/inc"]
    proc = subprocess.run(
        [*argv, "../t.c", "-o", "t.o"], cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert (work / "t.o").stat().st_size > 0
    looked = dict(lookups.read_preloaded(str(work)) or ())
    assert looked[f"{tmp_path}/first/feat.h"] is False and looked[f"{tmp_path}/inc/feat.h"] is False
    assert looked[f"{tmp_path}/inc/one.h"] is True
    # (preprocessing in the driver's own process: nothing recorded, nothing refused)
    inside = tmp_path / "inside"
    inside.mkdir()
    argv.remove("-fno-integrated-cc1")
    proc = subprocess.run(
        [*argv, "../t.c", "-o", "t.o"], cwd=inside, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0 and lookups.read_preloaded(str(inside)) is None, proc.stderr


@pytest.mark.skipif(CLANG is None, reason="no clang")
@pytest.mark.parametrize("case", ["response_file", "named_cc"])
def test_clangs_preprocessor_is_known_by_its_arguments(library, tmp_path, case):
    """A command line too long for one (a tenant's -D, -I) reaches ``clang -cc1`` in a
    response file (``clang @FILE``); a clang installed as ``cc`` is no "clang" by name:
    neither recorded, and the build was vouched for by reading the sources alone."""
    work = _pasted_project(tmp_path)
    compiler, extra = str(CLANG), []
    if case == "named_cc":
        (tmp_path / "bin").mkdir()
        compiler = str(tmp_path / "bin/cc")
        shutil.copy(os.path.realpath(str(CLANG)), compiler)
        extra = ["-nostdinc"]  # (its resource dir is where the real one is)
    else:
        extra = [f"-DLONG_MACRO_NAME_{i}=a_value_long_enough_to_need_a_response_file_{i}" for i in range(1600)]
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "TMPDIR": str(work), **(lookups.preload_env(library) or {})}
    argv = [compiler, "-fno-integrated-cc1", "-c", *extra, f"-I{tmp_path}/inc", "../t.c", "-o", "t.o"]
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    looked = dict(lookups.read_preloaded(str(work)) or ())
    assert looked.get(f"{tmp_path}/inc/feat.h") is False and looked.get(f"{tmp_path}/inc/one.h") is True


def test_only_gccs_preprocessors_record(library, tmp_path):
    """The driver, the assembler and the linker, and any other program, record nothing
    (nor refuse what they do: the recorder refuses exec, which a driver needs)."""
    (tmp_path / "t.c").write_text("int main(void) { return 0; }\n")
    proc = _preloaded_gcc(library, tmp_path, "-E", "-x", "c", "t.c", "-o", "t.i")  # (cc1 -E: records)
    assert proc.returncode == 0, proc.stderr
    assert lookups.read_preloaded(str(tmp_path)) is not None
    (tmp_path / lookups.PRELOAD_FILE).unlink()
    env = {"PATH": "/usr/bin:/bin", **(lookups.preload_env(library) or {})}
    done = subprocess.run(["/bin/sh", "-c", "ls / > /dev/null"], cwd=tmp_path, env=env, check=False)
    assert done.returncode == 0 and not (tmp_path / lookups.PRELOAD_FILE).exists()


def _records(*runs: list[tuple[int, int, int, bytes]], ended: bool = True) -> bytes:
    """Runs of ``(kind, result, flags, path)``, each between its begin and end records
    (kind 0; no end record with ``ended=False``: a process killed)."""
    out = b""
    for run in runs:
        for kind, result, flags, path in [(0, 1, 0, b""), *run, *([(0, 0, 0, b"")] if ended else [])]:
            out += struct.pack("<IiqI", 20 + len(path), kind, result, flags) + path
    return out


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # found, not there (ENOENT, ENOTDIR), readlink of a file (EINVAL: there), relative
        (
            _records([(1, 3, 0, b"/r/a.h"), (2, -2, 0, b"/r/b.h"), (3, -20, 0, b"/r/f/c.h"), (5, -22, 0, b"/r/d")]),
            (("/r/a.h", True), ("/r/b.h", False), ("/r/f/c.h", False), ("/r/d", True)),
        ),
        # opened to write, the run's own dir: not lookups of inputs
        (_records([(1, 3, os.O_WRONLY | os.O_CREAT, b"/r/o.s"), (2, 0, 0, b"k.c")]), ()),
        # denied (EACCES, EPERM: Landlock refused a file there, outside the roots): there
        (_records([(1, -13, 0, b"/x/y.h"), (2, -1, 0, b"/x/z.h")]), (("/x/y.h", True), ("/x/z.h", True))),
        # two runs (nvcc runs the preprocessor more than once): found in one, not the other
        (
            _records([(1, -2, 0, b"/r/a.h")], [(1, 3, 0, b"/r/a.h"), (2, 0, 0, b"../e.h")]),
            (("/r/a.h", None), ("/cwd/../e.h", True)),
        ),
    ],
)
def test_preloaded_records_are_read_into_paths_and_whether_they_were_there(tmp_path, data, expected):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / lookups.PRELOAD_FILE).write_bytes(data)
    got = lookups.read_preloaded(str(cwd))
    assert got == tuple((p.replace("/cwd", str(cwd)), f) for p, f in expected)


@pytest.mark.parametrize(
    "lost",
    [
        _records([(1, 3, 0, b"/r/a.h")])[:-2],  # (cut short)
        b"",  # (none finished)
        _records([(1, 3, 0, b"/r/a.h")], ended=False),  # (a preprocessor that began and never finished)
        _records([(1, 3, 0, b"/r/a.h")]) + _records([], ended=False),  # (one of two)
        struct.pack("<IiqI", 26, 1, 3, 0) + b"/r/a.h",  # (records with no begin nor end)
        "a symlink to what it may not read",
        "a FIFO, which would block the reader",
    ],
)
def test_lost_records_raise_and_none_is_no_records(tmp_path, lost):
    """Records lost (or a file the compiler put there to stall or exhaust the reader)
    are never read as fewer lookups: the build they belong to is then not vouched for."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    assert lookups.read_preloaded(str(cwd)) is None  # (no preprocessor ran with the recorder)
    where = cwd / lookups.PRELOAD_FILE
    if lost == "a symlink to what it may not read":
        where.symlink_to("/dev/zero")
    elif lost == "a FIFO, which would block the reader":
        os.mkfifo(where)
    else:
        where.write_bytes(lost)
    with pytest.raises(ValueError, match="lookups"):
        lookups.read_preloaded(str(cwd))


def test_a_killed_runs_records_are_read_to_the_last_whole_one(tmp_path):
    """Killed at its time limit, a preprocessor leaves no end record, and perhaps a
    last record torn by the kill (a lookup whose result it never saw): ``killed=True``
    reads what it looked up before; ``killed=False`` never vouches for it."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    data = _records([(1, 3, 0, b"/r/a.h")]) + _records([(2, -2, 0, b"/x/b.h"), (1, -13, 0, b"/x/c.h")], ended=False)
    for torn in (b"", struct.pack("<IiqI", 40, 1, -2, 0)[:7], struct.pack("<IiqI", 40, 1, -2, 0) + b"/x/d"):
        (cwd / lookups.PRELOAD_FILE).write_bytes(data + torn)
        assert lookups.read_preloaded(str(cwd), killed=True) == (("/r/a.h", True), ("/x/b.h", False), ("/x/c.h", True))
        with pytest.raises(ValueError, match="lookups"):
            lookups.read_preloaded(str(cwd))


def test_records_past_the_cap_are_lost_not_cut(tmp_path, monkeypatch):
    """A source can make a compile look up more paths than are read back, to hide one
    past the cap: that is ``LookupsLost`` (the build refused), not the records before it."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    data = _records([(2, -2, 0, b"/r/%d.h" % i) for i in range(100)])
    (cwd / lookups.PRELOAD_FILE).write_bytes(data)
    monkeypatch.setattr(lookups, "_PRELOAD_MAX", len(data) - 1)
    for killed in (False, True):
        with pytest.raises(lookups.LookupsLost):
            lookups.read_preloaded(str(cwd), killed=killed)


def test_a_preprocessor_whose_records_cannot_be_written_dies_before_it_sees_a_result(library, tmp_path):
    """Each lookup is written down before the program sees its result; one that cannot be
    (the file size limit, with SIGXFSZ ignored: EFBIG; a full disk) ends the process, so
    a compile never goes on past a lookup its records lack (a build returned would say
    by its value what that lookup found)."""
    work = _pasted_project(tmp_path)

    def limited() -> None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (600, 600))

    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", **(lookups.preload_env(library) or {})}
    argv = [str(CC), "-E", f"-I{tmp_path}/first", f"-I{tmp_path}/inc", "../t.c", "-o", "/dev/null"]
    proc = subprocess.run(
        argv, cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False, preexec_fn=limited
    )
    assert proc.returncode != 0, proc.stderr
    records = (work / lookups.PRELOAD_FILE).read_bytes()
    assert 0 < len(records) <= 600  # (as much as the limit let through, no more)
    with pytest.raises(ValueError, match="lookups"):  # (never vouched for: cut short, or no end record)
        lookups.read_preloaded(str(work))
    assert lookups.read_preloaded(str(work), killed=True) is not None  # (what was written, to refuse by)
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr  # (without the limit: the same run goes through)


def test_records_read_as_they_grow_are_read_once_and_as_a_whole(tmp_path):
    """A compile's records are read while it runs (each time a recording program closes
    them) and again after it: fed in any pieces — a record cut in two included — they
    read as the whole file does; a file that is no longer what was read is read afresh."""
    cwd = str(tmp_path)
    whole = _records([(1, 3, 0, b"/r/a.h"), (2, -2, 0, b"/r/b.h")]) + _records([(1, -13, 0, b"/x/c.h")])
    (tmp_path / lookups.PRELOAD_FILE).write_bytes(whole)
    expected = lookups.read_preloaded(cwd)
    assert expected == (("/r/a.h", True), ("/r/b.h", False), ("/x/c.h", True))
    for cut in range(1, len(whole)):
        records = lookups.Records(cwd)
        records.feed(whole[:cut])
        records.found(killed=True)  # (what there is so far)
        assert lookups.read_preloaded(cwd, early=records) == expected, cut
    records = lookups.Records(cwd)
    records.feed(_records([(1, 3, 0, b"/r/other.h")]))  # (not the file's start: not kept)
    assert lookups.read_preloaded(cwd, early=records) == expected
    records = lookups.Records(cwd)
    records.feed(whole[:30])
    with pytest.raises(ValueError, match="lookups"):  # (a run cut short is never vouched for)
        records.found()


def test_a_killed_runs_records_are_kept_whole_or_as_unreadable(tmp_path):
    """A killed run's records are copied out of its scratch whole; ones that cannot be
    (no regular file there, a copy that fails) are left as one unreadable record, never
    as fewer lookups (the run's output is then withheld)."""
    scratch, cwd = tmp_path / "scratch", tmp_path / "cwd"
    scratch.mkdir()
    cwd.mkdir()
    lookups.keep_records(str(scratch), str(cwd))
    assert not (cwd / lookups.PRELOAD_FILE).exists()  # (none made: none kept)
    data = _records([(1, -13, 0, b"/x/c.h")], ended=False)
    (scratch / lookups.PRELOAD_FILE).write_bytes(data)
    lookups.keep_records(str(scratch), str(cwd))
    assert lookups.read_preloaded(str(cwd), killed=True) == (("/x/c.h", True),)
    (scratch / lookups.PRELOAD_FILE).unlink()
    os.mkfifo(scratch / lookups.PRELOAD_FILE)
    lookups.keep_records(str(scratch), str(cwd))
    with pytest.raises(ValueError, match="lookups"):
        lookups.read_preloaded(str(cwd), killed=True)
