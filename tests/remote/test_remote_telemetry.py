"""The remote tier's telemetry with the real SDK, on a real Valkey: a leaf that came
through another node's lease is a remote hit (one outcome per request); a lookup or an
upload the remote failed is a failed span; the remote's own metrics carry its engine; the
disk copy of a remote hit is published in the compile's trace."""

from __future__ import annotations

import threading
import time
import uuid

from opentelemetry.trace import StatusCode

from safejit import faults
from safejit.cache.remote import RemoteSettings, open_store
from safejit.outcomes import Outcome
from tests.conftest import metric_points

from ._servers import free_port
from .test_tier import SRC, _inc, _published

LOOKUP_KEYS = ("safejit.tier", "safejit.result", "safejit.reason")


def _tenant() -> str:
    return "t" + uuid.uuid4().hex[:10]


def _remote_lookups(reader, tenant: str) -> dict[tuple[str, ...], int]:
    points = metric_points(reader, "safejit.cache.lookups", **{"safejit.tenant": tenant, "safejit.tier": "remote"})
    return {tuple(str(p.attributes.get(k)) for k in LOOKUP_KEYS): p.value for p in points}


def test_a_leaf_that_came_through_another_nodes_lease_is_one_remote_hit(node, project, redis_server, otel_sdk):
    spans, reader = otel_sdk
    t = _tenant()
    a = node("a", tenant=t)
    _published(a, project)  # (its request: one remote miss, then its compile)
    admin = redis_server.admin()
    (index,) = admin.keys(f"sj:v1:{t}:fake:idx:*")
    saved = admin.hgetall(index)
    admin.delete(index)  # (not published yet, as far as the next node can see) ...
    store = open_store(RemoteSettings.from_url(redis_server.url), tenant=t, backend="fake")
    lease = store.acquire_lease(index.decode().rsplit(":", 1)[1], holder="another node")  # ... which compiles it
    assert lease is not None
    b = node("b", tenant=t)
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("m", b.compile(SRC, include_dirs=_inc(project))))
    spans.clear()
    waiter.start()
    time.sleep(0.3)
    for field, value in saved.items():
        admin.hset(index, field, value)  # it publishes, then lets the lease go
    store.release_lease(lease)
    waiter.join(30)
    store.close()
    assert got["m"].artifact.tier == "remote" and b.stats()["remote_hits"] == 1
    assert _remote_lookups(reader, t) == {("remote", "miss", "absent"): 1, ("remote", "hit", "verified"): 1}

    # The disk copy of that hit is published in b's compile trace.
    deadline = time.monotonic() + 10  # (the backfill runs in the background: wait for it)
    while not [s for s in spans.get_finished_spans() if s.name == "safejit.publish"] and time.monotonic() < deadline:
        time.sleep(0.01)
    finished = spans.get_finished_spans()
    (compile_span,) = [s for s in finished if s.name == "safejit.compile"]
    (publish,) = [s for s in finished if s.name == "safejit.publish"]
    assert publish.context.trace_id == compile_span.context.trace_id
    assert publish.attributes["safejit.outcome"] == "published" and publish.attributes["safejit.deps.count"] >= 1


def test_a_lookup_the_remote_failed_is_a_failed_span_and_its_metrics_carry_the_engine(node, project, otel_sdk):
    spans, reader = otel_sdk
    t = _tenant()
    spans.clear()
    down = node("down", tenant=t, remote=f"redis://127.0.0.1:{free_port()}/0")
    assert down.compile(SRC, include_dirs=_inc(project)).artifact.tier == "compiled"
    (lookup,) = [s for s in spans.get_finished_spans() if s.name == "safejit.cache.remote.lookup"]
    assert lookup.status.status_code is StatusCode.ERROR and lookup.attributes["error.type"] == "RemoteError"
    assert lookup.attributes["safejit.reason"] == "refused"
    assert _remote_lookups(reader, t) == {("remote", "miss", "refused"): 1}
    durations = metric_points(reader, "safejit.remote.duration", **{"safejit.tenant": t})
    assert durations and all(p.attributes.get("safejit.remote.engine") == "redis" for p in durations)


def test_an_upload_the_remote_failed_is_a_failed_span(node, project, otel_sdk):
    spans, _ = otel_sdk
    rt = node("a", tenant=_tenant())
    spans.clear()
    with faults.inject("remote.put", "raise:EIO"):
        rt.compile(SRC, include_dirs=_inc(project))
        uploads = rt.flush_uploads(10)
    assert [r.outcome for r in uploads.results] == [Outcome.UPLOAD_FAILED]
    (published,) = [s for s in spans.get_finished_spans() if s.name == "safejit.cache.remote.publish"]
    assert published.status.status_code is StatusCode.ERROR
    assert published.attributes["error.type"] == "RemoteError"
    assert published.attributes["safejit.outcome"] == "upload_failed"
