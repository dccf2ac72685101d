"""DiskTier: its roots as configured."""

from __future__ import annotations

import logging

import safejit

ONE = safejit.Source("int one(void) { return 1; }\n", "one")


def test_a_read_only_root_that_is_missing_is_said_once(make_runtime, tmp_path, caplog):
    first, shared = tmp_path / "mine", tmp_path / "team-cache"
    rt = make_runtime(cache_dirs=(str(first), str(shared)))
    with caplog.at_level(logging.WARNING, logger="safejit.cache.disk"):
        assert rt.compile(ONE).kernel("one")() == 1
        rt.compile(safejit.Source("int two(void) { return 2; }\n", "two"))
    said = [r.getMessage() for r in caplog.records if str(shared) in r.getMessage()]
    assert len(said) == 1 and "no directory" in said[0]
    assert not shared.exists()  # (read-only: never made while the first root takes the entries)


def test_roots_that_are_there_are_not_remarked_on(make_runtime, tmp_path, caplog):
    first, shared = tmp_path / "mine", tmp_path / "team-cache"
    shared.mkdir()
    with caplog.at_level(logging.WARNING, logger="safejit.cache.disk"):
        make_runtime(cache_dirs=(str(first), str(shared))).compile(ONE)
    assert not [r for r in caplog.records if "cache root" in r.getMessage()]
