"""Names a compiler's depfile cannot carry one way only: gcc writes a backslash raw
(escaping only a space, ``#`` and ``$``), so a header whose name ends in a backslash
reads as an escaped space and the file read goes unrecorded — a decoy of the name
misread is recorded instead. Such a list is refused (UndeclaredDependencyError) and
nothing is published; a path holding a line break or a backslash is refused before the
compiler runs. Names with spaces, ``#`` and ``$`` still work."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import safejit
from safejit.closure.depfiles import check_compiler_depfile, parse_depfile
from tests.security._support import (
    SECRET_HEADER,
    SECRET_TOKEN,
    assert_no_secret,
    assert_nothing_published,
    needs_landlock,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    inc = tmp_path / "root" / "inc"
    inc.mkdir(parents=True)
    return tmp_path / "root"


def _runtime(make_runtime, root: Path, **config):
    return make_runtime(source_roots=(str(root),), **config)


@pytest.mark.parametrize("mode", ["off", pytest.param("auto", marks=needs_landlock)])
@pytest.mark.parametrize("name", ["y\\", "z" * 90 + "\\"], ids=["short", "wrapped"])
def test_a_header_named_with_a_trailing_backslash_is_refused_not_misread(
    make_runtime, root, cache_dir, tmp_path, mode, name
):
    # A symlink out of the root under the backslash name; decoys under the names it would
    # be misread as. Under Landlock the target is a system header (readable there).
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.h").write_text(SECRET_HEADER)
    target = str(outside / "secret.h") if mode == "off" else "/usr/include/errno.h"
    inc = root / "inc"
    (inc / name).symlink_to(target)
    for decoy in (name[:-1], name[:-1] + " "):
        (inc / decoy).write_text("")
    rt = _runtime(make_runtime, root, sandbox=mode)
    code = f'#include "{name}"\nint f(void) {{ return 1; }}\n'
    with pytest.raises(safejit.UndeclaredDependencyError) as exc:
        rt.compile(safejit.Source(code, "k"), include_dirs=(str(inc),))
    assert "backslash" in str(exc.value)
    assert_no_secret(exc.value)
    assert_nothing_published(cache_dir)


@pytest.mark.parametrize("bad", ["a\nb", "a\\b", "a\tb\x01"])
def test_an_include_dir_holding_a_line_break_or_backslash_is_refused_before_compiling(
    make_runtime, root, cache_dir, bad
):
    (root / bad).mkdir()
    (root / "a").write_text("")  # (the decoy a split name would record)
    rt = _runtime(make_runtime, root)
    with pytest.raises(safejit.PathConfinementError, match="control character or a backslash"):
        rt.compile(safejit.Source('#include "x.h"\nint f(void) { return 1; }\n', "k"), include_dirs=(str(root / bad),))
    assert rt.stats()["compiles"] == 0
    assert_nothing_published(cache_dir)


@pytest.mark.parametrize("field", ["cache_dirs", "source_roots"])
@pytest.mark.parametrize("bad", ["/tmp/a\nb", "/tmp/a\\b", "rel\x7f"])
def test_a_root_holding_a_line_break_or_backslash_is_a_config_error(field, bad):
    with pytest.raises(safejit.ConfigError, match="control character or a backslash"):
        safejit.Config(**{field: (bad,)})


@pytest.mark.parametrize("field", ["cache_dirs", "source_roots"])
def test_a_root_that_is_not_utf8_is_a_config_error(field, tmp_path):
    """A directory named by bytes that are not UTF-8 (as os.fsdecode gives them) cannot be
    named in a manifest: it was taken, published to, and every later disk hit raised
    UnicodeEncodeError."""
    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/dir\xff")
    os.mkdir(bad)
    with pytest.raises(safejit.ConfigError, match="not UTF-8"):
        safejit.Config(**{field: (bad,)})
    with pytest.raises(safejit.ConfigError, match="not UTF-8"):
        safejit.Config.from_env(**{field: (bad,)})
    assert os.listdir(bad) == []


def test_names_with_spaces_hash_and_dollar_are_dependencies_and_their_edits_rebuild(make_runtime, root, cache_dir):
    inc = root / "My Headers"
    inc.mkdir()
    (inc / "a b.h").write_text("#define A 1\n")
    (inc / "c#d.h").write_text("#define C 2\n")
    (inc / "e$f.h").write_text("#define E 3\n")
    code = '#include "a b.h"\n#include "c#d.h"\n#include "e$f.h"\nint f(void) { return A * 100 + C * 10 + E; }\n'
    src = safejit.Source(code, "k")
    mod = _runtime(make_runtime, root).compile(src, include_dirs=(str(inc),))
    assert mod.kernel("f")() == 123
    deps = {Path(d[1]).name for d in json.loads((Path(mod.artifact.path) / "manifest.json").read_text())["deps"]}
    assert {"a b.h", "c#d.h", "e$f.h"} <= deps
    for header, text in (("a b.h", "#define A 4\n"), ("e$f.h", "#define E 6\n")):
        (inc / header).write_text(text)
        os.utime(inc / header, ns=(0, 0))  # (any change of stat: rehashed)
    again = make_runtime(source_roots=(str(root),)).compile(src, include_dirs=(str(inc),))
    assert again.kernel("f")() == 426 and again.artifact.tier == "compiled"


def _gcc_depfile(tmp_path: Path, names: list[str]) -> tuple[str, Path]:
    inc = tmp_path / "inc"
    inc.mkdir()
    for name in names:
        (inc / name).write_text("\n")
    src = tmp_path / "s.c"
    src.write_text("".join(f'#include "{n}"\n' for n in names))
    subprocess.run(["cc", "-E", "-MD", "-MF", "s.d", "-I", "inc", "-o", "/dev/null", "s.c"], cwd=tmp_path, check=True)
    return (tmp_path / "s.d").read_text(), tmp_path


@pytest.mark.parametrize(
    ("names", "ok"),
    [
        (["plain.h", "a b.h", "c#d.h", "e$f.h", "g h i.h"], True),
        (["y\\", "next.h"], False),  # the trailing backslash, before the space between names
        (["a\\b.h"], False),  # a backslash inside a name (raw)
        (["e\\ f.h"], False),  # a backslash before a space (doubled by gcc)
        (["g\\\\.h"], False),
        (["tr ", "next.h"], False),  # a name ending in a space (the escape at its edge)
    ],
)
def test_what_gcc_writes_is_read_one_way_or_refused(tmp_path, names, ok):
    text, cwd = _gcc_depfile(tmp_path, names)
    exists = lambda name: os.path.lexists(cwd / name)  # noqa: E731
    if ok:
        check_compiler_depfile(text, exists)
        assert {f"inc/{n}" for n in names} <= set(parse_depfile(text))
    else:
        with pytest.raises(ValueError):
            check_compiler_depfile(text, exists)


def test_a_depfile_line_that_is_no_rule_or_a_control_character_is_refused():
    for text in ("k.o: a.h \\\n b.h\nstray\n", "k.o: a\x01b.h\n", "k.o: y\\\n"):
        with pytest.raises(ValueError):
            check_compiler_depfile(text, lambda name: False)
    check_compiler_depfile("k.o: a.h \\\n b.h\n\n", lambda name: False)
    assert SECRET_TOKEN  # (the secret module's token is what assert_no_secret looks for)


@pytest.mark.parametrize(
    "directive",
    ['#include"b.h"', '#/**/include "b.h"', '%:include "b.h"', '#define B "b.h"\n#include B'],
    ids=["no-space", "comment", "digraph", "computed"],
)
def test_a_header_placed_next_to_its_includer_later_is_seen_however_the_include_is_spelt(make_runtime, root, directive):
    """gcc looks for a quoted include next to the including file first; that place must
    stay empty for the build to stand, however the directive is written (these spellings
    were not read as includes, and a header put there later went unnoticed; a name a
    macro makes is unknown, so every header read from a search directory is looked for
    next to such an includer)."""
    (root / "inc" / "sub").mkdir()
    (root / "inc" / "sub" / "a.h").write_text(directive + "\n")  # (its own dir is no search dir)
    (root / "inc" / "b.h").write_text("#define V 1\n")
    rt = _runtime(make_runtime, root, max_staleness_s=0)
    src = safejit.Source('#include "sub/a.h"\nint v(void) { return V; }\n', "v")
    inc = (str(root / "inc"),)
    assert rt.compile(src, include_dirs=inc).kernel("v")() == 1
    (root / "inc" / "sub" / "b.h").write_text("#define V 2\n")  # (now found first)
    assert rt.compile(src, include_dirs=inc).kernel("v")() == 2


def test_a_probe_with_dotdot_in_the_source_is_refused(make_runtime, root, cache_dir):
    """The source's own quoted probes are looked for next to it first, in its private
    scratch dir, from where more than two ".." lead out of it and of every root:
    refused, present or not (one or two stay where only the library names entries)."""
    rt = _runtime(make_runtime, root, sandbox="off")  # (Landlock would refuse a present one itself)
    for name in ("../../../../../../../../../../../../etc/hostname", "../../../nothing-there.h"):
        code = f'#if __has_include("{name}")\nint f(void) {{ return 1; }}\n#else\nint f(void) {{ return 0; }}\n#endif\n'
        with pytest.raises(safejit.UndeclaredDependencyError, match="outside every declared root"):
            rt.compile(safejit.Source(code, "k"))
    assert_nothing_published(cache_dir)
