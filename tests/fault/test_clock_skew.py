"""Clock skew: a header whose mtime says nothing about when it changed.

An mtime is whatever the last writer or ``utime`` made it: a clock that runs ahead, an
archive unpacked with its recorded times (``tar``, ``unzip``, ``cp -p``). The ctime is
the kernel's, set on every change, and no user can set it. So "changed during the
compile" is judged by the ctime alone: a header with an mtime in the future (or far
in the past) is built, published and hit like any other, while one changed during the
compile is never vouched for whatever mtime it was given. (On the code that judged
by ``max(mtime, ctime)``, a future mtime made every request compile twice and cache
nothing.)

A ctime ahead of this host's clock (an NFS server whose clock runs ahead) cannot be
placed before or after the compile's start: such a build is returned, not vouched for.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import safejit
from safejit.policy import completeness
from safejit.policy.roots import build_anchors
from tests.conftest import KERNEL_WITH_HEADER, assert_cache_sound, leaves, settle

HOUR_NS = 3600 * 10**9


def _value(rt: safejit.Runtime, project: Path) -> int:
    mod = rt.compile(safejit.Source(KERNEL_WITH_HEADER, "value"), include_dirs=(str(project / "include"),))
    value: int = mod.kernel("value")()
    return value


def _set_mtime(path: Path, mtime_ns: int) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, mtime_ns))


def test_compile_with_a_header_mtime_in_the_future_is_published_and_hits(make_runtime, project, cache_dir):
    inner = project / "include" / "inner.h"
    _set_mtime(inner, time.time_ns() + HOUR_NS)
    settle()
    rt = make_runtime(source_roots=(str(project),), max_staleness_s=0)
    assert _value(rt, project) == 42
    assert rt.stats()["compiles"] == 1, "compiled twice: the future mtime was taken for a change during the compile"
    assert rt.stats()["published"] == 1 and len(leaves(cache_dir)) == 1
    # The memory entry revalidates (the stat cannot vouch for the file: it is rehashed) and hits.
    assert _value(rt, project) == 42
    assert rt.stats()["compiles"] == 1 and rt.stats()["stale"] == 0 and rt.stats()["memory_hits"] == 1
    # A fresh process hits the disk; an edit (mtime still in the future) is seen at once.
    fresh = make_runtime(source_roots=(str(project),), max_staleness_s=0)
    assert _value(fresh, project) == 42
    assert fresh.stats()["compiles"] == 0 and fresh.stats()["disk_hits"] == 1
    inner.write_text("#define INNER 8\n")
    _set_mtime(inner, time.time_ns() + HOUR_NS)
    settle()
    assert _value(fresh, project) == 9
    assert fresh.stats()["compiles"] == 1 and fresh.stats()["published"] == 1
    assert_cache_sound(cache_dir)


def test_compile_with_a_header_unpacked_with_an_old_mtime_is_published_and_hits(make_runtime, project, cache_dir):
    """An archive unpacked just before the compile: an old mtime, a fresh ctime."""
    inner = project / "include" / "inner.h"
    inner.write_text("#define INNER 5\n")
    _set_mtime(inner, 1_000_000_000 * 10**9)  # 2001
    settle()
    rt = make_runtime(source_roots=(str(project),), max_staleness_s=0)
    assert _value(rt, project) == 6
    assert rt.stats()["compiles"] == 1 and rt.stats()["published"] == 1
    fresh = make_runtime(source_roots=(str(project),))
    assert _value(fresh, project) == 6 and fresh.stats()["compiles"] == 0
    assert_cache_sound(cache_dir)


def test_header_unpacked_during_the_compile_with_an_old_mtime_is_never_vouched_for(
    make_runtime, project, cache_dir, caplog
):
    """The compiler reads inner.h; then an archive is unpacked over it (new bytes, the
    archive's old mtime) before the output is final: its fresh ctime says it changed."""
    inner = project / "include" / "inner.h"
    wrapper = project / "cc-unpacking"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *"-MD -MF"*) ;; *) exec /usr/bin/cc "$@";; esac\n'
        '/usr/bin/cc "$@"; rc=$?\n'
        f"n=$(cat {project}/n 2>/dev/null || echo 100); n=$((n+1)); echo $n > {project}/n\n"
        f'echo "#define INNER $n" > {inner}; touch -d @1000000000 {inner}\n'
        'out=; prev=; for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done\n'
        'cp "$out" "$out.tmp" && mv "$out.tmp" "$out"\n'  # (the output is final only now)
        "exit $rc\n"
    )
    wrapper.chmod(0o755)
    rt = make_runtime(source_roots=(str(project),), host_cc=str(wrapper), sandbox="off", max_staleness_s=0)
    with caplog.at_level(logging.INFO):
        assert _value(rt, project) == 102  # built from what the first run unpacked
    assert rt.stats()["compiles"] == 2 and rt.stats()["published"] == 0
    assert leaves(cache_dir) == []
    assert any("changed during compile" in m for m in caplog.messages)
    assert_cache_sound(cache_dir)


def test_closure_with_a_ctime_ahead_of_the_compile_start_is_not_vouched_for(project):
    """What an NFS server whose clock runs an hour ahead looks like to this host: the
    header's ctime is after the compile "started". Nothing orders it before the compile,
    so it counts as changed during it (the build is returned, not published). An mtime
    an hour ahead, on a header whose ctime is before the start, does not count."""
    inner = project / "include" / "inner.h"
    _set_mtime(inner, time.time_ns() + HOUR_NS)
    ctime_ns = inner.stat().st_ctime_ns
    anchors = build_anchors((str(project),), ())
    common = {"max_deps": 100, "search_dirs": (str(project / "include"),)}
    skewed = completeness.record_closure([str(inner)], anchors, started_ns=ctime_ns - HOUR_NS, **common)
    assert str(inner) in skewed.too_new
    in_order = completeness.record_closure([str(inner)], anchors, started_ns=ctime_ns + 10**9, **common)
    assert in_order.too_new == []
