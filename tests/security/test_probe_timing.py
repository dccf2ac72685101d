"""A probe of a file outside the roots leaves the compile to go on as one of a file not
there does: gcc stopped at once at the sandbox's refusal (a file there), while a file
not there let the compile run on, so how long the compile took said which
(docs/security.md, "Any lookup outside the roots refuses the build")."""

from __future__ import annotations

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
