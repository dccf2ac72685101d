"""The build job's events while a compile runs (``_pipeline/build_job.py``)."""

from __future__ import annotations

import pytest

import safejit
from safejit._pipeline import build_job
from safejit.sandbox import lookups

pytestmark = pytest.mark.skipif(not lookups.supported(), reason="no lookup recorder on this machine")


def test_the_records_are_read_and_walked_while_the_compile_runs(make_runtime, monkeypatch):
    """The preprocessor's records are read when it closes them (its assembler and
    linker run on): the check after the compile then reads and walks only what came
    after. Nothing is skipped: what was read early is the start of what is read last."""
    seen: list[tuple[bytes, int]] = []
    early = build_job.BuildJob.looked

    def looked(self, data: bytes) -> None:
        early(self, data)
        seen.append((data, len(self._check._inside) if self._check is not None else 0))

    monkeypatch.setattr(build_job.BuildJob, "looked", looked)
    rt = make_runtime()
    kernel = rt.compile(safejit.Source("#include <stdint.h>\nint64_t k(void) { return 7; }\n", "k")).kernel("k")
    assert kernel() == 7 and rt.stats()["compiles"] == 1
    assert seen, "the records were not read while the compile ran"
    data, walked = seen[0]
    assert b"stdint.h" in data and walked > 0  # (its lookups walked then, not after)
