"""Path confinement for NVRTC in its worker, which compiles with the real search path:
it may read only under the declared roots and the toolchain's (Landlock), and every
path it looks up is recorded, so a file outside is refused whether NVRTC was denied
it (Landlock) or found it (no Landlock, or a mere existence probe).

One test per attack: the typed error, the secret in no message or log, nothing
published.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import safejit
from tests.security._support import assert_no_secret, assert_nothing_published

pytest.importorskip("cuda.bindings.nvrtc")
KERNEL = 'extern "C" __global__ void s(int* out) {{ *out = {value}; }}\n'


def _compile(make_runtime, project: Path, code: str, *include_dirs: Path) -> safejit.Runtime:
    rt = make_runtime(backend="cuda", source_roots=(str(project),))
    rt.compile(safejit.Source(code, "s"), include_dirs=tuple(str(d) for d in include_dirs), arch="sm_90")
    return rt


def _assert_refused(exc: pytest.ExceptionInfo, cache_dir: Path) -> None:
    assert_no_secret(exc.value, getattr(exc.value, "log", ""))
    assert_nothing_published(cache_dir)


def test_nvrtc_absolute_include_outside_roots_is_refused(make_runtime, project, outside, cache_dir):
    code = f'#include "{outside}/secret.h"\n' + KERNEL.format(value="SECRET")
    with pytest.raises(safejit.PathConfinementError) as exc:
        _compile(make_runtime, project, code)
    assert getattr(exc.value, "path", None) is None and "outside every declared root" in str(exc.value)  # (no name)
    _assert_refused(exc, cache_dir)


def test_nvrtc_header_symlink_pointing_outside_is_refused(make_runtime, project, outside, cache_dir):
    (project / "include" / "secret.h").symlink_to(outside / "secret.h")
    code = "#include <secret.h>\n" + KERNEL.format(value="SECRET")
    with pytest.raises(safejit.PathConfinementError) as exc:
        _compile(make_runtime, project, code, project / "include")
    assert getattr(exc.value, "path", None) is None and "outside every declared root" in str(exc.value)  # (no name)
    _assert_refused(exc, cache_dir)


def test_nvrtc_dotdot_include_escape_is_refused(make_runtime, project, cache_dir):
    include = project / "include"
    (project / "outside").mkdir()
    (project / "outside" / "secret.h").write_text("#define SECRET 1234\n")
    code = '#include "../outside/secret.h"\n' + KERNEL.format(value="SECRET")
    with pytest.raises(safejit.PathConfinementError) as exc:
        _compile(make_runtime, include, code, include)
    assert getattr(exc.value, "path", None) is None and "outside every declared root" in str(exc.value)  # (no name)
    _assert_refused(exc, cache_dir)


def test_nvrtc_probe_of_an_absent_file_outside_roots_is_refused(make_runtime, project, outside, cache_dir):
    """The same probe when the file is not there: its absence decided the program as its
    presence would have (it was published with no negative recorded, and served on after
    the file appeared)."""
    code = f'#if __has_include("{outside}/later.h")\n#define FOUND 1\n#else\n#define FOUND 0\n#endif\n'
    with pytest.raises(safejit.PathConfinementError) as exc:
        _compile(make_runtime, project, code + KERNEL.format(value="FOUND"))
    assert getattr(exc.value, "path", None) is None and "outside every declared root" in str(exc.value)  # (no name)
    _assert_refused(exc, cache_dir)


def test_nvrtc_existence_probe_outside_roots_is_refused(make_runtime, project, outside, cache_dir):
    # __has_include reads nothing, but what it finds changes the program all the same.
    code = f'#if __has_include("{outside}/secret.h")\n#define FOUND 1\n#else\n#define FOUND 0\n#endif\n'
    with pytest.raises(safejit.PathConfinementError) as exc:
        _compile(make_runtime, project, code + KERNEL.format(value="FOUND"))
    assert getattr(exc.value, "path", None) is None and "outside every declared root" in str(exc.value)  # (no name)
    _assert_refused(exc, cache_dir)


@pytest.mark.parametrize(
    "directive",
    ['#include "{p}"', '#if __has_include("{p}")\n#endif', '#define P "{p}"\n#if __has_include(P)\n#endif'],
    ids=["include", "probe", "probe-of-a-macro"],
)
def test_whether_an_outside_file_exists_is_not_told(make_runtime, project, outside, cache_dir, directive):
    """An outside file that is there (Landlock refuses it) and one that is not (not found)
    fail the compile with the same error type and words, but for the name: the error was
    a PathConfinementError for one and a CompileError or UndeclaredDependencyError for
    the other, which told a tenant whether any file outside its roots exists."""
    told = []
    for name in ("secret.h", "nothing-there.h"):
        code = directive.replace("{p}", str(outside / name)) + "\n" + KERNEL.format(value="1")
        with pytest.raises(safejit.SafejitError) as exc:
            _compile(make_runtime, project, code)
        told.append((type(exc.value), str(exc.value).replace(name, "<name>")))
        _assert_refused(exc, cache_dir)
    assert told[0] == told[1] and told[0][0] is safejit.UndeclaredDependencyError, told


@pytest.mark.parametrize(
    "directive",
    [
        '#define P "{p}"\n#include P',
        '#define P "{dotdot}"\n#include P',
        '#include "link.h"',
        '#define P "{p}"\n#if __has_include(P)\n#endif',
    ],
    ids=["computed-absolute", "computed-dotdot", "link-out-of-a-root", "probe-of-a-macro"],
)
def test_whether_an_outside_file_exists_is_not_told_with_headers_in_memory(
    make_runtime, project, outside, cache_dir, monkeypatch, directive
):
    """Where NVRTC's lookups are not recorded, its worker gets the headers in memory, and
    Landlock alone keeps it from the files it names itself (a computed #include). A name
    it could not open that led outside the roots was then refused when a file was there
    and a missing header when not (PathConfinementError against CompileError); so was a
    link in a root whose target is outside. One error now, whichever. (A probe NVRTC
    makes itself comes out false both ways, Landlock refusing the one there: the same
    binary, never published.)"""
    from safejit.backends.cuda import backend as cuda_backend

    monkeypatch.setattr(cuda_backend.lookup_recorder, "build", lambda *a, **k: None)  # (headers in memory)
    include = project / "include"
    include.mkdir(exist_ok=True)
    told = []
    for name in ("secret.h", "nothing-there.h"):
        target = outside / name
        (include / "link.h").unlink(missing_ok=True)
        (include / "link.h").symlink_to(target)
        dotdot = os.path.relpath(target, include)
        code = directive.format(p=target, dotdot=dotdot) + "\n" + KERNEL.format(value="1")
        if "__has_include" in directive:
            rt = make_runtime(backend="cuda", source_roots=(str(project),))
            told.append(rt.build(safejit.Source(code, "s"), include_dirs=(str(include),), arch="sm_90").digest)
            assert_nothing_published(cache_dir)
            continue
        with pytest.raises(safejit.SafejitError) as exc:
            _compile(make_runtime, project, code, include)
        told.append((type(exc.value), str(exc.value).replace(name, "<name>")))
        _assert_refused(exc, cache_dir)
        assert isinstance(exc.value, safejit.PolicyError)
    assert told[0] == told[1], told


def test_nvrtc_files_the_worker_may_read_for_itself_are_outside_like_any(make_runtime, project, cache_dir):
    """The worker may read NVRTC's builtins library (its first compile loads it): a probe
    of a file there was a PathConfinementError naming it, one of an absent name the
    generic error without a name — an existence oracle, and the worker read the file. Both
    are the one generic refusal now, and the directory itself is not readable."""
    import os

    from safejit.backends.cuda.nvrtc import library_path

    libdir = os.path.dirname(library_path())
    there = next(n for n in sorted(os.listdir(libdir)) if n.startswith("libnvrtc-builtins.so"))
    errors = []
    for name in (there, "libnvrtc.so.13", "safejit-absent.so"):
        code = f'#if __has_include("{libdir}/{name}")\n#define X 1\n#endif\nextern "C" __global__ void k() {{}}\n'
        rt = make_runtime(backend="cuda", source_roots=(str(project),))
        with pytest.raises(safejit.PathConfinementError) as exc:
            rt.compile(safejit.Source(code, "k"), arch="sm_90")
        errors.append((str(exc.value), getattr(exc.value, "path", None)))
    assert errors[0] == errors[1] == errors[2] and errors[0][1] is None, errors
    assert_nothing_published(cache_dir)


@pytest.mark.parametrize(
    "directive",
    ['??=include "{outside}/secret.h"', '#inc??/\nlude "{outside}/secret.h"', '??=include ??/\n"{outside}/secret.h"'],
)
def test_in_process_nvrtc_sees_a_directive_spelt_with_trigraphs(make_runtime, project, outside, cache_dir, directive):
    """C++ before 17 takes ``??=`` for ``#`` and ``??/`` for a backslash: the scanner that
    hands in-process NVRTC its headers did not, and NVRTC opened the file itself, in this
    process, unconfined (the secret compiled into the cubin, the manifest naming none)."""
    rt = make_runtime(backend="cuda", source_roots=(str(project),), nvrtc_worker=False)
    code = directive.format(outside=outside) + "\n" + KERNEL.format(value="SECRET")
    with pytest.raises(safejit.PathConfinementError) as exc:
        rt.compile(safejit.Source(code, "s"), arch="sm_90", flags=("-std=c++11",))
    _assert_refused(exc, cache_dir)


def test_a_lookup_outside_the_roots_is_the_same_error_on_every_backend(make_runtime, project, outside, cache_dir):
    """The host and nvcc paths raised UndeclaredDependencyError, NVRTC's worker a
    PathConfinementError, for the same include: one class now (a PathConfinementError
    too), with the same words."""
    import shutil

    told = []
    configs = [({}, "c"), ({"backend": "cuda", "cuda_compiler": "nvrtc"}, "cu")]
    if shutil.which("nvcc", path="/usr/local/cuda/bin:/usr/bin"):
        configs.append(({"backend": "cuda", "cuda_compiler": "nvcc"}, "cu"))
    for config, ext in configs:
        rt = make_runtime(source_roots=(str(project),), **config)
        code = f'#include "{outside}/secret.h"\n' + (
            "int s(void) { return SECRET; }\n" if ext == "c" else KERNEL.format(value="SECRET")
        )
        with pytest.raises(safejit.UndeclaredDependencyError) as exc:
            rt.compile(safejit.Source(code, "s", filename=f"s.{ext}"), **({"arch": "sm_90"} if config else {}))
        assert isinstance(exc.value, safejit.PathConfinementError)
        told.append(str(exc.value).removeprefix("s: "))
        _assert_refused(exc, cache_dir)
    assert len(set(told)) == 1 and "logged at DEBUG" in told[0], told


@pytest.mark.parametrize("in_memory", [False, True], ids=["recorded", "headers-in-memory"])
def test_a_link_whose_target_climbs_through_an_outside_dir_is_refused_either_way(
    make_runtime, project, outside, cache_dir, monkeypatch, in_memory
):
    """Found in the fourth review: a link in a root to ``<outside>/dir/../../<root>/f.h``
    was followed as if ``dir`` were there (``os.path.realpath``): built when it was,
    "cannot open" when not. Walked as the kernel walks it, it is refused either way."""
    from safejit.backends.cuda import backend as cuda_backend

    if in_memory:
        monkeypatch.setattr(cuda_backend.lookup_recorder, "build", lambda *a, **k: None)
    include = project / "include"
    include.mkdir(exist_ok=True)
    (include / "real.h").write_text("#define VALUE 7\n")
    (outside / "dir").mkdir()
    told = []
    for sub in ("dir", "nothing-there"):
        (include / "link.h").unlink(missing_ok=True)
        (include / "link.h").symlink_to(os.path.join(outside, sub, "..", "..", project.name, "include", "real.h"))
        code = '#include "link.h"\n' + KERNEL.format(value="VALUE")
        with pytest.raises(safejit.SafejitError) as exc:
            _compile(make_runtime, project, code, include)
        told.append((type(exc.value), str(exc.value)))
        _assert_refused(exc, cache_dir)
    assert told[0] == told[1] and issubclass(told[0][0], safejit.PolicyError), told
