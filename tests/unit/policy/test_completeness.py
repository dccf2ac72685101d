"""Negative dependencies: a new shadowing header, or a __has_include that flips,
makes a leaf a miss (disk) and a memory entry stale — and explain names the file."""

from __future__ import annotations

from pathlib import Path

import safejit
from tests.conftest import settle


def _two_dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "proj"
    first, second = root / "first", root / "second"
    first.mkdir(parents=True)
    second.mkdir()
    (second / "cfg.h").write_text("#define CFG 2\n")
    return root, first, second


KERNEL = '#include "cfg.h"\nint cfg(void) { return CFG; }\n'
PROBE = (
    "#if __has_include(<extra_cfg.h>)\n#include <extra_cfg.h>\n#else\n#define EXTRA 0\n#endif\n"
    "int extra(void) { return EXTRA; }\n"
)


def test_new_shadowing_header_is_a_disk_miss_named_by_explain(make_runtime, tmp_path):
    root, first, second = _two_dirs(tmp_path)
    dirs = (str(first), str(second))
    src = safejit.Source(KERNEL, "cfg")
    assert make_runtime(source_roots=(str(root),)).compile(src, include_dirs=dirs).kernel("cfg")() == 2
    (first / "cfg.h").write_text("#define CFG 1\n")
    settle()
    rt = make_runtime(source_roots=(str(root),))
    explanation = rt.explain(src, include_dirs=dirs)
    assert explanation.result == "miss" and explanation.path == str(first / "cfg.h")
    assert "shadows" in explanation.reason
    assert rt.compile(src, include_dirs=dirs).kernel("cfg")() == 1
    assert rt.stats()["compiles"] == 1


def test_new_shadowing_header_makes_a_memory_entry_stale(make_runtime, tmp_path):
    root, first, second = _two_dirs(tmp_path)
    dirs = (str(first), str(second))
    rt = make_runtime(source_roots=(str(root),), max_staleness_s=0)
    src = safejit.Source(KERNEL, "cfg")
    assert rt.compile(src, include_dirs=dirs).kernel("cfg")() == 2
    (first / "cfg.h").write_text("#define CFG 1\n")
    settle()
    assert rt.compile(src, include_dirs=dirs).kernel("cfg")() == 1
    assert rt.stats()["stale"] == 1


def test_has_include_that_becomes_true_rebuilds(make_runtime, tmp_path):
    root, first, _ = _two_dirs(tmp_path)
    src = safejit.Source(PROBE, "extra")
    rt = make_runtime(source_roots=(str(root),), max_staleness_s=0)
    assert rt.compile(src, include_dirs=(str(first),)).kernel("extra")() == 0
    (first / "extra_cfg.h").write_text("#define EXTRA 7\n")
    settle()
    assert rt.compile(src, include_dirs=(str(first),)).kernel("extra")() == 7
    other = make_runtime(source_roots=(str(root),))
    assert other.compile(src, include_dirs=(str(first),)).kernel("extra")() == 7
    assert other.stats()["compiles"] == 0  # the second leaf (with the header) verifies


def test_removing_the_shadow_reuses_the_first_leaf(make_runtime, tmp_path):
    root, first, second = _two_dirs(tmp_path)
    dirs = (str(first), str(second))
    src = safejit.Source(KERNEL, "cfg")
    make_runtime(source_roots=(str(root),)).compile(src, include_dirs=dirs)
    (first / "cfg.h").write_text("#define CFG 1\n")
    settle()
    make_runtime(source_roots=(str(root),)).compile(src, include_dirs=dirs)
    (first / "cfg.h").unlink()
    settle()
    rt = make_runtime(source_roots=(str(root),))
    assert rt.compile(src, include_dirs=dirs).kernel("cfg")() == 2
    assert rt.stats()["compiles"] == 0
