"""The composer's decisions, on the fake backend (no compiler): where ``on_cache_error``
is decided, how roots are resolved, which tier a call reports."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import safejit
from safejit import faults
from tests.conftest import leaves

SRC = safejit.Source('#include "inner.h"\n#define VALUE 7\n', "k")


@pytest.fixture
def fake(make_runtime, project):
    def factory(**cfg):
        cfg.setdefault("source_roots", (str(project),))
        return make_runtime(backend="fake", **cfg)

    return factory


def _inc(project: Path) -> tuple[str, ...]:
    return (str(project / "include"),)


def test_a_memory_hit_says_memory_and_a_disk_hit_says_disk(fake, project):
    rt = fake()
    first = rt.compile(SRC, include_dirs=_inc(project))
    again = rt.compile(SRC, include_dirs=_inc(project))
    assert (first.artifact.tier, again.artifact.tier) == ("compiled", "memory")
    assert again.kernel("INNER")() == 41 and again._state is first._state  # one loaded library
    assert fake().compile(SRC, include_dirs=_inc(project)).artifact.tier == "disk"


def test_an_unusable_lock_file_is_a_cache_error_under_raise(fake, project, cache_dir):
    rt = fake()
    with faults.inject("lock.acquire", "raise:EIO"), pytest.raises(safejit.CacheError) as exc:
        rt.compile(SRC, include_dirs=_inc(project))
    assert exc.value.errno == errno.EIO
    assert leaves(cache_dir) == []


def test_an_unusable_lock_file_bypasses_under_bypass(fake, project, cache_dir):
    rt = fake(on_cache_error="bypass")
    with faults.inject("lock.acquire", "raise:EIO"):
        mod = rt.compile(SRC, include_dirs=_inc(project))
    assert mod.kernel("INNER")() == 41 and mod.artifact.tier == "bypass"
    assert rt.stats()["bypass"] == 1 and leaves(cache_dir) == []


def test_a_usage_record_that_cannot_be_written_is_a_cache_error_under_raise(fake, project, cache_dir):
    rt = fake()
    rt.compile(SRC, include_dirs=_inc(project))
    usage = cache_dir / "v1" / "usage"
    usage.mkdir(parents=True, exist_ok=True)
    (usage / "default").write_text("not a directory")
    with pytest.raises(safejit.CacheError):
        rt.flush_usage()
    (usage / "default").unlink()  # (so that closing the runtime writes it)


def test_leaving_a_with_block_on_an_error_raises_that_error_not_the_usage_records(fake, project, cache_dir, caplog):
    """A with block left on an error (a compile's CacheError on a full disk) closes the
    runtime, whose usage record may fail to be written too: the caller saw that failure
    instead of its own error, which survived only deep in the chain."""
    usage = cache_dir / "v1" / "usage"
    with pytest.raises(KeyError, match="the caller's own"):
        with fake() as rt:
            rt.compile(SRC, include_dirs=_inc(project))
            usage.mkdir(parents=True, exist_ok=True)
            (usage / "default").write_text("not a directory")
            raise KeyError("the caller's own")
    assert any("usage record" in m for m in caplog.messages)
    with pytest.raises(safejit.CacheError, match="usage record"):  # (left with no error: close() says it)
        with fake() as rt:
            rt.compile(SRC, include_dirs=_inc(project))


def test_a_usage_record_that_cannot_be_written_is_logged_under_bypass(fake, project, cache_dir, caplog):
    rt = fake(on_cache_error="bypass")
    rt.compile(SRC, include_dirs=_inc(project))
    usage = cache_dir / "v1" / "usage"
    usage.mkdir(parents=True, exist_ok=True)
    (usage / "default").write_text("not a directory")
    rt.flush_usage()
    assert any("usage record" in m for m in caplog.messages)


def test_a_repointed_source_root_symlink_takes_effect_at_once(fake, tmp_path):
    """A root given as a symlink is resolved once per compile: after it is re-pointed,
    the same Runtime compiles against the new target (not refused until restart)."""
    for name, value in (("a", 1), ("b", 2)):
        (tmp_path / name / "include").mkdir(parents=True)
        (tmp_path / name / "include" / "inner.h").write_text(f"#define INNER {value}\n")
    link = tmp_path / "current"
    link.symlink_to(tmp_path / "a", target_is_directory=True)
    rt = fake(source_roots=(str(link),), max_staleness_s=0)
    inc = (str(link / "include"),)
    assert rt.compile(SRC, include_dirs=inc).kernel("INNER")() == 1
    link.unlink()
    link.symlink_to(tmp_path / "b", target_is_directory=True)
    assert rt.compile(SRC, include_dirs=inc).kernel("INNER")() == 2


def test_a_missing_source_root_is_a_config_error(fake, tmp_path):
    rt = fake(source_roots=(str(tmp_path / "nowhere"),))
    with pytest.raises(safejit.ConfigError, match="does not exist"):
        rt.compile(SRC)


def test_the_fake_backend_reads_only_under_the_roots(fake, project, outside):
    (project / "include" / "inner.h").write_text('#include "../../outside/secret.h"\n')
    with pytest.raises(safejit.PolicyError):
        fake().compile(SRC, include_dirs=_inc(project))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.h").write_text("#define SECRET 1\n")
    return path


def test_bypass_compiles_privately_when_no_root_is_writable(make_runtime, project, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "v1").write_text("a file where the layout should be")
    rt = make_runtime(backend="fake", cache_dirs=(str(ro),), source_roots=(str(project),), on_cache_error="bypass")
    mod = rt.compile(SRC, include_dirs=_inc(project))
    assert mod.artifact.tier == "bypass" and mod.kernel("VALUE")() == 7
    assert os.path.isfile(ro / "v1")
