"""Files the assembler reads (inline asm's ``.incbin`` and ``.include``) are part of
the dependency closure, though the compiler's depfile never names them: GNU as
lists them (``--MD``). A change to one is a miss, never a stale binary."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import safejit
from safejit.backends._toolreads import ASM_DEP_FLAG, tool_reads
from safejit.cache.leaf import Manifest, decode_manifest
from tests.conftest import CLANG, settle
from tests.security._support import write_failing_wrapper


def _kernel(directive: str, path: Path) -> safejit.Source:
    asm = f'.section .rodata\\n.globl blob\\nblob:\\n{directive} \\"{path}\\"\\n.text\\n'
    code = f'__asm__("{asm}");\nextern const unsigned char blob[];\nint first(void) {{ return blob[0]; }}\n'
    return safejit.Source(code, "first")


def _manifest(module: safejit.Module) -> Manifest:
    return decode_manifest((Path(module.artifact.path) / "manifest.json").read_bytes())


def _data(root: Path, directive: str, value: int) -> Path:
    if directive == ".incbin":
        path = root / "table.bin"
        path.write_bytes(bytes([value, 0, 0, 0]))
    else:
        path = root / "table.s"
        path.write_text(f".byte {value}\n")
    return path


@pytest.mark.parametrize("directive", [".incbin", ".include"])
def test_a_changed_assembler_input_is_a_disk_miss_named_by_explain(make_runtime, tmp_path, directive):
    root = tmp_path / "proj"
    root.mkdir()
    path = _data(root, directive, 3)
    src = _kernel(directive, path)
    first = make_runtime(source_roots=(str(root),))
    assert first.compile(src).kernel("first")() == 3
    assert path.name in [relpath for _, relpath, _ in _manifest(first.compile(src)).deps]
    _data(root, directive, 5)
    settle()
    rt = make_runtime(source_roots=(str(root),))
    explanation = rt.explain(src)
    assert explanation.result == "miss" and explanation.path == str(path)
    assert rt.compile(src).kernel("first")() == 5
    assert rt.stats()["compiles"] == 1


def test_a_changed_assembler_input_makes_a_memory_entry_stale(make_runtime, tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    path = _data(root, ".incbin", 3)
    rt = make_runtime(source_roots=(str(root),), max_staleness_s=0)
    src = _kernel(".incbin", path)
    assert rt.compile(src).kernel("first")() == 3
    _data(root, ".incbin", 9)
    settle()
    assert rt.compile(src).kernel("first")() == 9
    assert rt.stats()["stale"] == 1


def test_the_compilers_own_temporaries_are_not_dependencies(make_runtime):
    manifest = _manifest(make_runtime().compile(safejit.Source("int one(void) { return 1; }\n", "one")))
    assert ASM_DEP_FLAG in manifest.argv
    # What cc1 read (the predefines header): not the temporary .s, nor the name in .file
    # (what the linker read to link nothing, the crt files and libc, is the toolchain's).
    assert [relpath for _, relpath, _ in manifest.deps] == ["stdc-predef.h"]


def test_an_assembler_without_a_dependency_list_is_reported(make_runtime, tmp_path, caplog):
    root = tmp_path / "proj"
    root.mkdir()
    # A compiler whose assembler refuses --MD (as clang's integrated one does).
    cc = write_failing_wrapper(root, "--MD,/dev/null", name="cc-no-asm-deps")
    caplog.set_level(logging.WARNING)
    rt = make_runtime(source_roots=(str(root),), host_cc=str(cc))
    module = rt.compile(safejit.Source("int one(void) { return 1; }\n", "one"))
    assert module.kernel("one")() == 1
    assert ASM_DEP_FLAG not in _manifest(module).argv
    assert any("cannot list the files it reads" in r.getMessage() for r in caplog.records)


def test_only_names_that_stay_in_the_work_dir_are_left_out(tmp_path):
    work = tmp_path / "work"
    (work / "tmp").mkdir(parents=True)
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"x")
    (work / "tmp" / "cc1.s").write_text("")
    (work / "out").symlink_to(outside)
    (work / "linkdir").symlink_to(tmp_path)
    listed = [
        f"{work}/tmp/cc1.s",  # a temporary
        f"{work}/tmp/cc2.o",  # a temporary already deleted
        "first.c",  # a .file name, relative to the work dir
        f"{work}/out",  # a symlink out
        f"{work}/linkdir/secret.bin",  # through a symlinked dir
        f"{work}/tmp/../../secret.bin",  # .. out
        f"{work}/linkdir/../gone",  # .. after a symlink: resolved physically, out
    ]
    data = f"{work}/first.o: {' '.join(listed)}\n".encode()
    got = tool_reads(str(work), ("/usr/include/stdint.h",), {f"{work}/.asm.d": data})
    assert got == {"assembler": tuple(listed[3:])}


def _linker_list(names: list[str]) -> bytes:
    """What GNU ld writes for --dependency-file: names raw, then a phony rule each."""
    return ("out.so:" + "".join(f" \\\n  {n}" for n in names) + "\n" + "".join(f"\n{n}:\n" for n in names)).encode()


def test_the_linkers_list_takes_the_same_rule_and_names_must_be_there(tmp_path):
    work = tmp_path / "work"
    (work / ".tmp").mkdir(parents=True)
    (tmp_path / "lib dir").mkdir()
    spaced = tmp_path / "lib dir" / "lib$$x.a"  # GNU ld writes it raw: the space and $$ are its own
    spaced.write_bytes(b"!<arch>\n")
    (work / "link").symlink_to(spaced)
    listed = [f"{work}/.tmp/cc1.o", str(spaced), f"{work}/link", "/usr/include/stdint.h"]
    assert tool_reads(str(work), ("/usr/include/stdint.h",), {f"{work}/.ld.d": _linker_list(listed)}) == {
        "linker": (str(spaced), f"{work}/link")
    }
    # As lld writes it (Make syntax), the same file.
    escaped = str(spaced).replace(" ", "\\ ").replace("$", "$$")
    assert tool_reads(str(work), (), {f"{work}/.ld.d": _linker_list([escaped])}) == {"linker": (str(spaced),)}
    # A name that is not there, but for a temporary of the work dir: what was read is unknown.
    for missing in (str(tmp_path / "lib"), "rel/libx.a", f"{work}/../gone.a"):
        with pytest.raises(ValueError, match="not there"):
            tool_reads(str(work), (), {f"{work}/.ld.d": _linker_list([missing])})


@pytest.mark.parametrize("data", [b"", b"a.o: x\nb.o: y\n", b"a.o: x\x0b/etc/passwd\n", b"no rule here\n"])
def test_a_malformed_assembler_list_is_refused(tmp_path, data):
    with pytest.raises(ValueError):
        tool_reads(str(tmp_path), (), {str(tmp_path / ".asm.d"): data})


@pytest.mark.parametrize("data", [b"", b"a.so: \\\n  /x\x1c/etc/passwd\n", b"no rule here\n", b"a.so: \\\n  \n", None])
def test_a_malformed_or_missing_linker_list_is_refused(tmp_path, data):
    with pytest.raises(ValueError):
        tool_reads(str(tmp_path), (), {str(tmp_path / ".ld.d"): data})


@pytest.mark.skipif(CLANG is None, reason="no clang")
def test_clang_assembles_with_gnu_as_so_that_its_reads_are_listed(make_runtime, tmp_path):
    """clang's integrated assembler lists nothing it reads: an ``.incbin`` went unseen (a
    stale binary after the file changed; with the sandbox off, any file the compiler's
    user can read embedded in the artifact). clang runs GNU as, with --MD, as gcc does."""
    root = tmp_path / "proj"
    root.mkdir()
    path = _data(root, ".incbin", 3)
    src = _kernel(".incbin", path)
    clang = CLANG
    first = make_runtime(source_roots=(str(root),), host_cc=clang)
    module = first.compile(src)
    assert module.kernel("first")() == 3
    assert "-fno-integrated-as" in _manifest(module).argv
    assert path.name in [relpath for _, relpath, _ in _manifest(module).deps]
    _data(root, ".incbin", 5)
    settle()
    assert make_runtime(source_roots=(str(root),), host_cc=clang).compile(src).kernel("first")() == 5


@pytest.mark.parametrize(
    ("version", "flags"),
    [
        ("Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu", ("-fno-integrated-cc1",)),
        ("clang version 10.0.0", ("-fno-integrated-cc1",)),
        ("clang version 17 (https://github.com/llvm/llvm-project)", ("-fno-integrated-cc1",)),
        ("clang version 18-init\nTarget: x86_64", ("-fno-integrated-cc1",)),
        ("BiSheng Enterprise 2.5 clang version 15.0.5 (b)\nld.lld: LLD 15.0.5", ("-fno-integrated-cc1",)),
        ("clang version 9.0.1", ()),  # (its preprocessor always ran apart)
        ("cc (Debian 12.2.0-14) 12.2.0", ()),
    ],
)
def test_clang_from_10_is_told_to_preprocess_apart_where_the_recorder_runs(version, flags):
    from safejit.backends._argv import preprocessor_apart

    assert preprocessor_apart(version) == flags
