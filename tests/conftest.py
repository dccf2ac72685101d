"""Shared fixtures: a clean environment, temporary cache and source roots,
and a Runtime factory that closes what it made."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import safejit
from safejit import faults
from safejit.cache import maintenance
from safejit.cache import staging as spares

settings.register_profile("ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ADD_C = "int add(int a, int b) { return a + b; }\n"


def _clang() -> str | None:
    import shutil

    for version in ("", *(f"-{n}" for n in range(30, 9, -1))):
        found = shutil.which(f"clang{version}", path="/usr/local/bin:/usr/bin")
        if found:
            return found
    return None


#: A clang to use as the host compiler (clang, else the newest clang-N), None if none.
CLANG = _clang()


@pytest.fixture(scope="session", autouse=True)
def _private_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The session's own private state dir (the sandbox shim, stat memo, probes): the
    user's own is never touched, and one shim build serves the whole session."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
        yield


def _temporary_entries() -> set[str]:
    """What lies in the temporary dirs by names this suite and safejit make there, except
    the per-user bases that stay by design (/dev/shm/safejit-u<uid>, safejit-root)."""
    import tempfile

    found = set()
    for where in dict.fromkeys((tempfile.gettempdir(), "/dev/shm")):
        try:
            names = os.listdir(where)
        except OSError:
            continue
        for name in names:
            if name.startswith(("safejit", "tmp", ".safejit")):
                if where == "/dev/shm" and (name == "safejit-root" or name.startswith("safejit-u")):
                    continue
                found.add(os.path.join(where, name))
    return found


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    """The suite leaves nothing in the temporary dirs (a killed worker's directory, a
    test's file): whatever a run adds there outside its own tmp_path, and that is still
    there once every Runtime is gone, fails the run."""
    import gc
    import time

    before = _temporary_entries()
    yield
    gc.collect()  # (what Runtimes no one closed made is removed as they are collected)
    left = sorted(_temporary_entries() - before)
    for _ in range(10):  # (what another process on this machine is using now comes and goes)
        left = [path for path in left if os.path.lexists(path)]
        if not left:
            break
        time.sleep(0.3)
    assert not left, f"left behind in the temporary dirs: {left[:10]}"


@pytest.fixture
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh private state dir for this test alone (``sandbox.statedir``): where its
    Runtimes keep the shim, the stat memo and the toolchain probes."""
    from safejit.sandbox import statedir

    home = tmp_path / "state-home"
    home.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    monkeypatch.setattr(statedir, "_opened", {})
    return home / "safejit"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("SAFEJIT_"):
            monkeypatch.delenv(name)
    faults.reset()
    yield
    faults.reset()


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    path.mkdir()
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A source root with ``include/`` holding ``value.h`` → ``inner.h``."""
    root = tmp_path / "project"
    inc = root / "include"
    inc.mkdir(parents=True)
    (inc / "value.h").write_text('#include "inner.h"\n#define VALUE (INNER + 1)\n')
    (inc / "inner.h").write_text("#define INNER 41\n")
    settle()  # a compile right away must not see the files as written during it
    return root


KERNEL_WITH_HEADER = '#include "value.h"\nint value(void) { return VALUE; }\n'


@pytest.fixture
def make_runtime(cache_dir: Path) -> Iterator[Callable[..., safejit.Runtime]]:
    made: list[safejit.Runtime] = []

    def factory(**overrides: Any) -> safejit.Runtime:
        overrides.setdefault("cache_dirs", (str(cache_dir),))
        rt = safejit.Runtime(config=safejit.Config(**overrides))
        made.append(rt)
        return rt

    yield factory
    for rt in made:
        rt.close()


def settle() -> None:
    """Step past the coarse clock's lag after editing a file: an edit within it of a
    compile makes the builder compile twice (see runtime/builder.py), which would
    change exact compile counts."""
    import time

    from safejit.closure.scan import COARSE_NS

    time.sleep(COARSE_NS / 1e9 + 0.008)


def names_under(root: Path | str, pattern: str = "*") -> list[Path]:
    """Entries under ``root`` whose name matches ``pattern``, once this process's
    background work is done. Unlike ``Path.rglob``, a directory removed during the walk
    (a spare work dir let go) is skipped, not an error."""
    import fnmatch

    spares.settle()
    found = []
    for parent, dirs, files in os.walk(root):
        found += [Path(parent, name) for name in (*dirs, *files) if fnmatch.fnmatch(name, pattern)]
    return found


def assert_cache_sound(root: Path | str) -> None:
    """The cache check every fault and security test ends with."""
    assert maintenance.check(str(root)) == []


def staging_residue(root: Path | str) -> list[str]:
    """What is left under ``<root>/v1/tmp`` once background work is done: everything but
    unused prepared work directories (cache.staging: empty files only, so nothing in
    them was written) and owner marks."""
    spares.settle()
    tmp = Path(root) / "v1" / "tmp"
    if not tmp.is_dir():
        return []
    # (a living process's mark, <token>.alive, stays as long as it does: no residue)
    return sorted(e.name for e in tmp.iterdir() if not spares.pristine(str(e)) and not e.name.endswith(".alive"))


def leaves(root: Path | str) -> list[maintenance.LeafInfo]:
    return list(maintenance.iter_leaves(str(root)))


@pytest.fixture(scope="session")
def otel_sdk():
    """The real OpenTelemetry SDK with in-memory exporter and reader, installed once."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return exporter, reader


@pytest.fixture
def spans(otel_sdk):
    exporter, _ = otel_sdk
    exporter.clear()
    return exporter


@pytest.fixture
def metric_reader(otel_sdk):
    return otel_sdk[1]


def metric_points(reader, name: str, **match: str) -> list[Any]:
    """The data points of the metric ``name`` the reader collects now whose attributes
    include ``match`` (attribute names with dots: pass them as ``**{"safejit.tenant": t}``)."""
    data = reader.get_metrics_data()
    found = []
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    found += [p for p in metric.data.data_points if match.items() <= dict(p.attributes).items()]
    return found
