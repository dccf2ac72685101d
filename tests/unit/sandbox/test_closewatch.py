"""The close-after-write watch behind the early closure scan (sandbox._closewatch)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from safejit.errors import CompileTimeout
from safejit.sandbox import _closewatch as closewatch
from safejit.sandbox._closewatch import CloseWatch
from safejit.sandbox.runner import RunResult, Sandbox


def _watch(path: Path) -> CloseWatch:
    watch = CloseWatch.open([str(path)])
    if watch is None:
        pytest.skip("no inotify here")
    return watch


def test_reports_closes_after_writing_of_the_watched_files_only(tmp_path):
    watch = _watch(tmp_path / "k.d")
    try:
        assert not watch.closed()
        (tmp_path / "other.d").write_text("x")
        (tmp_path / "k.d").write_text("a")
        assert watch.closed()
        assert not watch.closed()  # reported once
        (tmp_path / "k.d").read_text()  # a close after reading is not one
        assert not watch.closed()
        (tmp_path / "k.d").write_text("b")
        assert watch.closed()
    finally:
        watch.close()


def test_a_reused_instance_reports_nothing_of_an_earlier_watch(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _watch(tmp_path / "a" / "k.d")
    (tmp_path / "a" / "k.d").write_text("x")  # left unread
    first.close()
    second = _watch(tmp_path / "b" / "k.d")
    try:
        assert second.fd == first.fd, "the idle instance was not reused"
        (tmp_path / "a" / "k.d").write_text("y")
        assert second.closed() == []
        (tmp_path / "b" / "k.d").write_text("z")
        assert second.closed() == [(str(tmp_path / "b" / "k.d"), False), (str(tmp_path / "b" / "k.d"), True)]
    finally:
        second.close()


def test_a_child_process_does_not_share_the_idle_instances(tmp_path):
    _watch(tmp_path / "k.d").close()
    assert closewatch._IDLE
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write_end, b"%d" % len(closewatch._IDLE))
        os._exit(0)
    os.close(write_end)
    assert os.read(read_end, 16) == b"0"
    os.close(read_end)
    os.waitpid(pid, 0)
    assert closewatch._IDLE, "the parent's idle instances are gone"


def test_an_unwatchable_directory_gives_no_watch(tmp_path):
    assert CloseWatch.open([str(tmp_path / "missing" / "k.d")]) is None
    assert CloseWatch.open([str(tmp_path / "a" / "k.d"), str(tmp_path / "b" / "k.so")]) is None  # two dirs


def _run(
    tmp_path: Path,
    argv: list[str],
    names: list[str],
    on_closed: Callable[[str, bytes], None],
    *,
    timeout: float = 30,
    read_roots: Sequence[str] = (),
) -> RunResult:
    """``argv`` run in ``tmp_path/work`` (its files ``names`` watched) by a sandbox."""
    sb = Sandbox("auto", cc=shutil.which("cc"))
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    try:
        return sb.run(
            argv,
            cwd=str(work),
            env={"PATH": "/usr/bin:/bin"},
            timeout=timeout,
            read_roots=read_roots,
            write_roots=[str(work)],
            watch=[str(work / n) for n in names],
            on_closed=on_closed,
        )
    finally:
        sb.close()


def _run_writing(tmp_path: Path, script: str, names: list[str]) -> tuple[dict[str, bytes], list[tuple[str, bytes]]]:
    seen: list[tuple[str, bytes]] = []
    result = _run(
        tmp_path, ["/bin/sh", "-c", script], names, lambda path, data: seen.append((os.path.basename(path), data))
    )
    assert result.returncode == 0, result.log
    return {os.path.basename(p): d for p, d in result.files.items()}, seen


def test_the_sandbox_reads_watched_files_at_each_close_and_keeps_the_last(tmp_path):
    files, seen = _run_writing(
        tmp_path, "echo one > k.d; sleep 0.2; echo two > k.d; echo out > k.so; sleep 0.2", ["k.d", "k.so"]
    )
    if not seen:
        pytest.skip("no inotify here")
    assert files == {"k.d": b"two\n", "k.so": b"out\n"}
    assert ("k.d", b"one\n") in seen and seen[-1] in {("k.d", b"two\n"), ("k.so", b"out\n")}


def test_a_file_closed_over_and_over_is_not_vouched_for(tmp_path):
    files, seen = _run_writing(tmp_path, "for i in 1 2 3 4 5; do echo $i > k.d; sleep 0.05; done", ["k.d"])
    if not seen:
        pytest.skip("no inotify here")
    assert files == {}  # (the caller reads it after the run)


def test_time_spent_on_closed_files_is_not_the_compilers(tmp_path):
    """The waiting thread stages the leaf when the artifact is closed; a slow cache disk
    makes that slow. The compiler meanwhile prints more than a pipe holds, and blocks
    until the thread reads again: it would be killed as too slow at its deadline,
    though its own work ended in time. The time the thread spent is not charged to it."""
    # 256 KiB of output once the thread is busy staging: far more than a pipe holds.
    script = "echo out > k.so; sleep 0.5; yes | head -c 262144"
    result = _run(tmp_path, ["/bin/sh", "-c", script], ["k.so"], lambda path, data: time.sleep(1.5), timeout=1.0)
    assert result.returncode == 0, result.log
    assert result.log.endswith("y\n"), result.log  # (all of it written: it was never killed)


_SPAMMER = """
import os
while True:  # never ends, and keeps the watched directory busy
    os.close(os.open("x", os.O_WRONLY | os.O_CREAT))
"""


def test_a_compiler_that_never_ends_is_killed_in_time_however_busy_its_watch(tmp_path):
    """Only the caller's own work on watched files moves the deadline: a compiler that
    makes events without end (closing files that are not watched) gains nothing."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "p.py").write_text(_SPAMMER)
    began = time.monotonic()
    with pytest.raises(CompileTimeout):
        _run(
            tmp_path,
            [sys.executable, "p.py"],
            ["k.so"],
            lambda path, data: None,
            timeout=1.0,
            read_roots=[sys.prefix, sys.base_prefix],
        )
    assert time.monotonic() - began < 2.0
