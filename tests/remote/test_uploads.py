"""What became of each upload (``Runtime.flush_uploads``), and ``Runtime.warm`` as a
build service runs it (``fill_remote``): a disk hit the remote lacks is uploaded, one it
has is not sent again, a remote hit says so. On the session's Valkey."""

from __future__ import annotations

from pathlib import Path

import safejit
from safejit.inventory import read_inventory
from safejit.outcomes import Outcome

from .conftest import FLEET_KEY
from .test_acl import create_users

SRC = safejit.Source('#include "inner.h"\n#define VALUE 7\n', "k")


def _inc(project: Path) -> tuple[str, ...]:
    return (str(project / "include"),)


def test_flush_uploads_says_what_became_of_each_upload(node, project, redis_server):
    rt = node("a")
    art = rt.compile(SRC, include_dirs=_inc(project)).artifact
    uploads = rt.flush_uploads(10)
    assert uploads.done
    assert [(r.build_key, r.deps_key, r.outcome) for r in uploads.results] == [
        (art.build_key, art.deps_key, Outcome.UPLOADED)
    ]
    assert rt.flush_uploads(1).results == ()  # (each told once)
    assert redis_server.admin().hlen(f"sj:v1:default:fake:idx:{art.build_key}") == 1


def test_an_upload_the_server_refuses_is_reported_failed_with_its_reason(node, project, redis_server):
    create_users(redis_server.admin(), "t1")
    url = f"redis://sj-t1-reader:t1-reader-pw@127.0.0.1:{redis_server.port}/0"
    rt = node("r", tenant="t1", remote=url)
    rt.compile(SRC, include_dirs=_inc(project))
    (result,) = rt.flush_uploads(10).results
    assert result.outcome is Outcome.UPLOAD_FAILED
    assert "denied" in result.detail and "t1-reader-pw" not in result.detail


def test_a_runtime_without_a_remote_has_nothing_to_flush(tmp_path):
    rt = safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(str(tmp_path / "c"),)))
    rt.compile(safejit.Source("#define V 1\n", "v"))
    assert (rt.flush_uploads(1).done, rt.flush_uploads(1).results) == (True, ())
    rt.close()


def test_warm_fills_the_remote_with_a_disk_hit_unless_it_has_it(node, project, tmp_path, redis_server):
    inventory = tmp_path / "inventory.jsonl"
    local = node("a", remote=None, inventory=str(inventory))  # built before there was a remote
    art = local.compile(SRC, include_dirs=_inc(project)).artifact
    local.close()
    (request,) = read_inventory(str(inventory))
    builder = node("a")  # the same disk, now with the remote
    assert builder.warm(request) == "hit"
    assert builder.flush_uploads(5).results == ()  # (without fill_remote: a hit is not offered)
    assert builder.warm(request, fill_remote=True) == "hit"
    (result,) = builder.flush_uploads(10).results
    assert (result.build_key, result.outcome) == (art.build_key, Outcome.UPLOADED)
    assert builder.warm(request, fill_remote=True) == "hit"
    (again,) = builder.flush_uploads(10).results
    assert (again.outcome, again.detail) == (Outcome.UPLOAD_SKIPPED, "already on the remote")
    other = node("b")
    assert other.warm(request, fill_remote=True) == "remote"  # verified there, nothing to upload
    assert other.flush_uploads(5).results == ()
    assert node("c", remote=None).warm(request) == "built"


def test_a_runtime_dropped_without_close_keeps_no_upload_thread_nor_connections(project, tmp_path, monkeypatch):
    """The upload worker waited for work for good, holding the store and its connections:
    every Runtime that ever uploaded and was dropped unclosed kept a thread and two
    connections to the server until the process ended."""
    import gc
    import threading
    import time

    from safejit.cache.remote import uploads

    from ._servers import start_valkey

    monkeypatch.setattr(uploads, "_IDLE_S", 0.1, raising=False)  # (a moment, not 5 s)
    server = start_valkey(tmp_path / "valkey")  # (its own: no other test's connections counted)
    admin = server.admin()

    def uploaders() -> int:
        return sum(t.name == "safejit-upload" for t in threading.enumerate())

    before = len(admin.client_list())
    try:
        for i in range(4):
            rt = safejit.Runtime(
                config=safejit.Config(
                    backend="fake",
                    remote=server.url,
                    signing_key=FLEET_KEY,
                    cache_dirs=(str(tmp_path / f"disk-{i}"),),
                    source_roots=(str(project),),
                )
            )
            rt.compile(SRC, include_dirs=_inc(project))
            assert rt.flush_uploads(10).done
            del rt
        deadline = time.monotonic() + 10
        while (uploaders() or len(admin.client_list()) > before) and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.05)
        assert uploaders() == 0
        assert len(admin.client_list()) <= before
    finally:
        server.stop()


def test_a_head_not_stored_still_publishes_the_leaf(node, project, redis_server, monkeypatch):
    """The head is a shortcut (the artifact read with the index): one that failed to be
    stored failed the whole upload, and the leaf was never published."""
    from safejit.cache.remote import RemoteError
    from safejit.cache.remote.redis import RedisStore

    def refused(self, *args, **kwargs):
        raise RemoteError("error", "put_head", "refused for this test", engine="redis")

    monkeypatch.setattr(RedisStore, "put_head", refused)
    rt = node("a")
    art = rt.compile(SRC, include_dirs=_inc(project)).artifact
    (result,) = rt.flush_uploads(10).results
    assert result.outcome is Outcome.UPLOADED
    assert not redis_server.admin().keys(f"sj:v1:default:fake:head:{art.build_key}")
    assert node("b").compile(SRC, include_dirs=_inc(project)).artifact.tier == "remote"
