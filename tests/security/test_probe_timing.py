"""A probe of a file outside the roots leaves the compile to go on as one of a file not
there does: gcc stopped at once at the sandbox's refusal (a file there), while a file
not there let the compile run on, so how long the compile took said which
(docs/security.md, "Any lookup outside the roots refuses the build")."""

from __future__ import annotations

import os

import pytest

import safejit
from safejit.sandbox import lookups
from tests.security._support import assert_nothing_published, needs_landlock


@needs_landlock
@pytest.mark.skipif(not lookups.supported(), reason="only the lookup recorder sees what a macro names")
@pytest.mark.parametrize("probe", ["#if __has_include(P)\n#endif\n", "#include P\n"], ids=["has-include", "include"])
def test_the_compiler_goes_on_past_a_probe_as_far_whether_the_file_is_there_or_not(
    make_runtime, tmp_path, cache_dir, spans, probe
):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.h").write_text("int secret;\n")
    said, logs = [], []
    for name in ("secret.h", "absent.h"):
        spans.clear()
        code = f'#define P "{outside}/{name}"\n{probe}#warning "went on"\nint k(void) {{ return 1; }}\n'
        rt = make_runtime(source_roots=(str(root),))
        with pytest.raises(safejit.SafejitError) as exc:
            rt.compile(safejit.Source(code, "k"))
        said.append((type(exc.value), str(exc.value)))
        run = next(s for s in spans.get_finished_spans() if s.name == "safejit.compiler.run")
        logs.append(" ".join(str(e.attributes.get("safejit.log", "")) for e in run.events if e.name == "compiler.log"))
        assert_nothing_published(cache_dir)
    assert said[0] == said[1] and said[0][0] is safejit.UndeclaredDependencyError, said
    # (the compiler saw the same both ways: no refusal of its own, as far past the probe)
    assert ("went on" in logs[0]) == ("went on" in logs[1]), logs
    assert "Permission denied" not in logs[0], logs


@needs_landlock
@pytest.mark.skipif(not lookups.supported(), reason="only the lookup recorder sees what a macro names")
def test_a_name_too_long_in_an_outside_dir_goes_on_as_far_whether_the_dir_is_there_or_not(
    make_runtime, tmp_path, cache_dir, spans
):
    """Found in review: a name past NAME_MAX in a dir that is there fails ENAMETOOLONG, in
    one that is not ENOENT; gcc stopped at once at the first. Every failure that says
    something of the path reads to the compiler as not there."""
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "there").mkdir()
    logs = []
    for d in (tmp_path / "there", tmp_path / "absent"):
        spans.clear()
        probe = f'#define P "{d}/{"a" * 300}"\n#if __has_include(P)\n#endif\n'
        code = probe + '#warning "went on"\nint k(void) { return 1; }\n'
        with pytest.raises(safejit.UndeclaredDependencyError):
            make_runtime(source_roots=(str(root),)).compile(safejit.Source(code, "k"))
        run = next(s for s in spans.get_finished_spans() if s.name == "safejit.compiler.run")
        logs.append(" ".join(str(e.attributes.get("safejit.log", "")) for e in run.events if e.name == "compiler.log"))
        assert_nothing_published(cache_dir)
    assert "went on" in logs[0] and "went on" in logs[1], logs


@pytest.mark.skipif(not lookups.supported(), reason="no lookup recorder on this machine")
def test_the_source_cannot_read_its_own_compiles_records(make_runtime, cache_dir):
    """Found in review: the records sit in the compiler's work dir, written through as
    each lookup is made, and hold what each truly found (the compiler is handed ENOENT
    for a file the sandbox refused): a source that included them read which. The
    records file is not there to the compiler, by any name."""
    has = '#if __has_include("../safejit-lookups.rec")\nint k(void) { return 1; }\n'
    has += "#else\nint k(void) { return 0; }\n#endif\n"
    # (not there next to the source, the compiler looks on in its own dirs, and climbs out
    # of them: refused, as any "../x.h" not found under the roots is)
    with pytest.raises(safejit.UndeclaredDependencyError):
        make_runtime().compile(safejit.Source(has, "k"))
    with pytest.raises(safejit.UndeclaredDependencyError):
        make_runtime().compile(safejit.Source('#include "../safejit-lookups.rec"\nint k(void) { return 1; }\n', "k"))
    assert_nothing_published(cache_dir)


@needs_landlock
@pytest.mark.skipif(not lookups.supported(), reason="no lookup recorder on this machine")
@pytest.mark.skipif(os.geteuid() != 0, reason="a header only this process may read needs root here")
def test_a_header_the_compiler_may_not_read_is_never_cached_as_absent(make_runtime, tmp_path, cache_dir):
    """Found in review: a header in a root the compiler may not read (its mode; this
    process, root, may) reads to it as not there, and its search went on to the next
    dir: that build was published, and served after a chmod made the first header the
    one the compiler finds. Whether it may read a file is in no key: returned, not cached."""
    src = tmp_path / "src"
    (src / "I1").mkdir(parents=True)
    (src / "I2").mkdir()
    first = src / "I1" / "x.h"
    first.write_text("#define K 1\n")
    (src / "I2" / "x.h").write_text("#define K 2\n")
    os.chown(first, 54321, 54321)
    first.chmod(0o600)
    rt = make_runtime(source_roots=(str(src),))
    if "uid-" not in rt._init()[0].sandbox.describe():
        pytest.skip("the compiler runs as this process's uid here")
    dirs = (str(src / "I1"), str(src / "I2"))
    code = safejit.Source("#include <x.h>\nint k(void) { return K; }\n", "k")
    assert rt.compile(code, include_dirs=dirs).kernel("k")() == 2
    assert_nothing_published(cache_dir)
    first.chmod(0o644)
    assert make_runtime(source_roots=(str(src),)).compile(code, include_dirs=dirs).kernel("k")() == 1
