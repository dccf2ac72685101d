"""Path confinement: every path the compiler may read lies under a declared root.

One test per attack. Each asserts the typed error, that the compiler never ran
(or, where the compiler itself reads the file, that nothing was published), and
that the outside file's content appears in no error message or log.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import safejit
from safejit.closure.anchors import LOOKED_OUTSIDE
from safejit.sandbox import lookups
from tests.conftest import ADD_C, KERNEL_WITH_HEADER, assert_cache_sound, leaves
from tests.security._support import (
    SECRET_HEADER,
    SECRET_TOKEN,
    assert_no_secret,
    assert_nothing_published,
    needs_landlock,
)

ADD = safejit.Source(ADD_C, "add")

#: A header the compiler itself opens: without Landlock the completeness check
#: refuses the closure; with Landlock the open is denied and the compile fails.
READ_BY_COMPILER = [
    pytest.param("off", safejit.UndeclaredDependencyError, id="closure-check"),
    # (Landlock refuses the open; the compile fails as one that finds nothing there would be refused)
    pytest.param("auto", safejit.UndeclaredDependencyError, id="landlock", marks=needs_landlock),
]


#: What the assembler reads (.incbin, .include) it reports itself, in words of its own.
READ_BY_ASSEMBLER = [
    pytest.param("off", safejit.UndeclaredDependencyError, id="closure-check"),
    # (the assembler is recorded too: what it looked up outside the roots refuses the build)
    pytest.param(
        "auto",
        safejit.UndeclaredDependencyError if lookups.supported() else safejit.CompileError,
        id="landlock",
        marks=needs_landlock,
    ),
]


def _runtime(make_runtime, *roots: Path, **config):
    return make_runtime(source_roots=tuple(str(r) for r in roots), **config)


def _assert_refused_before_compiling(rt: safejit.Runtime, exc: pytest.ExceptionInfo, cache_dir: Path) -> None:
    assert rt.stats()["compiles"] == 0
    assert_no_secret(exc.value)
    assert_nothing_published(cache_dir)


def _assert_outside(exc: pytest.ExceptionInfo, given: object, *, hidden: str = "") -> None:
    """An error about a path outside the roots says only that: not where it led (nor
    the working directory a relative path was resolved in), nor whether it exists."""
    text = str(exc.value)
    assert "outside the declared roots" in text and exc.value.path == str(given)
    assert not hasattr(exc.value, "resolved")
    if hidden:
        assert hidden not in text.replace(str(given), "")
    assert os.getcwd() not in text.replace(str(given), "")


def _assert_compiler_read_refused(exc: pytest.ExceptionInfo, mode: str, cache_dir: Path) -> None:
    if mode == "auto":  # Landlock denied the open itself (said as of a file not there: no oracle)
        assert "outside every declared root" in str(exc.value) and "Permission denied" not in str(exc.value)
    assert_no_secret(exc.value)
    assert_nothing_published(cache_dir)


def test_relative_include_dir_outside_roots_is_refused(make_runtime, project, outside, cache_dir, monkeypatch):
    monkeypatch.chdir(outside.parent)
    rt = _runtime(make_runtime, project)
    with pytest.raises(safejit.PathConfinementError) as exc:
        rt.compile(ADD, include_dirs=("outside",))
    _assert_outside(exc, "outside", hidden=str(outside))
    _assert_refused_before_compiling(rt, exc, cache_dir)


@pytest.mark.parametrize("where", ["tmp-outside", "/etc"])
def test_absolute_include_dir_outside_roots_is_refused(make_runtime, project, outside, cache_dir, where):
    target = str(outside) if where == "tmp-outside" else where
    rt = _runtime(make_runtime, project)
    with pytest.raises(safejit.PathConfinementError) as exc:
        rt.compile(ADD, include_dirs=(target,))
    assert exc.value.path == target
    _assert_refused_before_compiling(rt, exc, cache_dir)


def test_dotdot_include_dir_escape_is_refused(make_runtime, project, outside, cache_dir):
    escape = f"{project}/include/../../outside"
    assert os.path.isdir(escape)
    rt = _runtime(make_runtime, project)
    with pytest.raises(safejit.PathConfinementError) as exc:
        rt.compile(ADD, include_dirs=(escape,))
    _assert_outside(exc, escape, hidden=str(outside))
    _assert_refused_before_compiling(rt, exc, cache_dir)


def test_dir_symlink_pointing_outside_is_refused(make_runtime, project, outside, cache_dir):
    link = project / "vendor"
    link.symlink_to(outside, target_is_directory=True)
    rt = _runtime(make_runtime, project)
    with pytest.raises(safejit.PathConfinementError) as exc:
        rt.compile(safejit.Source('#include "secret.h"\nint s(void){return SECRET;}\n', "s"), include_dirs=(link,))
    _assert_outside(exc, link, hidden=str(outside))
    _assert_refused_before_compiling(rt, exc, cache_dir)


def test_file_symlink_source_pointing_outside_is_refused(make_runtime, project, outside, cache_dir):
    (outside / "kernel.c").write_text(f"/* {SECRET_TOKEN} */\n{ADD_C}")
    link = project / "kernel.c"
    link.symlink_to(outside / "kernel.c")
    rt = _runtime(make_runtime, project)
    with pytest.raises(safejit.PathConfinementError) as by_source:
        rt.source(link)
    _assert_outside(by_source, link, hidden=str(outside))
    with pytest.raises(safejit.PathConfinementError) as by_compile:  # read by the caller, refused at compile
        rt.compile(safejit.Source.from_file(link))
    _assert_refused_before_compiling(rt, by_source, cache_dir)
    _assert_refused_before_compiling(rt, by_compile, cache_dir)


@pytest.mark.parametrize(("mode", "error"), READ_BY_COMPILER)
@pytest.mark.parametrize("target", ["secret.h", "absent.h"])
def test_file_symlink_header_pointing_outside_is_refused(
    make_runtime, project, outside, cache_dir, mode, error, target
):
    """Refused one way whether the link's target is there or not."""
    (project / "include" / "secret.h").symlink_to(outside / target)
    rt = _runtime(make_runtime, project, sandbox=mode)
    with pytest.raises(error) as exc:
        rt.compile(
            safejit.Source('#include "secret.h"\nint s(void){return SECRET;}\n', "s"),
            include_dirs=(project / "include",),
        )
    if lookups.supported():  # (its recorded lookup refuses it first, naming nothing)
        assert str(exc.value) == LOOKED_OUTSIDE
    elif mode == "off" and target == "secret.h":
        assert exc.value.resolved == str(outside / "secret.h")
    _assert_compiler_read_refused(exc, mode, cache_dir)


def test_source_from_file_outside_roots_is_refused(make_runtime, project, outside, cache_dir):
    kernel = outside / "kernel.c"
    kernel.write_text(f"/* {SECRET_TOKEN} */\n{ADD_C}")
    rt = _runtime(make_runtime, project)
    with pytest.raises(safejit.PathConfinementError) as exc:
        rt.compile(safejit.Source.from_file(kernel))
    _assert_outside(exc, kernel)
    _assert_refused_before_compiling(rt, exc, cache_dir)


def test_runtime_source_outside_roots_is_refused_before_reading(make_runtime, project, outside, cache_dir, monkeypatch):
    opened: list[object] = []
    real_open = os.open

    def spy(path, *args, **kw):
        if "secret" in str(path) or "inner.h" in str(path):
            opened.append(path)
        return real_open(path, *args, **kw)

    monkeypatch.setattr(os, "open", spy)
    rt = _runtime(make_runtime, project)
    with pytest.raises(safejit.PathConfinementError) as exc:
        rt.source(outside / "secret")
    assert opened == []
    _assert_outside(exc, outside / "secret")
    assert_no_secret(exc.value)
    assert rt.source(project / "include" / "inner.h").code == "#define INNER 41\n"  # the spy does see reads
    assert len(opened) == 1
    assert leaves(cache_dir) == []


@pytest.mark.parametrize("kind", ["dotdot-after-nul", "bare-nul", "root-then-nul"])
def test_include_dir_with_nul_is_refused(make_runtime, project, cache_dir, kind):
    bad = {
        "dotdot-after-nul": f"{project}/include\0/../../outside",
        "bare-nul": "\0",
        "root-then-nul": f"{project}\0",
    }[kind]
    rt = _runtime(make_runtime, project)
    with pytest.raises(safejit.PathConfinementError, match="NUL") as exc:
        rt.compile(ADD, include_dirs=(bad,))
    _assert_refused_before_compiling(rt, exc, cache_dir)


@pytest.mark.parametrize(("mode", "error"), READ_BY_COMPILER)
def test_absolute_include_directive_outside_roots_is_refused(make_runtime, project, outside, cache_dir, mode, error):
    code = f'#include "{outside}/secret.h"\nint s(void) {{ return SECRET; }}\n'
    rt = _runtime(make_runtime, project, sandbox=mode)
    with pytest.raises(error) as exc:
        rt.compile(safejit.Source(code, "s"))
    if lookups.supported():  # (its recorded lookup refuses it first, naming nothing)
        assert str(exc.value) == LOOKED_OUTSIDE
    elif mode == "off":
        assert exc.value.resolved == str(outside / "secret.h")
    _assert_compiler_read_refused(exc, mode, cache_dir)


@pytest.mark.parametrize(("mode", "error"), READ_BY_COMPILER)
def test_relative_dotdot_include_directive_escape_is_refused(make_runtime, project, cache_dir, mode, error):
    # The declared root is project/include; project/outside lies beside it, outside the root.
    include = project / "include"
    (project / "outside").mkdir()
    (project / "outside" / "secret.h").write_text(SECRET_HEADER)
    rt = _runtime(make_runtime, include, sandbox=mode)
    code = '#include "../outside/secret.h"\nint s(void) { return SECRET; }\n'
    with pytest.raises(error) as exc:
        rt.compile(safejit.Source(code, "s"), include_dirs=(include,))
    if lookups.supported():  # (its recorded lookup refuses it first, naming nothing)
        assert str(exc.value) == LOOKED_OUTSIDE
    elif mode == "off":
        assert exc.value.resolved == str(project / "outside" / "secret.h")
    _assert_compiler_read_refused(exc, mode, cache_dir)


def test_in_root_include_still_compiles(make_runtime, project, cache_dir):
    """Control: the same shapes inside the root are accepted."""
    rt = _runtime(make_runtime, project)
    assert (
        rt.compile(safejit.Source(KERNEL_WITH_HEADER, "value"), include_dirs=(project / "include",)).kernel("value")()
        == 42
    )
    assert len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)


def test_symlink_dotdot_decoy_cannot_mask_a_header_edit(make_runtime, tmp_path):
    """A header reached through ``sub/../x.h`` where ``sub`` is a symlink inside the
    root: the compiler reads ``deep/x.h``; editing it must rebuild."""
    root = tmp_path / "proj"
    (root / "inc").mkdir(parents=True)
    (root / "deep" / "dir").mkdir(parents=True)
    (root / "inc" / "sub").symlink_to(root / "deep" / "dir", target_is_directory=True)
    (root / "deep" / "dir" / "h.h").write_text('#include "../x.h"\n')
    (root / "deep" / "x.h").write_text("#define V 1\n")
    (root / "inc" / "x.h").write_text("#define DECOY 1\n")  # what the lexical path names
    src = safejit.Source('#include "sub/h.h"\nint v(void) { return V; }\n', "v")
    first = _runtime(make_runtime, root)
    assert first.compile(src, include_dirs=(root / "inc",)).kernel("v")() == 1
    (root / "deep" / "x.h").write_text("#define V 2\n")
    second = _runtime(make_runtime, root)
    assert second.compile(src, include_dirs=(root / "inc",)).kernel("v")() == 2


def test_source_from_a_fifo_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "kernel.c"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        safejit.Source.from_file(fifo)


def _asm_reading(directive: str, path: Path) -> safejit.Source:
    """A kernel whose inline asm makes the assembler read ``path`` (the compiler's
    depfile never names it)."""
    asm = f'.section .rodata\\n.globl blob\\nblob:\\n{directive} \\"{path}\\"\\n.text\\n'
    return safejit.Source(f'__asm__("{asm}");\nint s(void) {{ return 1; }}\n', "s")


@pytest.mark.parametrize("spelling", ["absolute", "relative"])
@pytest.mark.parametrize("directive", [".incbin", ".include"])
@pytest.mark.parametrize(("mode", "error"), READ_BY_ASSEMBLER)
def test_inline_asm_reading_outside_roots_is_refused(
    make_runtime, project, outside, cache_dir, mode, error, directive, spelling
):
    target = outside / ("secret" if directive == ".incbin" else "secret.s")
    if directive == ".include":
        target.write_text(f"/* {SECRET_TOKEN} */\n.long 1\n")
    # Relative: from the assembler's working dir (the compile's own), up and out.
    named = target if spelling == "absolute" else Path("../" * 32 + str(target).lstrip("/"))
    rt = _runtime(make_runtime, project, sandbox=mode)
    if spelling == "relative":  # (a climb out of the compile's own dirs: refused one way, read or not)
        error = safejit.UndeclaredDependencyError
    with pytest.raises(error) as exc:
        rt.compile(_asm_reading(directive, named))
    if spelling == "relative" or lookups.supported():  # (refused by the climb, or the recorded lookup)
        assert str(exc.value) == LOOKED_OUTSIDE
    elif mode == "off":  # read, then refused: the assembler's own depfile names it
        assert exc.value.resolved == str(target)
    else:  # Landlock denied the open (gas reports a denied .incbin as "file not found", and
        # a denied .include as of a file not there: no oracle)
        said = f"{named} for reading: not found (or outside the declared roots)"
        assert said in exc.value.log or f"not found: {named}" in exc.value.log
        assert_no_secret(exc.value.log)
    assert_no_secret(exc.value)
    assert_nothing_published(cache_dir)


@pytest.mark.parametrize("hider", ["\\n", "\\f", "\\013", "\\034", "\\r"])
def test_inline_asm_file_name_with_a_control_character_is_refused(make_runtime, project, outside, cache_dir, hider):
    """gas lists .file names verbatim in its depfile: a control character there could
    end the line early and hide what .incbin read. Such a list is refused whole. (Here
    .incbin reads a file under the root: one outside it, its recorded lookup refuses.)"""
    target = project / "inside.bin"
    target.write_bytes(b"\x00\x01")
    asm = f'.section .rodata\\nblob:\\n.incbin \\"{target}\\"\\n.text\\n.file \\"x{hider}y\\"\\n'
    rt = _runtime(make_runtime, project, sandbox="off")
    with pytest.raises(safejit.CompileError) as exc:
        rt.compile(safejit.Source(f'__asm__("{asm}");\nint s(void) {{ return 1; }}\n', "s"))
    assert "what the assembler read is unknown" in str(exc.value)
    assert_no_secret(exc.value)
    assert_nothing_published(cache_dir)


@pytest.mark.parametrize("prefix", ["/proc", "//proc", "/./proc", "/dev/../proc"])
def test_include_through_a_per_process_path_is_refused(make_runtime, project, cache_dir, monkeypatch, prefix):
    """/proc/self/cwd/... means the compiler's working dir to the compiler and this
    process's to the scan: such a path is refused, never hashed as something else."""
    monkeypatch.chdir(project)  # (here, the scan's reading of the path would even be under a root)
    (project / "inc.h").write_text("#define V 1\n")
    rt = _runtime(make_runtime, project, sandbox="off")
    with pytest.raises(safejit.UndeclaredDependencyError) as exc:
        rt.compile(
            safejit.Source(
                f'#include "{prefix}/self/root/'
                + str(project / "inc.h").lstrip("/")
                + '"\nint v(void) { return V; }\n',
                "v",
            )
        )
    # (through /dev/.., a climb out of a dir outside every root: refused before, naming nothing)
    assert "proc/self/" in getattr(exc.value, "path", "") or str(exc.value) == LOOKED_OUTSIDE
    assert_nothing_published(cache_dir)


def _forged_lto_source(work: Path, payload: str) -> str:
    """A C source whose top-level asm re-creates the ``.gnu.lto_*`` sections of
    ``payload`` compiled with -flto: compiled without -flto, its object still claims to
    hold LTO bytecode, which a linker plugin would compile and assemble at link time."""
    from safejit.backends._elf import Elf

    (work / "payload.c").write_text(payload)
    subprocess.run(["cc", "-flto", "-c", "-o", work / "payload.o", work / "payload.c"], check=True)
    lines = []
    elf = Elf((work / "payload.o").read_bytes())
    for section in elf.sections():
        if section.name.startswith(".gnu.lto_"):
            data = elf.section_data(section)
            lines.append(f'.section {section.name},"e",@progbits')
            lines += [".byte " + ",".join(map(str, data[i : i + 32])) for i in range(0, len(data), 32)]
    lines += [".globl __gnu_lto_slim", ".comm __gnu_lto_slim,1,1", ".text"]
    asm = "\n".join(lines).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'__asm__("{asm}\\n");\nint carrier(void) {{ return 1; }}\n'


def test_forged_lto_sections_are_never_compiled_at_link_time(make_runtime, project, outside, cache_dir, tmp_path):
    """-flto is refused, but top-level asm can forge an object that claims to hold LTO
    bytecode; a linker plugin would compile it at link time, where the assembler's reads
    (.incbin of a file outside the roots) go unlisted. The link runs with -fno-lto."""
    secret = outside / "secret.txt"
    secret.write_text(f"{SECRET_TOKEN}\n")
    asm = f'.section .rodata\\n.globl leaked\\nleaked:\\n.incbin \\"{secret}\\"\\n.byte 0\\n.text\\n'
    code = _forged_lto_source(tmp_path, f'__asm__("{asm}");\nint value(void) {{ return 7; }}\n')
    rt = _runtime(make_runtime, project, sandbox="off")
    module = rt.compile(safejit.Source(code, "carrier"))
    assert module.artifact.kernels == ("carrier",)  # the forged bytecode was not compiled
    for file in Path(module.artifact.path).iterdir():
        assert SECRET_TOKEN.encode() not in file.read_bytes()
    assert_cache_sound(cache_dir)


def test_a_source_root_holding_the_cache_is_warned_of(tmp_path, caplog):
    """A source root that holds a cache root (``~``, with the cache in ``~/.cache``) lets
    every compiler read every tenant's cached builds: said when the Runtime is set up."""
    import logging

    root = tmp_path / "home"
    (root / ".cache").mkdir(parents=True)
    apart = tmp_path / "apart"
    apart.mkdir()
    with caplog.at_level(logging.WARNING, logger="safejit"):
        safejit.Runtime(
            config=safejit.Config(cache_dirs=(str(root / ".cache" / "sj"),), source_roots=(str(apart),))
        )._init()
        assert not [r for r in caplog.records if "holds the cache root" in r.getMessage()]
        safejit.Runtime(
            config=safejit.Config(cache_dirs=(str(root / ".cache" / "sj"),), source_roots=(str(root),))
        )._init()
    said = [r.getMessage() for r in caplog.records if "holds the cache root" in r.getMessage()]
    assert said and str(root) in said[0] and "other tenants' builds" in said[0]
