"""The close-after-write watch behind the early closure scan (policy.closewatch)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safejit.policy import closewatch
from safejit.policy.closewatch import CloseWatch


def _watch(path: Path) -> CloseWatch:
    watch = CloseWatch.open(str(path))
    if watch is None:
        pytest.skip("no inotify here")
    return watch


def test_counts_closes_of_the_watched_file_only(tmp_path):
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
        assert not second.closed()
        (tmp_path / "b" / "k.d").write_text("z")
        assert second.closed()
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
    assert CloseWatch.open(str(tmp_path / "missing" / "k.d")) is None
