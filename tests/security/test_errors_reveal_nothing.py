"""Class 9: bad input is a typed SafejitError, never a UnicodeEncodeError escaping from
deep inside; errors about paths outside the roots say only that (not whether the path
exists, nor the working directory a relative one was resolved in)."""

from __future__ import annotations

import os
import shutil

import pytest

import safejit
from safejit.sandbox import lookups
from tests.security._support import SECRET_TOKEN, assert_no_secret, assert_nothing_published, needs_landlock

CLANG = shutil.which("clang") or shutil.which("clang-14") or "/nonexistent/clang"
needs_clang = pytest.mark.skipif(not os.path.exists(CLANG), reason="no clang")

OK = "int k(void) { return 1; }\n"


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda rt: rt.compile(safejit.Source(OK + "/* \udc80 */", "k")), id="source"),
        pytest.param(lambda rt: rt.compile(safejit.Source(OK, "k"), include_dirs=("/tmp/\udc80",)), id="include-dir"),
        pytest.param(lambda rt: rt.compile(safejit.Source(OK, "k"), defines={"X": "\udc80"}), id="define-value"),
        pytest.param(lambda rt: rt.compile(safejit.Source(OK, "k"), defines={"\udc80": 1}), id="define-name"),
        pytest.param(lambda rt: rt.compile(safejit.Source(OK, "k"), flags=("-DX=\udc80",)), id="flag"),
        pytest.param(lambda rt: rt.compile(safejit.Source(OK, "k", filename="k\udc80.c")), id="filename"),
        pytest.param(lambda rt: rt.source("/tmp/\udc80.c"), id="source-path"),
    ],
)
def test_a_lone_surrogate_anywhere_is_a_safejit_error(make_runtime, cache_dir, call):
    rt = make_runtime()
    with pytest.raises(safejit.SafejitError):
        call(rt)
    assert rt.stats()["compiles"] == 0 and list(cache_dir.glob("v1/*/*/*/build-*")) == []


@pytest.mark.parametrize("exists", [True, False])
@pytest.mark.parametrize("where", ["readable", "unreadable"])
def test_an_error_about_an_outside_path_does_not_say_whether_it_exists(make_runtime, tmp_path, exists, where):
    """EACCES vs ENOENT, or "does not exist" vs "outside": either would let a tenant
    probe the host's filesystem through error messages."""
    root = tmp_path / "root"
    root.mkdir()
    base = tmp_path / ("private" if where == "unreadable" else "public")
    base.mkdir()
    if exists:
        (base / "thing").mkdir()
    if where == "unreadable":
        base.chmod(0o000)
    try:
        rt = make_runtime(source_roots=(str(root),))
        with pytest.raises(safejit.PathConfinementError) as exc:
            rt.compile(safejit.Source(OK, "k"), include_dirs=(str(base / "thing"),))
        assert str(exc.value) == (
            f"include dir {str(base / 'thing')!r} is outside the declared roots; declare its directory in "
            "Config.source_roots (or SAFEJIT_SOURCE_ROOTS)"
        )
    finally:
        base.chmod(0o755)


def test_a_relative_outside_path_error_does_not_show_the_working_directory(make_runtime, tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    work = tmp_path / "very-private-working-dir"
    (work / "inc").mkdir(parents=True)
    monkeypatch.chdir(work)
    rt = make_runtime(source_roots=(str(root),))
    with pytest.raises(safejit.PathConfinementError) as exc:
        rt.compile(safejit.Source(OK, "k"), include_dirs=("inc",))
    assert "very-private-working-dir" not in str(exc.value) and os.getcwd() not in str(exc.value)
    assert not hasattr(exc.value, "resolved")


def test_a_missing_path_under_a_root_says_so(make_runtime, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    rt = make_runtime(source_roots=(str(root),))
    with pytest.raises(safejit.PathConfinementError, match="does not exist"):
        rt.compile(safejit.Source(OK, "k"), include_dirs=(str(root / "nope"),))


@needs_landlock
@pytest.mark.parametrize(
    "directive",
    [
        '#include "{p}"',
        '#if __has_include("{p}")\n#endif',
        '#include "../../{rel}"',
        '#if __has_include("{p}.absent-first")\n#endif\n#if __has_include("{p}")\n#endif',
        '#define P "{p}"\n#if __has_include(P)\n#endif',
        '#define P "{p}"\n#if !__has_include(P)\n#error not there\n#endif',
        '#include "../../../../../../../../../../../../..{p}"',
        '#line 1 "{p}"\n#error stop',
    ],
    ids=["include", "probe", "dotdot", "which-is-named", "macro-probe", "macro-probe-fails", "dotdot-system", "line"],
)
@pytest.mark.parametrize("cc", ["gcc", pytest.param("clang", marks=needs_clang)])
def test_a_compile_does_not_say_whether_a_file_outside_the_roots_exists(make_runtime, tmp_path, directive, cc):
    """An #include or __has_include of an outside path reaches the compiler, which Landlock
    refuses: its "Permission denied" for a file that is there and "No such file or
    directory" for one that is not told them apart, and so did the error types (a failed
    compile for one, a refused closure for the other). Both read the same now. So do a
    probe whose name a macro makes (none of it in the source's text: a build returned
    for a file not there), a ``..`` name that climbs out of the compiler's own dirs, and a
    ``#line`` name an error's diagnostic looks up."""
    there = tmp_path / "outside" / "there.h"
    there.parent.mkdir()
    there.write_text("#define X 1\n")
    (tmp_path / "root" / "inc").mkdir(parents=True)
    compilers = {"host_cc": CLANG} if cc == "clang" else {}
    if "__has_include(P)" in directive or "#line" in directive:
        if not lookups.supported():
            pytest.skip("what a macro names is seen only by the lookup recorder")
    rt = make_runtime(source_roots=(str(tmp_path / "root"),), sandbox="auto", **compilers)
    said = []
    for path in (there, tmp_path / "outside" / "absent.h"):
        (tmp_path / "root" / "inc" / "h.h").write_text(directive.format(p=path, rel=f"outside/{path.name}") + "\n")
        with pytest.raises(safejit.SafejitError) as exc:
            rt.compile(safejit.Source('#include "h.h"\nint f(void) { return 0; }\n', "k"),
                       include_dirs=(str(tmp_path / "root" / "inc"),))  # fmt: skip
        said.append((type(exc.value), str(exc.value).replace(path.name, "<name>")))
    assert said[0] == said[1], said
    if "#line" in directive:  # (the name is never looked up now: the compile's error, either way)
        assert said[0][0] is safejit.CompileError
        return
    assert "<name>" not in said[0][1]  # (which lookup stopped the compiler would tell which exist)
    assert said[0][0] is safejit.UndeclaredDependencyError and "outside every declared root" in said[0][1]


@needs_landlock
def test_a_probe_of_a_link_out_of_a_root_is_refused_whether_its_target_is_there(make_runtime, tmp_path):
    """__has_include of a plain name that is a link in a root to an outside file: one whose
    target is there was refused, a dangling one compiled — which told whether the outside
    file exists. (An #include of it is refused either way.)"""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "there.h").write_text("#define X 1\n")
    inc = tmp_path / "root" / "inc"
    inc.mkdir(parents=True)
    (inc / "link_there.h").symlink_to(outside / "there.h")
    (inc / "link_absent.h").symlink_to(outside / "absent.h")
    rt = make_runtime(source_roots=(str(tmp_path / "root"),), sandbox="auto")
    said = []
    for kind in ("there", "absent"):
        code = f'#if __has_include("link_{kind}.h")\nint f(void) {{ return 1; }}\n#endif\nint g(void) {{ return 0; }}\n'
        with pytest.raises(safejit.SafejitError) as exc:
            rt.compile(safejit.Source(code, "k"), include_dirs=(str(inc),))
        said.append((type(exc.value), str(exc.value)))
    assert said[0] == said[1] and said[0][0] is safejit.UndeclaredDependencyError, said


@pytest.mark.parametrize(
    "backend", ["host", pytest.param("cuda", marks=pytest.mark.skipif(not shutil.which("nvcc"), reason="no nvcc"))]
)
def test_a_line_directive_never_quotes_a_file_in_a_diagnostic(make_runtime, tmp_path, cache_dir, backend):
    """``#line 1 "/any/file"`` then an error: gcc reopened the named file to quote its line
    under the message (the compile log, hence CompileError.log, held a line of any file
    the compiler could read; with the sandbox off or a system file, read it did). (A file
    outside the roots is not even looked up now: the build is refused, as any lookup
    there is — see above. One under a root is looked up, and not quoted.)"""
    extra = {"cuda_compiler": "nvcc"} if backend == "cuda" else {}
    root = tmp_path / "root"
    root.mkdir()
    (root / "secret").write_text(f"{SECRET_TOKEN}\n")
    rt = make_runtime(backend=backend, sandbox="off", source_roots=(str(root),), **extra)
    code = f'#line 1 "{root}/secret"\n#error the line quoted here\n'
    with pytest.raises(safejit.CompileError) as exc:
        rt.compile(safejit.Source(code, "k"), **({"arch": "sm_90"} if backend == "cuda" else {}))
    assert "the line quoted here" in exc.value.log  # (the diagnostic itself is kept)
    assert_no_secret(exc.value, exc.value.log)
    assert_nothing_published(cache_dir)


def test_a_caret_cannot_be_turned_back_on(make_runtime):
    with pytest.raises(safejit.FlagPolicyError):
        make_runtime().compile(safejit.Source(OK, "k"), flags=("-fdiagnostics-show-caret",))


def _outcome(rt, code: str, **options) -> tuple[object, ...]:
    try:
        return ("built", rt.compile(safejit.Source(code, "k"), **options).kernel("k")())
    except safejit.SafejitError as exc:
        return (type(exc), str(exc))


@needs_landlock
@pytest.mark.skipif(not lookups.supported(), reason="only the lookup recorder sees what a macro names")
@pytest.mark.parametrize(
    "probe",
    [
        '"{d}/../../../../../../../../../../../../../../usr/include/stdio.h"',
        "P",
        '"{d}/' + "x" * 300 + '"',
        '"link.h"',
        "L",
    ],
    ids=["climb-back-in", "climb-back-in-by-macro", "name-too-long", "link-out-of-a-root", "link-by-macro"],
)
def test_a_probe_does_not_say_whether_an_outside_dir_or_link_target_exists(make_runtime, tmp_path, cache_dir, probe):
    """Found in review of the recorded-lookups refusal: a '..' out of an outside dir that
    lands back under a root (the kernel climbs out of a dir only if it is there: built
    with 1 or 0, and published), a name too long in an outside dir (an error the recorder
    dropped), and a link in a source root to an outside file, probed by a name a macro
    made (refused when its target was there, built when not). Each is refused now,
    whichever."""
    root = tmp_path / "root"
    root.mkdir()
    said = []
    for d in (tmp_path / "outside", tmp_path / "absent"):
        (tmp_path / "outside").mkdir(exist_ok=True)
        (tmp_path / "outside" / "there.h").write_text("#define X 1\n")
        (root / "link.h").unlink(missing_ok=True)
        (root / "link.h").symlink_to(d / "there.h")
        defines = f'#define P "{d}/../../../../../../../../../../../../../../usr/include/stdio.h"\n#define L "link.h"\n'
        code = (
            f"{defines}#if __has_include({probe.format(d=d)})\nint k(void) {{ return 1; }}\n"
            "#else\nint k(void) { return 0; }\n#endif\n"
        )
        rt = make_runtime(source_roots=(str(root),))
        said.append(_outcome(rt, code, include_dirs=(str(root),)))
        assert_nothing_published(cache_dir)
    assert said[0] == said[1] and said[0][0] is safejit.UndeclaredDependencyError, said


def test_a_line_directive_with_a_warning_is_no_lookup_outside_the_roots(make_runtime, cache_dir):
    """gcc 11 on opened the file a #line names, to count a warning's column in characters:
    a lookup outside the roots, which refused generated code that names its template."""
    rt = make_runtime()
    code = '#line 10 "/opt/orig/template.c"\nint k(void) { int unused; return 1; }\n'
    assert rt.compile(safejit.Source(code, "k"), flags=("-Wall",)).kernel("k")() == 1


_PROBE_OF = "#if __has_include({name})\nint k(void) {{ return 1; }}\n#else\nint k(void) {{ return 0; }}\n#endif\n"


@needs_landlock
@pytest.mark.skipif(not lookups.supported(), reason="only the lookup recorder sees what a macro names")
@pytest.mark.parametrize(
    "code",
    [
        _PROBE_OF.format(name='"{root}/l/../{d}/../root/f.h"'),
        '#define P "{lib}/libc.so.6"\n#define Q "{lib}/no-such-libc.so"\n' + _PROBE_OF.format(name="{which}"),
        '__asm__(".section .rodata\\n.incbin \\"{d}/../../../../../../../../../../../../../usr/include/stdio.h\\"\\n"'
        '".text");\nint k(void) { return 1; }\n',
        '__asm__(".section .rodata\\n.incbin \\"{d}/../../../../../../../../../../../../../usr/include/stdio.h\\"\\n"'
        '".text\\nno_such_insn");\nint k(void) { return 1; }\n',
        '#include "{root}/l2/f.h"\nint k(void) { return F; }\n',
    ],
    ids=["climb-through-a-link", "under-the-linker-roots", "incbin-climb", "incbin-climb-then-fails", "link-climbs"],
)
def test_a_climb_or_a_linker_root_does_not_say_whether_a_path_exists(make_runtime, tmp_path, cache_dir, code):
    """Found in the second review: a '..' was followed by name where the kernel follows it
    after links (a link in a root to '.' climbs out of the root: 1 or 0 by whether an
    outside dir exists); the linker's roots (/usr/lib, with links out to /etc) counted
    as roots of what a preprocessor looks up; an assembler's .incbin that climbs out of
    an outside dir was read when it was there, a missing file when not. Found in the
    third: such an .incbin read, then an error of the assembler's own; a link in a root
    whose target climbs out of an outside dir (followed as if that dir were there)."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "f.h").write_text("#define F 1\n")
    (root / "l").symlink_to(".")
    lib = "/usr/lib/x86_64-linux-gnu" if os.path.exists("/usr/lib/x86_64-linux-gnu/libc.so.6") else "/usr/lib64"
    (tmp_path / "outside").mkdir()
    said = []
    for d, which in ((tmp_path / "outside", "P"), (tmp_path / "absent", "Q")):
        (root / "l2").unlink(missing_ok=True)
        (root / "l2").symlink_to(f"{d}/../root")  # (a link whose target climbs out of an outside dir)
        text = code.replace("{root}", str(root)).replace("{d}", d.name if "/l/../" in code else str(d))
        rt = make_runtime(source_roots=(str(root),))
        said.append(_outcome(rt, text.replace("{lib}", lib).replace("{which}", which)))
        assert_nothing_published(cache_dir)
    assert said[0] == said[1] and said[0][0] is safejit.UndeclaredDependencyError, said


@pytest.mark.skipif(not lookups.supported(), reason="no lookup recorder on this machine")
@pytest.mark.parametrize("fails", [False, True], ids=["built", "failed"])
def test_lookups_lost_to_the_recorder_refuse_the_build(make_runtime, tmp_path, cache_dir, monkeypatch, fails):
    """Found in the fourth review: a source that looks up more paths than the recorder
    keeps (thousands of probes, 7 s of compiling) hid one outside the roots among those
    lost; the build was then returned, unpublished, with its value. One refusal now,
    whether the compile went on or failed (the cap made small: any compile passes it)."""
    monkeypatch.setattr(lookups, "_PRELOAD_MAX", 64)
    (tmp_path / "root").mkdir()
    rt = make_runtime(source_roots=(str(tmp_path / "root"),))
    code = "#error stop\n" if fails else OK
    with pytest.raises(safejit.UndeclaredDependencyError, match="looked for a file outside every declared root"):
        rt.compile(safejit.Source(code, "k"))
    assert_nothing_published(cache_dir)


#: A compile that runs on to any time limit (g++'s constexpr limit is 2**33 operations).
_SPIN = (
    "constexpr long spin() { long s = 0; for (long i = 0; i < 200000; i++) for (long j = 0; j < 200000; j++) "
    's += (i ^ j) % 7; return s; }\nstatic_assert(spin() > 0, "");\nextern "C" int k(void) { return 1; }\n'
)


@needs_landlock
@pytest.mark.skipif(not lookups.supported(), reason="only the lookup recorder sees what a macro names")
@pytest.mark.parametrize("scratch", ["memory", "cache"])
def test_a_probe_then_a_compile_past_the_time_limit_reads_the_same_found_or_not(
    make_runtime, tmp_path, cache_dir, scratch
):
    """Found in the fifth review: a refused open (the file there) stops g++ at once,
    while a probe that found nothing lets it run on to its time limit, where the kill
    lost the recorder's records: UndeclaredDependencyError one way, CompileTimeout the
    other. Each lookup is written down as it is made now, so the killed run is refused
    as the finished one is (how long each took is the timing left open, docs/security.md)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    said = []
    for name in ("secret", "absent"):
        (outside / "secret").write_text("int x;\n")
        code = f'#define P "{outside}/{name}"\n#if __has_include(P)\nint seen;\n#endif\n' + _SPIN
        rt = make_runtime(source_roots=(str(root),), compile_timeout_s=1.5, scratch=scratch)
        said.append(_compiled(rt, code))
        assert_nothing_published(cache_dir)
    assert said[0] == said[1] and said[0][0] is safejit.UndeclaredDependencyError, said


def _compiled(rt, code: str) -> tuple[object, ...]:
    try:
        return ("built", rt.compile(safejit.Source(code, "k", filename="k.cpp")).kernel("k")())
    except safejit.SafejitError as exc:
        return (type(exc), str(exc))


@pytest.mark.skipif(not lookups.supported(), reason="no lookup recorder on this machine")
def test_a_killed_compile_whose_records_cannot_be_read_says_nothing_it_printed(make_runtime, tmp_path, monkeypatch):
    """What a compiler printed before its kill may rest on a lookup outside the roots;
    records that cannot be read cannot say it did not: the timeout is told, the output
    withheld."""
    from safejit._pipeline import build_job

    def malformed(cwd: str, **_: object) -> None:
        raise ValueError("the recorded lookups are cut short or malformed")

    monkeypatch.setattr(build_job.lookups, "read_preloaded", malformed)
    rt = make_runtime(compile_timeout_s=1.0)
    code = '#warning "said before the kill"\n' + _SPIN
    with pytest.raises(safejit.CompileTimeout, match="output is withheld") as exc:
        rt.compile(safejit.Source(code, "k", filename="k.cpp"))
    assert exc.value.log == "" and "said before" not in str(exc.value)
