"""Latency: a slow cache disk (or NFS) makes the publish or the load of a build take
seconds; a slow compiler driver takes a while to exit after its output is final.

The staleness bound (DESIGN.md §6) must hold whatever that latency: with
``max_staleness_s=0.5``, a call started more than half a second after a header edit
never gets the kernel built before it — not when it joins a compile in flight whose
publish or load is slow, not when it finds that compile's entry in memory just after
it was stored. The library's own ``delay`` fault stands in for the slow disk.

Real threads, real timing (a header edited while a build's publish or load sleeps,
callers 0.7 s and 1.2 s after the edit, one right after the first call returns);
the assertions are on values only, so a loaded machine makes the test slower,
never wrong. (On the code before the memory tier started its clock at the closure's
check, every late caller got the old kernel.)
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest

import safejit
from safejit import faults
from tests.conftest import KERNEL_WITH_HEADER, assert_cache_sound, leaves

STALENESS_S = 0.5
#: The slow publish or load: long enough that callers 0.7 s and 1.2 s after the edit
#: (made while it sleeps) still find the first compile in flight.
DELAY_S = 1.5
OLD, NEW = 42, 10


def _source() -> safejit.Source:
    return safejit.Source(KERNEL_WITH_HEADER, "value")


class _Caller(threading.Thread):
    """Calls ``rt.compile`` at ``at`` (time.monotonic()), or when ``after`` is set;
    records when it really started and what the kernel returned."""

    def __init__(self, rt: safejit.Runtime, include: str, at: float = 0.0, after: threading.Event | None = None):
        super().__init__(daemon=True)
        self.rt, self.include, self.at, self.after = rt, include, at, after
        self.started_at = 0.0
        self.value: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.after is not None:
                self.after.wait(60)
            time.sleep(max(0.0, self.at - time.monotonic()))
            self.started_at = time.monotonic()
            self.value = self.rt.compile(_source(), include_dirs=(self.include,)).kernel("value")()
        except BaseException as exc:
            self.error = exc


def _committed(cache: Path) -> bool:
    """Whether a leaf's commit marker has been written: in a stage, or published."""
    if leaves(cache):
        return True
    for marker in (cache / "v1" / "tmp").glob("*/leaf/.committed"):
        with contextlib.suppress(OSError):  # (a stage renamed or removed meanwhile)
            if marker.stat().st_size:
                return True
    return False


def _edit_while_slow(make_runtime, project: Path, cache_dir: Path, point: str) -> None:
    rt = make_runtime(source_roots=(str(project),), max_staleness_s=STALENESS_S)
    include = str(project / "include")
    first_done = threading.Event()
    first = _Caller(rt, include)
    with faults.inject(point, f"delay:{DELAY_S}"):
        first.start()
        # Once its commit marker is written (staged, or visible), the build's closure has
        # been checked, with the old header; its publish or load sleeps from then on.
        deadline = time.monotonic() + 120
        while not _committed(cache_dir) and time.monotonic() < deadline and first.is_alive():
            time.sleep(0.005)
        assert _committed(cache_dir), f"the first compile committed nothing: {first.error!r}"
        (project / "include" / "inner.h").write_text("#define INNER 9\n")
        edited = time.monotonic()
        late = [_Caller(rt, include, at=edited + 0.7), _Caller(rt, include, at=edited + 1.2)]
        right_after = _Caller(rt, include, after=first_done)
        for t in (*late, right_after):
            t.start()
        first.join(120)
        first_done.set()
        for t in (*late, right_after):
            t.join(120)
    callers = [first, *late, right_after]
    assert [c.error for c in callers] == [None] * len(callers)
    assert not any(c.is_alive() for c in callers)
    assert first.value in (OLD, NEW)  # it started before the edit: either is within the bound
    due = [c for c in (*late, right_after) if c.started_at - edited > STALENESS_S]
    assert [c.value for c in due] == [NEW] * len(due)
    assert len(due) >= 2  # the callers 0.7 s and 1.2 s after the edit, at least
    # And a fresh process finds the new build on disk; the old leaf never verifies again.
    fresh = make_runtime(source_roots=(str(project),))
    assert fresh.compile(_source(), include_dirs=(include,)).kernel("value")() == NEW
    assert fresh.stats()["compiles"] == 0
    assert_cache_sound(cache_dir)


@pytest.mark.parametrize("point", ["publish.before_rename", "publish.after_rename"])
def test_compile_joined_during_a_slow_publish_after_an_edit_returns_the_new_kernel(
    make_runtime, project, cache_dir, point
):
    _edit_while_slow(make_runtime, project, cache_dir, point)


def test_compile_joined_during_a_slow_load_after_an_edit_returns_the_new_kernel(make_runtime, project, cache_dir):
    _edit_while_slow(make_runtime, project, cache_dir, "load")


def test_compile_after_an_edit_during_a_slow_compiler_exit_returns_the_new_kernel(make_runtime, project, cache_dir):
    """The compiler's output is final, its closure checked and found current; then the
    header is edited while the driver takes its time to exit (0.8 s). A call made more
    than max_staleness_s after the edit must not get the kernel built before it."""
    inner = project / "include" / "inner.h"
    edited = project / "edited"
    wrapper = project / "cc-slow-exit"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *"-MD -MF"*) ;; *) exec /usr/bin/cc "$@";; esac\n'
        '/usr/bin/cc "$@"; rc=$?\n'
        "sleep 0.2\n"  # (the output is final and its closure checked by now)
        f'[ -e {edited} ] || {{ echo "#define INNER 9" > {inner}; touch {edited}; }}\n'
        "sleep 0.8\n"
        "exit $rc\n"
    )
    wrapper.chmod(0o755)
    rt = make_runtime(source_roots=(str(project),), host_cc=str(wrapper), sandbox="off", max_staleness_s=STALENESS_S)
    include = str(project / "include")
    assert rt.compile(_source(), include_dirs=(include,)).kernel("value")() == OLD  # what the compiler read
    since_edit = time.time() - edited.stat().st_mtime
    time.sleep(max(0.0, STALENESS_S + 0.1 - since_edit))
    assert rt.compile(_source(), include_dirs=(include,)).kernel("value")() == NEW
    assert_cache_sound(cache_dir)


def test_compile_after_an_edit_during_a_slow_lookup_returns_the_new_kernel(
    make_runtime, project, cache_dir, monkeypatch
):
    """A lookup tries the newest leaf first: its closure is rehashed, and does not match.
    The header is edited; the lookup thread is slow to go on (a loaded machine); the next
    leaf matches the digests taken *before* the edit. A call made more than
    max_staleness_s after the edit must not get that leaf's kernel."""
    from safejit.cache.disk import DiskTier
    from safejit.cache.leaf import Rejection

    inner = project / "include" / "inner.h"
    include = (str(project / "include"),)
    src = safejit.Source('#include "value.h"\n', "value")
    config = {"backend": "fake", "source_roots": (str(project),), "max_staleness_s": STALENESS_S}
    assert make_runtime(**config).compile(src, include_dirs=include).kernel("INNER")() == 41
    inner.write_text("#define INNER 7\n")
    assert make_runtime(**config).compile(src, include_dirs=include).kernel("INNER")() == 7
    inner.write_text("#define INNER 41\n")  # the older leaf matches again; the newer one is tried first
    edited: list[float] = []
    real_verify = DiskTier.verify

    def verify(self, *args, **kwargs):
        result = real_verify(self, *args, **kwargs)
        if isinstance(result, Rejection) and not edited and args[3] is not None:
            inner.write_text("#define INNER 99\n")
            edited.append(time.monotonic())
            time.sleep(STALENESS_S + 0.2)  # (the lookup's thread, descheduled)
        return result

    monkeypatch.setattr(DiskTier, "verify", verify)
    rt = make_runtime(**config)
    assert rt.compile(src, include_dirs=include).kernel("INNER")() == 41  # it started before the edit
    assert edited and time.monotonic() - edited[0] > STALENESS_S
    assert rt.compile(src, include_dirs=include).kernel("INNER")() == 99
    assert_cache_sound(cache_dir)
