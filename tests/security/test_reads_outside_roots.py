"""Class 5: reads outside the roots through check-then-use races, hard links and
directories swapped during a compile. Each: the typed error (or a build that is never
published), and nothing of the outside file published or leaked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import safejit
from safejit.closure import scan
from tests.conftest import leaves
from tests.security._support import SECRET_TOKEN, assert_no_secret, assert_nothing_published


def _root(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    inc = root / "inc"
    inc.mkdir(parents=True)
    (inc / "x.h").write_text("#define X 1\n")
    return root, inc


SRC = safejit.Source('#include "x.h"\nint x(void){return X;}\n', "x")


def test_runtime_source_swapped_for_a_symlink_after_the_check_reads_nothing_outside(
    make_runtime, tmp_path, outside, monkeypatch
):
    """The file is confined by where the opened descriptor really is: a path swapped
    between the check and the open cannot make it read another file."""
    root, _ = _root(tmp_path)
    kernel = root / "kernel.c"
    kernel.write_text("int k(void){return 1;}\n")
    rt = make_runtime(source_roots=(str(root),))
    real_open = os.open

    def swapping_open(path, flags, *args, **kw):
        if str(path) == str(kernel) and not kernel.is_symlink():
            kernel.unlink()
            kernel.symlink_to(outside / "secret")  # the swap, between check and use
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", swapping_open)
    with pytest.raises(safejit.PathConfinementError) as exc:
        rt.source(kernel)
    assert_no_secret(exc.value)


def test_a_header_swapped_for_a_symlink_during_the_scan_is_refused(make_runtime, tmp_path, outside, monkeypatch):
    root, inc = _root(tmp_path)
    header = inc / "x.h"
    real_read = scan.read_beneath

    def swapping_read(path, allowed):
        if path == str(header) and not header.is_symlink():
            header.unlink()
            header.symlink_to(outside / "secret.h")  # after the compiler read it, before the scan
        return real_read(path, allowed)

    monkeypatch.setattr(scan, "read_beneath", swapping_read)
    rt = make_runtime(source_roots=(str(root),), sandbox="off")
    with pytest.raises(safejit.UndeclaredDependencyError) as exc:
        rt.compile(SRC, include_dirs=(str(inc),))
    assert_no_secret(exc.value)
    assert leaves(rt.config.cache_dirs[0]) == []


@pytest.mark.parametrize("sandbox", ["off", "auto"])
def test_a_hard_link_under_a_root_to_an_outside_file_is_refused(make_runtime, tmp_path, outside, cache_dir, sandbox):
    root, inc = _root(tmp_path)
    os.link(outside / "secret.h", inc / "linked.h")
    rt = make_runtime(source_roots=(str(root),), sandbox=sandbox)
    src = safejit.Source('#include "linked.h"\nint s(void){return SECRET;}\n', "s")
    with pytest.raises(safejit.UndeclaredDependencyError) as exc:
        rt.compile(src, include_dirs=(str(inc),))
    assert "hard links" in str(exc.value)
    assert_no_secret(exc.value)
    assert_nothing_published(cache_dir)


def test_a_directory_swapped_during_the_compile_is_never_vouched_for(make_runtime, tmp_path, outside, cache_dir):
    """With the sandbox off nothing stops the compiler from following a symlink swapped
    in for a moment; the swap changes the directory it was made in, so a build during
    which a directory on the way to a header changed is compiled again, and never
    published while that keeps happening."""
    from safejit.backends.fake import FakeBackend

    root, inc = _root(tmp_path)
    calls = []
    real_compile = FakeBackend.compile

    def compile_with_a_swap(self, ctx):
        out = real_compile(self, ctx)
        calls.append(1)
        # The swap and the swap back (the content the scan then reads is the original).
        (inc / "x.h").rename(inc / "x.h.away")
        (inc / "x.h").symlink_to(outside / "secret.h")
        (inc / "x.h").unlink()
        (inc / "x.h.away").rename(inc / "x.h")
        return out

    FakeBackend.compile = compile_with_a_swap  # type: ignore[method-assign]
    try:
        rt = make_runtime(backend="fake", source_roots=(str(root),), sandbox="off")
        mod = rt.compile(safejit.Source('#include "x.h"\n', "k"), include_dirs=(str(inc),))
    finally:
        FakeBackend.compile = real_compile  # type: ignore[method-assign]
    assert mod.kernel("X")() == 1 and len(calls) == 2
    assert rt.stats()["published"] == 0 and rt.stats()["not_published"] == 1
    assert_nothing_published(cache_dir)
    assert SECRET_TOKEN not in str(mod.artifact)


def test_a_header_whose_name_is_not_text_is_refused_by_name(make_runtime, tmp_path, cache_dir):
    """A file named by bytes that are not UTF-8 cannot be recorded in a closure (nor in a
    key): the build is refused, naming it, and nothing is published."""
    root, inc = _root(tmp_path)
    os.mkdir(os.fsencode(inc / "odd"))
    (Path(os.fsdecode(os.fsencode(inc) + b"/odd/h\xff.h"))).write_text("#define V 3\n")
    (inc / "all.h").write_bytes(b'#include "odd/h\xff.h"\n')
    rt = make_runtime(source_roots=(str(root),))
    with pytest.raises(safejit.UndeclaredDependencyError, match="not UTF-8") as err:
        rt.compile(safejit.Source('#include "all.h"\nint v(void){return V;}\n', "v"), include_dirs=(str(inc),))
    assert err.value.path.endswith("odd/h\udcff.h")
    assert_nothing_published(cache_dir)
