"""Class 4: every lookup the compiler made that could change the build is part of the
key — ``__has_include`` probes by path (``..``, absolute) and precompiled headers
beside a header — or the build is refused. Each attack: the typed error and nothing
published, or a rebuild instead of a stale hit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import safejit
from safejit.sandbox import lookups
from tests.conftest import settle
from tests.security._support import assert_no_secret, assert_nothing_published

needs_recorder = pytest.mark.skipif(not lookups.supported(), reason="no lookup recorder on this machine")

PROBE = """
#if __has_include({name})
#define WHICH 2
#else
#define WHICH 1
#endif
int which(void) {{ return WHICH; }}
"""


def _project(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    inc = root / "a" / "inc"
    inc.mkdir(parents=True)
    return root, inc


@needs_recorder
@pytest.mark.parametrize("name", ['"../x.h"', '"../../x.h"', "<../x.h>"])
def test_a_has_include_probe_by_dotdot_is_refused_until_found_under_the_roots(make_runtime, tmp_path, cache_dir, name):
    """Not found under the roots, a ``..`` name is looked for on in the compiler's own
    dirs, and climbs out of them (``/usr/include/../x.h``): refused whether a file is
    there or not (as a negative, the build said which outside files exist). Found under
    the roots first, it is a dependency like any other."""
    root, inc = _project(tmp_path)
    src = safejit.Source(PROBE.format(name=name), "which")
    rt = make_runtime(source_roots=(str(root),), max_staleness_s=0)
    with pytest.raises(safejit.UndeclaredDependencyError, match="outside every declared root"):
        rt.compile(src, include_dirs=(str(inc),))
    assert_nothing_published(cache_dir)
    target = (inc / name.strip('"<>')).resolve()
    target.write_text("/* now it exists */\n")
    settle()
    assert rt.compile(src, include_dirs=(str(inc),)).kernel("which")() == 2
    target.write_text("/* changed */\n")
    settle()
    assert make_runtime(source_roots=(str(root),)).explain(src, include_dirs=(str(inc),)).miss == "dep_changed"


@pytest.mark.parametrize("where", ["dotdot", "absolute"])
def test_a_has_include_probe_outside_the_roots_is_refused(make_runtime, tmp_path, outside, cache_dir, where):
    root, inc = _project(tmp_path)
    name = f'"{outside}/secret.h"' if where == "absolute" else '"../../../outside/secret.h"'
    assert (inc / "../../../outside/secret.h").resolve() == (outside / "secret.h").resolve()
    rt = make_runtime(source_roots=(str(root),), sandbox="off")
    with pytest.raises(safejit.UndeclaredDependencyError) as exc:
        rt.compile(safejit.Source(PROBE.format(name=name), "which"), include_dirs=(str(inc),))
    assert "outside every declared root" in str(exc.value)
    assert_no_secret(exc.value)
    assert_nothing_published(cache_dir)


def test_a_has_include_probe_outside_the_roots_in_a_header_is_refused(make_runtime, tmp_path, outside, cache_dir):
    root, inc = _project(tmp_path)
    (inc / "probe.h").write_text(PROBE.format(name=f"<{outside}/secret.h>").replace("int which", "static int w"))
    rt = make_runtime(source_roots=(str(root),), sandbox="off")
    with pytest.raises(safejit.UndeclaredDependencyError):
        rt.compile(safejit.Source('#include "probe.h"\nint k(void){return WHICH;}\n', "k"), include_dirs=(str(inc),))
    assert_nothing_published(cache_dir)


def test_a_precompiled_header_appearing_beside_a_header_is_never_used_nor_served_stale(make_runtime, tmp_path):
    """gcc looks for ``x.h.gch`` before ``x.h`` and uses it when valid, and its depfile
    then names neither: so a C token is force-included first (after it, gcc uses no
    precompiled header), and a ``.gch`` appearing where one would be looked for is a
    negative lookup all the same (it could stand for the implicit stdc-predef.h)."""
    root, inc = _project(tmp_path)
    (inc / "cfg.h").write_text("#define CFG 1\n")
    src = safejit.Source('#include "cfg.h"\nint cfg(void){return CFG;}\n', "cfg")
    rt = make_runtime(source_roots=(str(root),))
    assert rt.compile(src, include_dirs=(str(inc),)).kernel("cfg")() == 1
    # A real precompiled header for cfg.h, made from other text (the same options as a build).
    other = tmp_path / "other.h"
    other.write_text("#define CFG 7\n")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O2", "-fno-lto", "-x", "c-header", str(other), "-o", str(inc / "cfg.h.gch")],
        check=True,
    )
    settle()
    fresh = make_runtime(source_roots=(str(root),))
    explained = fresh.explain(src, include_dirs=(str(inc),))
    assert explained.result == "miss" and explained.path == str(inc / "cfg.h.gch")
    mod = fresh.compile(src, include_dirs=(str(inc),))
    assert mod.artifact.tier == "compiled"
    assert mod.kernel("cfg")() == 1  # the header's value: the precompiled one was not used
    (inc / "cfg.h.gch").unlink()
    settle()
    again = make_runtime(source_roots=(str(root),)).compile(src, include_dirs=(str(inc),))
    assert again.artifact.tier == "disk" and again.kernel("cfg")() == 1


@pytest.mark.parametrize("recorded", [True, False])
def test_probes_past_the_lookups_limit_are_refused_before_they_cost(
    make_runtime, tmp_path, cache_dir, recorded, monkeypatch
):
    """Thousands of ``__has_include`` probes, each looked for in every include dir, were
    walked, anchored and kept one by one in this process, past the compile's time limit
    (5,000 probes in 71 dirs: 10 s of CPU, a 21 MB manifest in the shared cache). Past
    4 paths per dependency of ``max_deps`` they are a ``LimitExceededError``: nothing
    published. ``recorded``: the preprocessor's lookups recorded (the recorder's own count
    refuses them), else derived from the sources (the probes times the dirs)."""
    root = tmp_path / "root"
    dirs = [root / f"inc{i}" for i in range(4)]
    for d in dirs:
        d.mkdir(parents=True)
    code = "".join(f"#if __has_include(<zz{i:04d}.h>)\n#endif\n" for i in range(60)) + "int f(void) { return 1; }\n"
    from safejit.policy import completeness

    monkeypatch.setattr(completeness, "LOOKUPS_FLOOR", 0)  # (the floor, 100,000, would take a big source)
    rt = make_runtime(source_roots=(str(root),), max_deps=40)  # (the limit: 160 paths)
    sb = rt._init()[0].sandbox
    if recorded and sb.preload_env() is None:
        pytest.skip("no lookup recorder here")
    if not recorded:
        sb.preload_env = lambda: None  # type: ignore[method-assign]
    with pytest.raises(safejit.LimitExceededError, match=r"limit of 160|the limit is 160") as info:
        rt.build(safejit.Source(code, "f"), include_dirs=tuple(map(str, dirs)))
    assert info.value.limit == 160
    assert_nothing_published(cache_dir)
    few = "".join(f"#if __has_include(<zz{i:04d}.h>)\n#endif\n" for i in range(3)) + "int f(void) { return 1; }\n"
    assert rt.compile(safejit.Source(few, "f"), include_dirs=tuple(map(str, dirs))).kernel("f")() == 1


def test_many_include_dirs_fit_the_lookups_limit_of_a_small_max_deps(make_runtime, tmp_path):
    """Each header is looked for in every include dir before its own: 80 headers in the
    last of 12 dirs are 880 paths not there, 11 a file. The limit was 4 a file of
    ``max_deps`` (800 for 200), refusing such a build; it is never under 100,000."""
    root = tmp_path / "root"
    dirs = [root / f"inc{i:02d}" for i in range(12)]
    for d in dirs:
        d.mkdir(parents=True)
    for i in range(80):
        (dirs[-1] / f"h{i:02d}.h").write_text(f"#define H{i} {i}\n")
    settle()
    code = "".join(f'#include "h{i:02d}.h"\n' for i in range(80)) + "int f(void) { return H79; }\n"
    rt = make_runtime(source_roots=(str(root),), max_deps=200)
    assert rt.compile(safejit.Source(code, "f"), include_dirs=tuple(map(str, dirs))).kernel("f")() == 79
