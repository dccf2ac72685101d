"""The memory tier: bounds, eviction, staleness revalidation."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

import safejit
from safejit.cache.memory import Entry, MemoryTier
from tests.conftest import KERNEL_WITH_HEADER, settle


def _src(i: int) -> safejit.Source:
    return safejit.Source(f"int k(void) {{ return {i}; }}\n", "k")


def test_entry_bound_evicts_and_counts(make_runtime):
    rt = make_runtime(memory_max_entries=3)
    for i in range(6):
        assert rt.compile(_src(i)).kernel("k")() == i
    stats = rt.stats()
    assert stats["memory_entries"] == 3 and stats["evictions"] == 3
    # An evicted entry comes back from the disk tier, not the compiler.
    assert rt.compile(_src(0)).kernel("k")() == 0
    assert rt.stats()["compiles"] == 6 and rt.stats()["disk_hits"] == 1


def test_byte_bound_is_respected(make_runtime):
    rt = make_runtime(memory_max_bytes=40_000)
    for i in range(5):
        rt.compile(_src(i))
        assert rt.stats()["memory_bytes"] <= 40_000
    assert rt.stats()["evictions"] >= 2


def test_second_chance_keeps_recently_used_entries():
    cache: MemoryTier[str] = MemoryTier(max_entries=3, max_bytes=1 << 30, max_staleness_s=1.0)
    for key in "abc":
        cache.insert(key, Entry(key, 1))
    cache.entries["a"].ref = True  # "a" was hit since insertion
    cache.insert("d", Entry("d", 1))
    assert set(cache.entries) == {"a", "c", "d"}
    assert cache.evictions == 1


def test_edit_is_seen_within_max_staleness(make_runtime, project):
    rt = make_runtime(source_roots=(str(project),), max_staleness_s=0)
    inc = (str(project / "include"),)
    src = safejit.Source(KERNEL_WITH_HEADER, "value")
    assert rt.compile(src, include_dirs=inc).kernel("value")() == 42
    (project / "include" / "inner.h").write_text("#define INNER 9\n")
    settle()
    assert rt.compile(src, include_dirs=inc).kernel("value")() == 10
    assert rt.stats()["stale"] == 1 and rt.stats()["compiles"] == 2


def test_within_the_staleness_window_no_check_is_made(make_runtime, project, monkeypatch):
    rt = make_runtime(source_roots=(str(project),), max_staleness_s=3600)
    inc = (str(project / "include"),)
    src = safejit.Source(KERNEL_WITH_HEADER, "value")
    rt.compile(src, include_dirs=inc)
    calls = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda *a, **k: calls.append(a) or real_stat(*a, **k))
    rt.compile(src, include_dirs=inc)
    assert calls == [] and rt.stats()["memory_hits"] == 1


def test_racily_clean_snapshot_is_rehashed_not_trusted(tmp_path):
    """A file written within the timestamp window of its snapshot can change again
    without moving its stat; such a snapshot is rehashed, never trusted."""
    from safejit.closure.hashing import hash_file, is_racy

    header = tmp_path / "h.h"
    header.write_text("#define A 1\n")
    digest, snap = hash_file(str(header))
    assert is_racy(snap)  # just written
    cache: MemoryTier[str] = MemoryTier(max_entries=4, max_bytes=1 << 20, max_staleness_s=0)
    # Same stat as now, but the recorded digest differs from the content (as if
    # the file changed in the same tick after it was hashed).
    racy = Entry("v", 1, [[str(header), snap, "0" * 64, True]])
    trusted = Entry("v", 1, [[str(header), snap, "0" * 64, False]])
    assert cache.revalidate(racy, time.monotonic()) is False
    assert cache.revalidate(trusted, time.monotonic()) is True  # stat alone vouches: why racy matters
    good = Entry("v", 1, [[str(header), snap, digest, True]])
    assert cache.revalidate(good, time.monotonic()) is True


def test_revalidation_waits_for_the_window(make_runtime, project):
    rt = make_runtime(source_roots=(str(project),), max_staleness_s=0.2)
    inc = (str(project / "include"),)
    src = safejit.Source(KERNEL_WITH_HEADER, "value")
    rt.compile(src, include_dirs=inc)
    (project / "include" / "inner.h").write_text("#define INNER 1\n")
    time.sleep(0.25)
    assert rt.compile(src, include_dirs=inc).kernel("value")() == 2


def test_unhashable_define_value_is_a_config_error(make_runtime):
    rt = make_runtime()
    with pytest.raises(safejit.ConfigError):
        rt.compile(_src(1), defines={"X": [1, 2]})


def test_a_repointed_include_dir_symlink_makes_the_entry_stale(make_runtime, tmp_path):
    root = tmp_path / "proj"
    (root / "v1").mkdir(parents=True)
    (root / "v2").mkdir()
    (root / "v1" / "ver.h").write_text("#define VER 1\n")
    (root / "v2" / "ver.h").write_text("#define VER 2\n")
    link = root / "current"
    link.symlink_to(root / "v1")
    rt = make_runtime(source_roots=(str(root),), max_staleness_s=0)
    src = safejit.Source('#include "ver.h"\nint ver(void) { return VER; }\n', "ver")
    assert rt.compile(src, include_dirs=(str(link),)).kernel("ver")() == 1
    link.unlink()
    link.symlink_to(root / "v2")
    assert rt.compile(src, include_dirs=(str(link),)).kernel("ver")() == 2


@pytest.mark.parametrize("form", ["-I", "-isystem", "-include", "source file", "source root"])
def test_every_repointed_path_symlink_makes_the_entry_stale(make_runtime, tmp_path, form):
    """As an include dir: a path flag, the directory of a source read from a file (its
    quoted includes are looked for there first), and a source root given as a symlink
    that was re-pointed each make the memory entry stale (they used to be kept)."""
    top = tmp_path / "top"
    for v in (1, 2):
        (top / f"v{v}" / "inc").mkdir(parents=True)
        (top / f"v{v}" / "inc" / "ver.h").write_text(f"#define VER {v}\n")
        (top / f"v{v}" / "k.c").write_text('#include "ver.h"\nint ver(void) { return VER; }\n')
    link = top / "current"
    link.symlink_to(top / "v1")
    # (the source root itself is the symlink in that form; else the tree above it)
    root = link if form == "source root" else top
    rt = make_runtime(source_roots=(str(root),), max_staleness_s=0)
    inc = str(link / "inc")
    code = '#include "ver.h"\nint ver(void) { return VER; }\n'
    requests = {
        "-I": lambda: rt.compile(safejit.Source(code, "ver"), flags=("-I", inc)),
        "-isystem": lambda: rt.compile(safejit.Source(code, "ver"), flags=("-isystem", inc)),
        "-include": lambda: rt.compile(
            safejit.Source("int ver(void) { return VER; }\n", "ver"), flags=("-include", f"{inc}/ver.h")
        ),
        "source file": lambda: rt.compile(rt.source(link / "k.c", name="ver"), include_dirs=()),
        # (the include dir named by its real path, under the root's first target only)
        "source root": lambda: rt.compile(safejit.Source(code, "ver"), include_dirs=(str(top / "v1" / "inc"),)),
    }
    if form == "source file":
        for v in (1, 2):  # (found beside the source, not in an include dir)
            (top / f"v{v}" / "ver.h").write_text(f"#define VER {v}\n")
    assert requests[form]().kernel("ver")() == 1
    link.unlink()
    link.symlink_to(top / "v2")
    if form == "source root":  # judged against the root as it is now: that dir lies outside it
        with pytest.raises(safejit.PathConfinementError):
            requests[form]()
        return
    assert requests[form]().kernel("ver")() == 2


def test_equal_but_differently_typed_defines_are_different_requests(make_runtime):
    rt = make_runtime()
    src = safejit.Source("double v(void) { return (double)(X) / 2; }", "v")
    import ctypes

    one = rt.compile(src, defines={"X": 1}).kernel("v", restype=ctypes.c_double)()
    one_float = rt.compile(src, defines={"X": 1.0}).kernel("v", restype=ctypes.c_double)()
    assert (one, one_float) == (0.5, 0.5)
    assert rt.stats()["compiles"] == 2  # "-DX=1" and "-DX=1.0" are different builds, never one memory entry


def test_zero_and_negative_zero_defines_and_extras_are_different_requests(make_runtime):
    """0.0 == -0.0 (and hash alike), but they compile to different kernels: the memory key
    tells them apart (it used to hand back the 0.0 kernel for -0.0)."""
    import ctypes

    rt = make_runtime(declared_extras=("e",))
    src = safejit.Source("double v(void) { return 1.0 / (X); }", "v")
    got = [
        rt.compile(src, defines={"X": x}, extras={"e": e}).kernel("v", restype=ctypes.c_double)()
        for x, e in ((0.0, 0.0), (-0.0, 0.0), (0.0, -0.0))
    ]
    assert got == [math.inf, -math.inf, math.inf]
    assert rt.stats()["compiles"] == 3


def test_dep_list_marks_as_racy_exactly_what_is_racy_says(monkeypatch):
    """dep_list inlines is_racy's test; at one clock reading they agree on every side of
    the window's edge, for mtime and ctime alike, and an empty digest is never trusted."""
    from safejit.closure import hashing

    now = 1_000_000_000_000
    monkeypatch.setattr(time, "time_ns", lambda: now)
    edge = now - hashing.RACY_WINDOW_NS
    times = [0, edge - 1, edge, edge + 1, now, now + 5]
    snaps = [(1, 2, 3, m, c) for m in times for c in times]
    states = tuple((f"/h{i}.h", s, "d" * 64) for i, s in enumerate(snaps))
    got = Entry.dep_list(states)
    assert [row[3] for row in got] == [hashing.is_racy(s, now) for s in snaps]
    assert any(row[3] for row in got) and not all(row[3] for row in got)
    assert Entry.dep_list((("/x.h", (1, 2, 3, 0, 0), ""),))[0][3] is True


@pytest.mark.parametrize("where", ["insert", "set_result"])
def test_an_exception_between_make_and_settling_leaves_no_key_in_flight(monkeypatch, where):
    """An exception raised in the owner after ``make`` returned (a signal handler's, between
    two statements) left the key's future unsettled in flight: every later caller of the
    key waited on it for good. Or settled but never let go: later callers got its entry
    again and again."""
    import concurrent.futures
    import threading

    cache: MemoryTier[str] = MemoryTier(max_entries=3, max_bytes=1 << 30, max_staleness_s=0.0)
    make = lambda: (Entry("v", 1, [], time.monotonic()), "v")  # noqa: E731
    if where == "insert":
        monkeypatch.setattr(cache, "insert", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    else:
        real = concurrent.futures.Future.set_result

        def interrupted(self, result):
            real(self, result)
            raise KeyboardInterrupt()

        monkeypatch.setattr(concurrent.futures.Future, "set_result", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.produce("k", make, time.monotonic())
    monkeypatch.undo()
    got: list[str] = []
    later = threading.Thread(target=lambda: got.append(cache.produce("k", make, time.monotonic())), daemon=True)
    later.start()
    later.join(10)
    assert got == ["v"] and not cache._inflight


def test_an_interrupt_at_any_line_of_produce_leaves_the_tier_usable():
    """A signal handler's exception can arrive between any two statements: one arriving
    after a key's future was put in flight and before the ``try`` that settles it left it
    there unsettled, and every later caller of the key waited for good (seen with real
    SIGALRMs). Here a KeyboardInterrupt is raised at each line of the tier in turn — but
    a ``with`` line, which stands for its lock's release too: where the tracer runs,
    between the body and the release, a signal handler cannot (the release is one C
    call; CPython runs handlers at calls, returns and jumps)."""
    import linecache
    import sys
    import threading

    from safejit.cache import memory

    make = lambda: (Entry("v", 1, [], time.monotonic()), "v")  # noqa: E731
    for n in range(1, 500):
        cache: MemoryTier[str] = MemoryTier(max_entries=3, max_bytes=1 << 30, max_staleness_s=10.0)
        lines = 0

        def interrupting(frame, event, arg):
            nonlocal lines
            if frame.f_code.co_filename != memory.__file__:
                return None
            if event == "line" and not linecache.getline(frame.f_code.co_filename, frame.f_lineno).lstrip().startswith(
                "with "
            ):
                lines += 1
                if lines == n:  # noqa: B023 (this round's)
                    raise KeyboardInterrupt
            return interrupting

        sys.settrace(interrupting)
        try:
            cache.produce("k", make, time.monotonic())
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(None)
        got: list[str] = []
        later = threading.Thread(target=lambda: got.append(cache.produce("k", make, time.monotonic())), daemon=True)  # noqa: B023
        later.start()
        later.join(10)
        assert got == ["v"] and not cache._inflight and not cache._lock.locked(), n
        if not interrupted:
            break
    assert n > 10  # (the lines of a produce, each interrupted once)


def test_an_interrupted_compile_is_done_again_by_a_waiter_not_raised_in_it():
    """The thread that owned a key's compile was interrupted (Ctrl-C, a request's own
    timeout): its KeyboardInterrupt was raised in every thread waiting on that key. It is
    that thread's alone now; one waiter compiles instead, and the others get its result."""
    import threading

    cache: MemoryTier[str] = MemoryTier(max_entries=3, max_bytes=1 << 30, max_staleness_s=10.0)
    started, waiting = threading.Event(), threading.Event()
    calls: list[str] = []

    def make():
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            started.set()
            waiting.wait(10)
            raise KeyboardInterrupt
        return Entry("v", 1, [], time.monotonic()), "v"

    got: dict[str, object] = {}

    def call(name: str) -> None:
        try:
            got[name] = cache.produce("k", make, time.monotonic())
        except BaseException as exc:
            got[name] = exc

    owner = threading.Thread(target=call, args=("owner",), name="owner")
    owner.start()
    started.wait(10)
    waiters = [threading.Thread(target=call, args=(f"w{i}",), name=f"w{i}") for i in range(3)]
    for t in waiters:
        t.start()
    while len(cache._inflight["k"]._condition._waiters) < 3:  # (all three wait on the owner's compile)
        time.sleep(0.01)
    waiting.set()
    for t in (owner, *waiters):
        t.join(10)
    assert isinstance(got.pop("owner"), KeyboardInterrupt)
    assert got == {"w0": "v", "w1": "v", "w2": "v"} and len(calls) == 2


def test_time_the_machine_slept_counts_toward_max_staleness(make_runtime, project, monkeypatch):
    """time.monotonic stops while the machine is suspended: a kernel checked just
    before a night's sleep was served unchecked after it (within max_staleness_s of
    monotonic time), whatever changed meanwhile. The staleness clock is CLOCK_BOOTTIME,
    which counts that time; here the machine sleeps an hour by that clock alone."""
    from safejit import _clock, runtime

    assert _clock.now.func is time.clock_gettime and _clock.now.args == (time.CLOCK_BOOTTIME,)  # type: ignore[attr-defined]
    slept = 0.0
    real = _clock.now

    def boottime() -> float:
        return real() + slept

    monkeypatch.setattr(_clock, "now", boottime)
    monkeypatch.setattr(runtime, "_monotonic", boottime)
    rt = make_runtime(source_roots=(str(project),), max_staleness_s=600)
    inc = (str(project / "include"),)
    src = safejit.Source(KERNEL_WITH_HEADER, "value")
    assert rt.compile(src, include_dirs=inc).kernel("value")() == 42
    (project / "include" / "inner.h").write_text("#define INNER 9\n")
    assert rt.compile(src, include_dirs=inc).kernel("value")() == 42  # (within 600 s: not looked at)
    slept = 3600.0  # (time.monotonic has not moved)
    assert rt.compile(src, include_dirs=inc).kernel("value")() == 10
    assert rt.stats()["stale"] == 1


def test_a_waiter_is_served_when_the_owner_is_interrupted_inside_set_result(monkeypatch):
    """An interrupt inside ``Future.set_result`` (after the future is finished, before
    its waiters are woken) left a waiter blocked for good: waiters look again."""
    import concurrent.futures._base as futures
    import linecache
    import sys
    import threading

    from safejit.cache import memory

    monkeypatch.setattr(memory, "_WAIT_S", 0.05)
    cache: MemoryTier[str] = MemoryTier(max_entries=3, max_bytes=1 << 30, max_staleness_s=10.0)
    go = threading.Event()

    def make():
        go.wait(10)
        return Entry("v", 1, [], time.monotonic()), "v"

    def interrupting(frame, event, arg):
        if frame.f_code is not futures.Future.set_result.__code__:
            return None

        def at_notify(frame, event, arg):
            if event == "line" and "notify_all" in linecache.getline(frame.f_code.co_filename, frame.f_lineno):
                raise KeyboardInterrupt
            return at_notify

        return at_notify

    got: list[object] = []

    def owner() -> None:
        sys.settrace(interrupting)
        try:
            cache.produce("k", make, time.monotonic())
        except KeyboardInterrupt as exc:
            got.append(exc)
        finally:
            sys.settrace(None)

    first = threading.Thread(target=owner)
    first.start()
    while "k" not in cache._inflight:
        time.sleep(0.01)
    waiter = threading.Thread(target=lambda: got.append(cache.produce("k", make, time.monotonic())))
    waiter.start()
    while not cache._inflight["k"]._condition._waiters:
        time.sleep(0.01)
    go.set()
    first.join(10)
    waiter.join(10)
    assert not waiter.is_alive() and "v" in got and any(isinstance(g, KeyboardInterrupt) for g in got)


def test_a_compile_abandoned_by_a_second_interrupt_is_done_again(monkeypatch):
    """A second Ctrl-C arriving as the owner's ``finally`` began left its future unsettled
    in flight: every later caller of the key (a notebook cell run again, in the same
    thread) waited for good. A future whose owner has left is let go."""
    import linecache
    import sys
    import threading

    from safejit.cache import memory

    monkeypatch.setattr(memory, "_WAIT_S", 0.05)
    cache: MemoryTier[str] = MemoryTier(max_entries=3, max_bytes=1 << 30, max_staleness_s=10.0)

    def first_ctrl_c():
        raise KeyboardInterrupt

    def second_ctrl_c(frame, event, arg):
        if frame.f_code.co_filename != memory.__file__:
            return None

        def in_finally(frame, event, arg):
            line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
            if event == "line" and "if not mine.done():  # (a KeyboardInterrupt" in line:
                raise KeyboardInterrupt
            return in_finally

        return in_finally

    sys.settrace(second_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            cache.produce("k", first_ctrl_c, time.monotonic())
    finally:
        sys.settrace(None)
    assert list(cache._inflight) == ["k"] and not cache._inflight["k"].done()  # (what was left)
    make = lambda: (Entry("v", 1, [], time.monotonic()), "v")  # noqa: E731
    assert cache.produce("k", make, time.monotonic()) == "v"  # (the same thread)
    cache._inflight.clear()
    sys.settrace(second_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            cache.produce("j", first_ctrl_c, time.monotonic())
    finally:
        sys.settrace(None)
    got: list[str] = []
    other = threading.Thread(target=lambda: got.append(cache.produce("j", make, time.monotonic())))
    other.start()
    other.join(10)
    assert got == ["v"] and not cache._inflight  # (another thread)


def test_float_subclass_zero_and_negative_zero_defines_are_different_requests(make_runtime):
    """A float subclass (NumPy's float64 is one) compares ``0.0 == -0.0`` as float does,
    and its class alone did not tell them apart: the -0.0 request was served the 0.0
    kernel from memory for as long as the entry stood (revalidation checks files, not
    the request)."""
    import ctypes

    class Real(float):
        pass

    rt = make_runtime(declared_extras=("e",), max_staleness_s=3600)
    src = safejit.Source("double v(void) { return 1.0 / (X); }", "v")
    got = [
        rt.compile(src, defines={"X": x}, extras={"e": e}).kernel("v", restype=ctypes.c_double)()
        for x, e in ((Real(0.0), 0), (Real(-0.0), 0), (Real(0.0), Real(-0.0)))
    ]
    assert got == [math.inf, -math.inf, math.inf]
    assert rt.stats()["compiles"] == 3
    assert rt.compile(src, defines={"X": Real(-0.0)}, extras={"e": 0}).kernel("v", restype=ctypes.c_double)() < 0
    assert rt.stats()["compiles"] == 3 and rt.stats()["memory_hits"] == 1  # (equal text: the one entry)


@pytest.mark.parametrize("form", ["include_dirs", "-Iinc", "-I inc", "-I=/inc", "source file"])
def test_a_relative_path_names_what_it_does_in_the_working_dir_of_each_call(make_runtime, tmp_path, monkeypatch, form):
    """A path relative to the working dir (an include dir, a path flag, a source read as
    ``k.c``) in a long-running process that changes dir between two calls: the second
    is served what that path names now, within the staleness window too (the memory key
    held the path as spelt: the first dir's kernel was served until the window passed)."""
    for v in (1, 2):
        (tmp_path / f"p{v}" / "inc").mkdir(parents=True)
        (tmp_path / f"p{v}" / "inc" / "ver.h").write_text(f"#define VER {v}\n")
        (tmp_path / f"p{v}" / "ver.h").write_text(f"#define VER {v}\n")
        (tmp_path / f"p{v}" / "k.c").write_text('#include "ver.h"\nint ver(void) { return VER; }\n')
        (tmp_path / f"p{v}" / "=" / "inc").mkdir(parents=True)  # ("=/inc" is a path relative to the dir, as confined)
        (tmp_path / f"p{v}" / "=" / "inc" / "ver.h").write_text(f"#define VER {v}\n")
    rt = make_runtime(source_roots=(str(tmp_path),), max_staleness_s=3600)
    code = '#include "ver.h"\nint ver(void) { return VER; }\n'
    requests = {
        "include_dirs": lambda: rt.compile(safejit.Source(code, "ver"), include_dirs=("inc",)),
        "-Iinc": lambda: rt.compile(safejit.Source(code, "ver"), flags=("-Iinc",)),
        "-I inc": lambda: rt.compile(safejit.Source(code, "ver"), flags=("-I", "inc")),
        "-I=/inc": lambda: rt.compile(safejit.Source(code, "ver"), flags=("-I=/inc",)),
        "source file": lambda: rt.compile(rt.source("k.c", name="ver")),
    }
    seen = []
    for v in (1, 2, 1):
        monkeypatch.chdir(tmp_path / f"p{v}")
        seen.append(requests[form]().kernel("ver")())
    assert seen == [1, 2, 1]
    assert rt.stats()["memory_hits"] == 1  # (the first dir's entry serves it again)


def test_byte_bound_counts_the_closure_an_entry_keeps(make_runtime, tmp_path):
    """An entry keeps its closure to revalidate (a row per dependency, a path per negative
    lookup): only its artifact was counted, and 200,000 probes' negatives (100 MiB) went
    into ``memory_max_bytes`` as 16 KB."""
    from safejit.cache.leaf import decode_manifest

    root = tmp_path / "root"
    dirs = [root / f"inc{i}" for i in range(4)]
    for d in dirs:
        d.mkdir(parents=True)
    code = "".join(f"#if __has_include(<zz{i:04d}.h>)\n#endif\n" for i in range(40)) + "int k(void) { return 1; }\n"
    rt = make_runtime(source_roots=(str(root),))
    art = rt.build(safejit.Source(code, "k"), include_dirs=tuple(map(str, dirs)))
    manifest = decode_manifest((Path(art.path) / "manifest.json").read_bytes())
    assert len(manifest.negatives) >= 40 * 4
    rt.compile(safejit.Source(code, "k"), include_dirs=tuple(map(str, dirs)))
    assert rt.stats()["memory_bytes"] >= manifest.artifact.size + 300 * len(manifest.negatives)
