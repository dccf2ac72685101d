"""Span trees and metrics, recorded by the real OpenTelemetry SDK in memory."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import safejit
from safejit.telemetry import DURATION_BUCKETS
from tests.conftest import ADD_C, KERNEL_WITH_HEADER, leaves, settle


def _tree(exporter) -> list[tuple[int, str, dict[str, Any]]]:
    """(depth, name, attributes) in start order, for the last root span."""
    finished = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time)
    by_id = {s.context.span_id: s for s in finished}
    roots = [s for s in finished if s.parent is None or s.parent.span_id not in by_id]
    root = roots[-1]
    out = []

    def depth(s) -> int:
        d = 0
        while s.parent is not None and s.parent.span_id in by_id:
            s, d = by_id[s.parent.span_id], d + 1
        return d

    def under(s) -> bool:
        while s is not None:
            if s is root:
                return True
            s = by_id.get(s.parent.span_id) if s.parent is not None else None
        return False

    for s in finished:
        if under(s):
            out.append((depth(s), s.name, dict(s.attributes or {})))
    return out


def _names(tree) -> list[tuple[int, str]]:
    return [(d, n) for d, n, _ in tree]


def _attrs(tree, name: str, index: int = 0) -> dict[str, Any]:
    return [a for _, n, a in tree if n == name][index]


def _tenant() -> str:
    return "t" + uuid.uuid4().hex[:10]


COLD = [
    (0, "safejit.compile"),
    (1, "safejit.cache.memory.lookup"),
    (1, "safejit.policy.check"),
    (1, "safejit.key"),
    (1, "safejit.cache.disk.lookup"),
    (1, "safejit.lock.wait"),
    (1, "safejit.cache.disk.lookup"),
    (1, "safejit.compiler.run"),
    (2, "safejit.policy.check"),  # the closure, scanned once the depfile is written
    (1, "safejit.publish"),
    (1, "safejit.load"),
]


def test_cold_compile_span_tree(make_runtime, spans, cache_dir):
    rt = make_runtime(tenant=_tenant())
    rt.compile(safejit.Source(ADD_C, "add"))
    tree = _tree(spans)
    assert _names(tree) == COLD
    root = _attrs(tree, "safejit.compile")
    assert root["safejit.backend"] == "host" and root["safejit.kernel"] == "add" and root["safejit.tier"] == "compiled"
    assert _attrs(tree, "safejit.cache.memory.lookup") | {} == {
        "safejit.tier": "memory",
        "safejit.result": "miss",
        "safejit.reason": "absent",
    }
    disk = _attrs(tree, "safejit.cache.disk.lookup")
    assert disk["safejit.result"] == "miss" and disk["safejit.reason"] == "absent"
    assert disk["safejit.root"] == str(cache_dir) and len(disk["safejit.build_key"]) == 64
    assert len(_attrs(tree, "safejit.key")["safejit.build_key"]) == 64
    walls = _attrs(tree, "safejit.compiler.run")["safejit.sandbox"].split("+")
    assert walls[-1] == "rlimits"
    named = {w for w in walls if re.fullmatch(r"landlock-v\d+|uid-\d+", w)}
    assert set(walls[:-1]) <= {"seccomp", "userns", "tmpfs", "nproc"} | named
    assert _attrs(tree, "safejit.publish")["safejit.outcome"] == "published"
    assert _attrs(tree, "safejit.publish")["safejit.deps.count"] >= 1
    assert _attrs(tree, "safejit.load")["safejit.bytes"] > 0


def test_memory_hit_is_untraced_unless_asked(make_runtime, spans):
    rt = make_runtime(tenant=_tenant())
    rt.compile(safejit.Source(ADD_C, "add"))
    spans.clear()
    rt.compile(safejit.Source(ADD_C, "add"))
    assert spans.get_finished_spans() == ()
    traced = make_runtime(tenant=_tenant(), trace_memory_hits=True)
    traced.compile(safejit.Source(ADD_C, "add"))
    spans.clear()
    traced.compile(safejit.Source(ADD_C, "add"))
    tree = _tree(spans)
    assert _names(tree) == [(0, "safejit.compile"), (1, "safejit.cache.memory.lookup")]
    assert _attrs(tree, "safejit.cache.memory.lookup")["safejit.result"] == "hit"
    assert _attrs(tree, "safejit.compile")["safejit.tier"] == "memory"


def test_disk_hit_span_tree(make_runtime, spans):
    tenant = _tenant()
    make_runtime(tenant=tenant).compile(safejit.Source(ADD_C, "add"))
    spans.clear()
    make_runtime(tenant=tenant).compile(safejit.Source(ADD_C, "add"))
    tree = _tree(spans)
    assert _names(tree) == [
        (0, "safejit.compile"),
        (1, "safejit.cache.memory.lookup"),
        (1, "safejit.policy.check"),
        (1, "safejit.key"),
        (1, "safejit.cache.disk.lookup"),
        (2, "safejit.verify"),
        (1, "safejit.load"),
    ]
    assert _attrs(tree, "safejit.cache.disk.lookup")["safejit.result"] == "hit"
    assert _attrs(tree, "safejit.verify")["safejit.result"] == "ok"
    assert _attrs(tree, "safejit.compile")["safejit.tier"] == "disk"


def test_stale_revalidation_span_tree(make_runtime, spans, project):
    rt = make_runtime(tenant=_tenant(), source_roots=(str(project),), max_staleness_s=0)
    src, inc = safejit.Source(KERNEL_WITH_HEADER, "value"), (str(project / "include"),)
    rt.compile(src, include_dirs=inc)
    (project / "include" / "inner.h").write_text("#define INNER 0\n")
    settle()
    spans.clear()
    assert rt.compile(src, include_dirs=inc).kernel("value")() == 1
    tree = _tree(spans)
    names = _names(tree)
    assert names[:2] == [(0, "safejit.compile"), (1, "safejit.cache.memory.lookup")]
    assert _attrs(tree, "safejit.cache.memory.lookup") == {
        "safejit.tier": "memory",
        "safejit.result": "miss",
        "safejit.reason": "stale",
    }
    disk = _attrs(tree, "safejit.cache.disk.lookup")
    assert disk["safejit.result"] == "miss" and disk["safejit.reason"] == "dep_changed"
    assert _attrs(tree, "safejit.verify")["safejit.reason"] == "dep_changed"
    assert (1, "safejit.compiler.run") in names and (1, "safejit.publish") in names


def test_corrupt_leaf_span_tree(make_runtime, spans, cache_dir):
    tenant = _tenant()
    make_runtime(tenant=tenant).compile(safejit.Source(ADD_C, "add"))
    (leaf,) = [leaf for leaf in leaves(cache_dir) if leaf.tenant == tenant]
    (Path(leaf.path) / "artifact.so").write_bytes(b"\x7fELF garbage")
    spans.clear()
    make_runtime(tenant=tenant).compile(safejit.Source(ADD_C, "add"))
    tree = _tree(spans)
    assert _attrs(tree, "safejit.verify")["safejit.reason"] == "artifact"
    disk = _attrs(tree, "safejit.cache.disk.lookup")
    assert disk["safejit.reason"] == "artifact"
    rejected = next(s for s in spans.get_finished_spans() if s.name == "safejit.cache.disk.lookup").events
    assert rejected[0].name == "leaf.rejected" and rejected[0].attributes["safejit.reason"] == "artifact"
    assert _attrs(tree, "safejit.publish")["safejit.outcome"] == "published"


def test_compile_error_span_tree(make_runtime, spans):
    from opentelemetry.trace import StatusCode

    rt = make_runtime(tenant=_tenant())
    with pytest.raises(safejit.CompileError):
        rt.compile(safejit.Source("int broken(void) { return nope; }", "broken"))
    finished = {s.name: s for s in spans.get_finished_spans()}
    root, run = finished["safejit.compile"], finished["safejit.compiler.run"]
    assert root.status.status_code is StatusCode.ERROR and root.attributes["error.type"] == "CompileError"
    assert run.status.status_code is StatusCode.ERROR and run.attributes["error.type"] == "CompileError"
    log = next(e for e in run.events if e.name == "compiler.log")
    assert "nope" in log.attributes["safejit.log"] and len(log.attributes["safejit.log"]) <= 8192


def test_policy_violation_span_and_metric(make_runtime, spans, metric_reader, tmp_path):
    from opentelemetry.trace import StatusCode

    tenant = _tenant()
    rt = make_runtime(tenant=tenant)
    outside = tmp_path / "outside"
    outside.mkdir()
    with pytest.raises(safejit.PathConfinementError):
        rt.compile(safejit.Source(ADD_C, "add"), include_dirs=(str(outside),))
    finished = {s.name: s for s in spans.get_finished_spans()}
    check = finished["safejit.policy.check"]
    assert check.status.status_code is StatusCode.ERROR
    assert check.attributes["safejit.kind"] == "PathConfinementError"
    assert finished["safejit.compile"].attributes["error.type"] == "PathConfinementError"
    points = _points(metric_reader, "safejit.policy.violations", tenant)
    assert [(p.attributes["safejit.kind"], p.value) for p in points] == [("PathConfinementError", 1)]


LOCK_HOLDER = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644); fcntl.flock(fd, fcntl.LOCK_EX)
open(sys.argv[2], "w").close(); time.sleep(float(sys.argv[3])); os.close(fd)
"""


def test_lock_wait_between_two_processes(make_runtime, spans, cache_dir, tmp_path, metric_reader):
    tenant = _tenant()
    rt = make_runtime(tenant=tenant)
    src = safejit.Source(ADD_C, "add")
    key = rt.build(src).build_key  # learn the key, then forget the entry
    for leaf in leaves(cache_dir):
        import shutil

        shutil.rmtree(leaf.path)
    ready = tmp_path / "ready"
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(cache_dir / "v1" / "locks" / f"{key}.lock"), str(ready), "0.6"]
    )
    while not ready.exists():
        time.sleep(0.01)
    spans.clear()
    other = make_runtime(tenant=tenant)
    other.compile(src)
    holder.wait(timeout=30)
    wait = next(s for s in spans.get_finished_spans() if s.name == "safejit.lock.wait")
    assert (wait.end_time - wait.start_time) / 1e9 >= 0.3
    assert wait.attributes["safejit.result"] == "acquired"
    hist = _points(metric_reader, "safejit.lock.wait.duration", tenant)
    assert max(p.max for p in hist) >= 0.3


def _points(reader, name: str, tenant: str) -> list[Any]:
    data = reader.get_metrics_data()
    out = []
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    out += [p for p in metric.data.data_points if p.attributes.get("safejit.tenant") == tenant]
    return out


def test_metrics_with_attributes_and_buckets(make_runtime, metric_reader, spans):
    tenant = _tenant()
    rt = make_runtime(tenant=tenant, memory_max_entries=1)
    rt.compile(safejit.Source(ADD_C, "add"))
    rt.compile(safejit.Source(ADD_C, "add"))  # memory hit: counted by the observable counter
    rt.compile(safejit.Source("int two(void) { return 2; }", "two"))  # evicts "add"
    lookups = {
        (p.attributes["safejit.tier"], p.attributes["safejit.result"], p.attributes["safejit.reason"]): p.value
        for p in _points(metric_reader, "safejit.cache.lookups", tenant)
    }
    assert lookups[("memory", "miss", "absent")] == 2
    assert (
        lookups[("disk", "miss", "absent")] == 2
    )  # one per spec, as stats() counts misses (not the look under the lock)
    assert [p.value for p in _points(metric_reader, "safejit.cache.memory.hits", tenant)] == [1]
    assert [p.value for p in _points(metric_reader, "safejit.cache.evictions", tenant)] == [1]
    assert [p.value for p in _points(metric_reader, "safejit.cache.memory.entries", tenant)] == [1]
    assert _points(metric_reader, "safejit.cache.memory.bytes", tenant)[0].value > 0
    outcomes = {
        p.attributes["safejit.outcome"]: p.value for p in _points(metric_reader, "safejit.publish.outcomes", tenant)
    }
    assert outcomes == {"published": 2}
    for name in ("safejit.compile.duration", "safejit.load.duration"):
        (point,) = _points(metric_reader, name, tenant)
        assert point.count == 2 and tuple(point.explicit_bounds) == DURATION_BUCKETS
    assert DURATION_BUCKETS[0] == 0.001 and DURATION_BUCKETS[-1] == 600.0


def test_threads_share_one_span_per_call(make_runtime, spans):
    rt = make_runtime(tenant=_tenant())
    barrier = threading.Barrier(4)

    def work() -> None:
        barrier.wait()
        rt.compile(safejit.Source(ADD_C, "add"))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len([s for s in spans.get_finished_spans() if s.name == "safejit.compiler.run"]) == 1


def test_setup_without_the_otlp_exporter_names_the_package_and_changes_nothing(monkeypatch):
    import sys

    from opentelemetry import trace

    from safejit.telemetry import _sdk

    before = trace.get_tracer_provider()
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(safejit.ConfigError, match="opentelemetry-exporter-otlp-proto-http"):
        _sdk.setup(otlp_endpoint="http://127.0.0.1:9")
    assert trace.get_tracer_provider() is before


@pytest.mark.parametrize("when", ["on_start", "on_end"])
def test_a_span_processor_that_raises_never_breaks_a_compile(make_runtime, spans, when, caplog):
    """The SDK passes on what a span processor raises at a span's start or end: every
    compile() failed while such a processor was installed."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor

    class Failing(SpanProcessor):
        armed = False

        def on_start(self, span, parent_context=None):
            if self.armed and when == "on_start":
                raise RuntimeError("processor on_start failed")

        def on_end(self, span):
            if self.armed and when == "on_end":
                raise RuntimeError("processor on_end failed")

    caplog.set_level("DEBUG", logger="safejit.telemetry")  # (said once at WARNING, then at DEBUG)
    failing = Failing()
    trace.get_tracer_provider().add_span_processor(failing)
    failing.armed = True
    try:
        rt = make_runtime()
        assert rt.compile(safejit.Source("int one(void) { return 1; }", "one")).kernel("one")() == 1
        with pytest.raises(safejit.CompileError):  # (the block's own error still comes out, as it was)
            rt.compile(safejit.Source("int broken(void) { return }", "broken"))
    finally:
        failing.armed = False
    assert "could not be started or ended" in caplog.text


def test_build_and_warm_spans_say_their_tier(make_runtime, spans, tmp_path):
    """observability.md: safejit.compile carries safejit.tier; build() and warm() set none."""
    rt = make_runtime()
    src = safejit.Source("int b(void) { return 3; }", "b")
    rt.build(src)
    rt.build(src)
    tiers = [s.attributes.get("safejit.tier") for s in spans.get_finished_spans() if s.name == "safejit.compile"]
    assert tiers in (["compiled", "memory"], ["compiled", "disk"]), tiers


def test_a_failed_compile_counts_its_time_and_an_oversize_artifact_is_a_violation(make_runtime, metric_reader):
    """compile.duration left out failed compiles (timeouts above all), and an artifact over
    max_artifact_bytes was refused without counting a policy violation."""
    tenant = _tenant()
    rt = make_runtime(tenant=tenant)
    with pytest.raises(safejit.CompileError):
        rt.compile(safejit.Source("int broken(void) { return }", "broken"))
    (point,) = _points(metric_reader, "safejit.compile.duration", tenant)
    assert point.count == 1 and point.sum > 0
    small = make_runtime(tenant=tenant, max_artifact_bytes=1024)
    with pytest.raises(safejit.LimitExceededError):
        small.compile(safejit.Source("int one(void) { return 1; }", "one"))
    kinds = {p.attributes["safejit.kind"]: p.value for p in _points(metric_reader, "safejit.policy.violations", tenant)}
    assert kinds == {"LimitExceededError": 1}
