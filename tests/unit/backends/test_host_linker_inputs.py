"""Files the linker reads (crt files, libraries, linker scripts) are part of the
dependency closure, though no compiler depfile names them: GNU ld lists them
(``--dependency-file``). A library upgraded in place is a miss, never a stale
binary; a library outside the declared roots is refused like a header would be."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest

import safejit
from safejit.backends._toolreads import LD_DEP_FLAG, tool_reads
from safejit.cache.leaf import decode_manifest
from safejit.closure.hashing import hash_file
from safejit.policy import completeness
from safejit.policy.roots import build_anchors
from tests.conftest import settle
from tests.security._support import assert_nothing_published, write_failing_wrapper, write_wrapper

VALUE = safejit.Source("int lib_value(void);\nint value(void) { return lib_value(); }\n", "value")


def _archive(lib: Path, value: int, *, in_place: bool = False) -> Path:
    """``lib/libval.a`` holding ``lib_value()``, which returns ``value``."""
    work = lib.parent / f"obj{value}"
    work.mkdir(exist_ok=True)
    (work / "v.c").write_text(f"int lib_value(void) {{ return {value}; }}\n")
    subprocess.run(["cc", "-c", "-fPIC", "-o", work / "v.o", work / "v.c"], check=True)
    archive = lib / "libval.a"
    subprocess.run(["ar", "rcs", work / "libval.a", work / "v.o"], check=True)
    if in_place and archive.exists():
        with archive.open("r+b") as f:  # the same inode, rewritten
            f.truncate(0)
            f.write((work / "libval.a").read_bytes())
    else:
        (work / "libval.a").replace(archive)
    return archive


def _project(tmp_path: Path, lib: Path) -> tuple[Path, Path]:
    """A source root, and a compiler in it that links ``libval`` from ``lib`` (``-L`` and
    ``-l`` of a name off the toolchain's list are refused as flags; a site's own
    compiler wrapper may add them)."""
    root = tmp_path / "proj"
    root.mkdir(exist_ok=True)
    return root, write_wrapper(root, f"exec /usr/bin/cc '-L{lib}' \"$@\" -lval", name="cc-with-lib")


def _deps(module: safejit.Module) -> list[str]:
    manifest = decode_manifest((Path(module.artifact.path) / "manifest.json").read_bytes())
    return [f"{anchor}/{relpath}" for anchor, relpath, _ in manifest.deps]


@pytest.mark.parametrize(("in_place", "libdir"), [(False, "lib"), (True, "lib"), (False, "lib dir$$x")])
def test_a_library_upgraded_in_place_is_a_miss_in_both_tiers(make_runtime, tmp_path, in_place, libdir):
    # (GNU ld lists names raw: a space or "$$" in a dir is part of the name)
    lib = tmp_path / "proj" / libdir
    lib.mkdir(parents=True)
    root, cc = _project(tmp_path, lib)
    _archive(lib, 1)
    settle()  # (a library changed within a clock tick of the compile makes it compile twice)
    config = {"source_roots": (str(root),), "host_cc": str(cc), "max_staleness_s": 0.0}
    rt = make_runtime(**config)
    before = rt.compile(VALUE)
    assert before.kernel("value")() == 1
    deps = _deps(before)
    assert f"s0/{libdir}/libval.a" in deps
    # What the linker reads for every link (crt files, libc) is the toolchain's own.
    assert not [d for d in deps if d.endswith(("/crti.o", "/libc.so", "/libgcc.a"))]
    settle()
    _archive(lib, 2, in_place=in_place)
    settle()
    after = rt.compile(VALUE)  # the memory entry is stale: compiled again
    assert after.kernel("value")() == 2
    assert rt.stats()["compiles"] == 2 and rt.stats()["stale"] == 1
    assert after.artifact.deps_key != before.artifact.deps_key
    fresh = make_runtime(**config)  # another process: the disk tier serves the new build only
    assert fresh.compile(VALUE).kernel("value")() == 2
    assert fresh.stats()["disk_hits"] == 1 and fresh.stats()["compiles"] == 0


def test_a_library_outside_the_roots_is_refused_and_nothing_is_published(make_runtime, tmp_path, cache_dir):
    outside = tmp_path / "outside"
    outside.mkdir()
    _archive(outside, 7)
    root, cc = _project(tmp_path, outside)
    # Without Landlock's read rules, the closure check is what refuses it.
    rt = make_runtime(source_roots=(str(root),), host_cc=str(cc), sandbox="off")
    with pytest.raises(safejit.UndeclaredDependencyError) as exc:
        rt.compile(VALUE)
    assert exc.value.path.endswith("libval.a")
    assert rt.stats()["published"] == 0
    assert_nothing_published(cache_dir)


def test_a_linker_that_lists_nothing_is_reported(make_runtime, tmp_path, caplog):
    root = tmp_path / "proj"
    root.mkdir()
    # A linker without --dependency-file (gold, say): the probe finds it out.
    cc = write_failing_wrapper(root, "--dependency-file", name="cc-no-link-deps")
    caplog.set_level(logging.WARNING)
    module = make_runtime(source_roots=(str(root),), host_cc=str(cc)).compile(
        VALUE.__class__("int one(void) { return 1; }\n", "one")
    )
    assert module.kernel("one")() == 1
    manifest = decode_manifest((Path(module.artifact.path) / "manifest.json").read_bytes())
    assert LD_DEP_FLAG not in manifest.argv
    assert any("cannot list the files it reads (--dependency-file)" in r.getMessage() for r in caplog.records)


def test_an_upgraded_crt_file_is_a_miss_not_a_stale_hit(make_runtime, tmp_path):
    # The files every link reads (crt files, libc, libgcc) are in the toolchain's digest,
    # and the probe remembered on disk is redone when one of them changes.
    root = tmp_path / "proj"
    startfiles = root / "crt"
    startfiles.mkdir(parents=True)
    real = subprocess.run(["cc", "-print-file-name=crti.o"], capture_output=True, text=True, check=True).stdout.strip()
    crti = startfiles / "crti.o"
    shutil.copyfile(real, crti)
    cc = write_wrapper(root, 'exec /usr/bin/cc "$@"', name="cc-own-crt")  # (its probes too:)
    cc.write_text(cc.read_text().replace("exec /usr/bin/cc", f"exec /usr/bin/cc -B{startfiles}/"))
    config = {"source_roots": (str(root),), "host_cc": str(cc)}
    one = safejit.Source("int one(void) { return 1; }\n", "one")
    before = make_runtime(**config).compile(one)
    manifest = decode_manifest((Path(before.artifact.path) / "manifest.json").read_bytes())
    assert hash_file(str(crti))[0] in manifest.toolchain["digest"].split(":")
    settle()
    with crti.open("ab") as f:
        f.write(b"\0" * 8)  # (trailing bytes: still an object file)
    rt = make_runtime(**config)  # a new backend: the probe remembered on disk is looked at again
    after = rt.compile(one)
    assert after.kernel("one")() == 1
    assert rt.stats()["compiles"] == 1 and rt.stats()["disk_hits"] == 0
    assert after.artifact.build_key != before.artifact.build_key


def test_the_linkers_dirs_are_roots_for_what_it_reads_only(make_runtime):
    # Where -l finds libraries is declared for what the linker reads, never for includes.
    libm = Path(subprocess.run(["cc", "-print-file-name=libm.so"], capture_output=True, text=True).stdout.strip())
    rt = make_runtime()
    module = rt.compile(
        safejit.Source("double sin(double);\ndouble f(double x) { return sin(x); }\n", "f"), flags=("-lm",)
    )
    assert [d for d in _deps(module) if d.startswith("l") and d.endswith("/libm.so")]
    with pytest.raises(safejit.PathConfinementError):
        rt.compile(safejit.Source("int one(void) { return 1; }\n", "one"), include_dirs=(str(libm.resolve().parent),))


@pytest.mark.parametrize("name", ["libm.so", "crti.o"])
def test_what_inline_asm_reads_is_never_confined_by_the_linkers_roots(make_runtime, cache_dir, name):
    # The linker's dirs are roots for what the linker reads, and what every link reads
    # (crt files, libc) is excused from a closure for the linker only; the assembler
    # reads what the source names (.incbin), confined like an include.
    path = subprocess.run(["cc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    asm = f'.section .rodata\\n.globl blob\\nblob:\\n.incbin \\"{path}\\"\\n.text\\n'
    source = safejit.Source(
        f'__asm__("{asm}");\nextern const char blob[];\nint first(void) {{ return blob[1]; }}\n', "first"
    )
    rt = make_runtime(sandbox="off")
    with pytest.raises(safejit.UndeclaredDependencyError):
        rt.compile(source)
    assert_nothing_published(cache_dir)


def test_a_file_directive_naming_a_dir_or_nothing_is_no_error(make_runtime, tmp_path):
    # gas lists the names .file directives give, though it never reads them: one that is
    # no regular file now (a dir; a file read and deleted since) may have been read as
    # one: built, never vouched for. Outside every root, it is refused like any read there.
    root = tmp_path / "proj"
    root.mkdir()
    rt = make_runtime(source_roots=(str(root),))
    dir_named = rt.compile(safejit.Source('__asm__(".file \\"/usr/include\\"");\nint one(void) { return 1; }\n', "one"))
    assert dir_named.kernel("one")() == 1
    code = f'__asm__(".file \\"{root}/gen.c\\"");\nint two(void) {{ return 2; }}\n'
    assert rt.compile(safejit.Source(code, "two")).kernel("two")() == 2
    assert rt.stats()["published"] == 0 and rt.stats()["not_published"] == 2
    with pytest.raises(safejit.UndeclaredDependencyError):
        rt.compile(safejit.Source('__asm__(".file \\"/nonexistent/gen.c\\"");\nint three(void) { return 3; }\n', "t"))


def test_a_library_reached_through_a_symlink_into_the_linkers_dirs_hits_in_a_new_process(make_runtime):
    # libatomic.so in gcc's dir links to ../../../x86_64-linux-gnu/: under the linker's
    # roots only. It is recorded where a verification confines it the same way.
    lib = Path(subprocess.run(["cc", "-print-file-name=libatomic.so"], capture_output=True, text=True).stdout.strip())
    if not lib.is_symlink():
        pytest.skip("no symlinked libatomic.so here")
    source = safejit.Source("int seven(void) { return 7; }\n", "seven")
    first = make_runtime()
    assert first.compile(source, flags=("-latomic",)).kernel("seven")() == 7
    again = make_runtime()
    assert again.compile(source, flags=("-latomic",)).kernel("seven")() == 7
    assert again.stats()["disk_hits"] == 1 and again.stats()["compiles"] == 0


def test_a_listed_read_that_is_no_regular_file_now_is_never_vouched_for(tmp_path):
    # A file the assembler read and someone swapped for a directory since: confined
    # first, then unknown (never skipped as a .file directive's name would be).
    root = tmp_path / "root"
    (root / "data.bin").mkdir(parents=True)
    anchors = build_anchors([str(root)], [])
    closure = completeness.record_closure([str(root / "data.bin")], anchors, max_deps=10, started_ns=0, includes=False)
    assert closure.too_new == [str(root / "data.bin")] and closure.deps == []
    assert tool_reads(
        str(tmp_path / "work"), (), {str(tmp_path / "work" / ".asm.d"): f"x.o: {root}/data.bin\n".encode()}
    ) == {"assembler": (f"{root}/data.bin",)}
