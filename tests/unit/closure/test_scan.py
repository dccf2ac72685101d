"""Facts about a closure (``safejit.closure.scan``): the directories that vouch for
negatives are recorded before the paths are found absent, never after; a closure
scanned while the compiler ran holds only while its files and negatives are as scanned;
what a process looked up is looked up again once a directory that vouched for it moved."""

from __future__ import annotations

import os
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import safejit
from safejit.closure import scan
from safejit.closure.hashing import snapshot_of
from safejit.closure.scan import Closure, negative_dirs, probe_macros, unchanged
from safejit.policy import completeness


@pytest.fixture
def settled(monkeypatch):
    """Directories count as changed long ago (the racy window is 2 s)."""
    monkeypatch.setattr(scan, "is_racy", lambda snap, now_ns=None: False)


def test_negative_dirs_records_the_deepest_existing_directory(tmp_path, settled):
    (tmp_path / "inc").mkdir()
    dirs = negative_dirs([str(tmp_path / "inc" / "a.h"), str(tmp_path / "inc" / "gone" / "b.h")])
    assert dirs is not None and [d for d, _ in dirs] == [str(tmp_path / "inc")]


def test_a_directory_changed_within_the_racy_window_vouches_for_nothing(tmp_path):
    (tmp_path / "inc").mkdir()  # (just now)
    assert negative_dirs([str(tmp_path / "inc" / "a.h")]) == []


def test_a_negative_that_is_there_is_none_however_old(tmp_path, settled):
    """The old order (paths found absent, then the directories recorded) vouched for a
    path made in between once its directory's change was older than the racy window."""
    (tmp_path / "inc").mkdir()
    there = tmp_path / "inc" / "shadow.h"
    there.write_text("#define SHADOW 1\n")
    assert negative_dirs([str(tmp_path / "inc" / "other.h"), str(there)]) is None


def test_a_path_made_right_after_the_directories_were_recorded_is_seen(tmp_path, monkeypatch, settled):
    (tmp_path / "inc").mkdir()
    path = tmp_path / "inc" / "late.h"
    real = scan._deepest_dirs

    def then_a_writer(paths):
        found = real(paths)
        path.write_text("")  # after the directory's stat, before the paths are looked for
        return found

    monkeypatch.setattr(scan, "_deepest_dirs", then_a_writer)
    assert negative_dirs([str(path)]) is None


def _closure(tmp_path, negatives):
    dep = tmp_path / "inc" / "one.h"
    dep.write_text("#define ONE 1\n")
    state = (str(dep), snapshot_of(dep.stat()), "0" * 64)
    return Closure([], [state], [], [], [str(p) for p in negatives])


@pytest.mark.parametrize("vouched", [True, False], ids=["by-directory", "path-by-path"])
def test_an_early_closure_stops_holding_once_a_negative_appears(tmp_path, settled, vouched):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "sub").mkdir()
    negative = tmp_path / "inc" / "sub" / "two.h"
    closure = _closure(tmp_path, [negative, tmp_path / "inc" / "gone" / "three.h"])
    dirs = negative_dirs(closure.negative_paths) if vouched else []
    assert dirs is not None and bool(dirs) == vouched
    assert unchanged(closure, dirs)
    negative.write_text("")
    assert not unchanged(closure, dirs)


def test_an_early_closure_stops_holding_once_a_missing_directory_appears(tmp_path, settled):
    (tmp_path / "inc").mkdir()
    closure = _closure(tmp_path, [tmp_path / "inc" / "gone" / "three.h"])
    dirs = negative_dirs(closure.negative_paths)
    assert dirs and unchanged(closure, dirs)
    (tmp_path / "inc" / "gone").mkdir()  # (the deepest existing directory gains an entry)
    assert not unchanged(closure, dirs)


def test_an_early_closure_stops_holding_once_a_file_changes(tmp_path, settled):
    (tmp_path / "inc").mkdir()
    closure = _closure(tmp_path, [])
    assert unchanged(closure, [])
    (tmp_path / "inc" / "one.h").write_text("#define ONE 22\n")  # (a size of its own: the same tick may pass)
    assert not unchanged(closure, [])


# -- the process-local memo of what was looked for ------------------------------------------


def _aged(*dirs) -> None:
    """Directories last changed long ago (mtime): an entry made now changes them visibly."""
    old = time.time() - 100
    for d in dirs:
        os.utime(d, (old, old))


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = os.path.lexists
    monkeypatch.setattr(scan.os.path, "lexists", lambda p: calls.append(p) or real(p))
    return calls


def _tree(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    dep = second / "one.h"
    dep.write_text("#define ONE 1\n")
    _aged(first, second, tmp_path)
    return first, second, dep


def test_lookups_of_the_same_paths_are_looked_up_once_while_their_directories_stand(tmp_path, settled, counted):
    first, second, dep = _tree(tmp_path)
    args = ([str(dep)], [str(first), str(second)], ["maybe.h"])
    got = scan.negative_lookups(*args)
    assert str(first / "one.h") in got[0] and str(first / "maybe.h") in got[0] and got[1] == []
    assert counted
    counted.clear()
    assert scan.negative_lookups(*args) == got and counted == []  # (their directories' stat only)
    (first / "maybe.h").write_text("")  # a probe that now resolves
    again = scan.negative_lookups(*args)
    assert str(first / "maybe.h") in again[1] and str(first / "maybe.h") not in again[0] and counted


def test_a_shadowing_header_made_since_is_seen_by_the_next_lookups(tmp_path, settled):
    first, second, dep = _tree(tmp_path)
    args = ([str(dep)], [str(first), str(second)], [])
    assert str(first / "one.h") in scan.negative_lookups(*args)[0]
    (first / "one.h").write_text("#define ONE 2\n")
    missing, present = scan.negative_lookups(*args)
    assert str(first / "one.h") in present and str(first / "one.h") not in missing


def test_a_directory_made_since_on_the_way_is_seen_by_the_next_lookups(tmp_path, settled):
    first, second, _ = _tree(tmp_path)
    (second / "sub").mkdir()
    deep = second / "sub" / "two.h"
    deep.write_text("")
    _aged(second, second / "sub")
    args = ([str(deep)], [str(first), str(second)], [])
    assert str(first / "sub" / "two.h") in scan.negative_lookups(*args)[0]
    (first / "sub").mkdir()  # (first/ gains an entry: first/sub/two.h may follow)
    (first / "sub" / "two.h").write_text("")
    assert str(first / "sub" / "two.h") in scan.negative_lookups(*args)[1]


def test_negative_dirs_of_the_same_paths_is_recorded_once_while_they_stand(tmp_path, settled, counted):
    (tmp_path / "inc").mkdir()
    _aged(tmp_path / "inc")
    paths = [str(tmp_path / "inc" / "a.h"), str(tmp_path / "inc" / "b.h")]
    dirs = negative_dirs(paths)
    assert dirs and counted
    counted.clear()
    assert negative_dirs(paths) == dirs and counted == []
    (tmp_path / "inc" / "b.h").write_text("")
    assert negative_dirs(paths) is None


def test_racy_directories_are_never_remembered(tmp_path, counted):
    (tmp_path / "inc").mkdir()  # (changed just now: its stat cannot vouch)
    paths = [str(tmp_path / "inc" / "a.h")]
    assert negative_dirs(paths) == []
    counted.clear()
    assert negative_dirs(paths) == [] and counted  # looked up again


def test_a_dangling_symlink_on_the_way_vouches_for_nothing(tmp_path, settled):
    """A negative under a symlink that leads nowhere yet is not vouched for by the
    directory holding the link: making its target changes no directory above it."""
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "a").symlink_to("../gen")
    assert negative_dirs([str(tmp_path / "inc" / "a" / "b.h")]) == []
    (tmp_path / "inc" / "loop").symlink_to("loop")
    assert negative_dirs([str(tmp_path / "inc" / "loop" / "b.h")]) == []
    # (a name not there at all is still vouched for by the deepest directory that is)
    assert [d for d, _ in negative_dirs([str(tmp_path / "inc" / "none" / "b.h")]) or []] == [str(tmp_path / "inc")]


def test_a_header_that_appears_through_a_dangling_directory_symlink_is_a_rebuild(tmp_path, make_runtime, settled):
    src = tmp_path / "src"
    (src / "inc1" / "a").mkdir(parents=True)
    (src / "inc0").mkdir()
    (src / "inc1" / "a" / "b.h").write_text("#define V 1\n")
    (src / "inc0" / "a").symlink_to("../gen")  # (leads nowhere yet)
    code = safejit.Source('#include "a/b.h"\nint v(void) { return V; }\n', "v")
    inc = (str(src / "inc0"), str(src / "inc1"))
    rt = make_runtime(source_roots=(str(src),), max_staleness_s=0)  # (its memory entry: rechecked each call)
    assert rt.compile(code, include_dirs=inc).kernel("v")() == 1
    (src / "gen").mkdir()
    (src / "gen" / "b.h").write_text("#define V 2\n")  # inc0/a/b.h now shadows inc1/a/b.h
    again = rt.compile(code, include_dirs=inc)
    assert again.kernel("v")() == 2 and again.artifact.tier == "compiled"


@pytest.mark.parametrize(
    "line",
    [
        b'#include "x.h"',
        b'#include"x.h"',
        b'#/**/include/**/"x.h"',
        b'  #  include /* why */ "x.h" // and so',
        b'%:include "x.h"',
        b'#inc\\\nlude "x.h"',
        b'/* a comment */ #include "x.h"',
        b"int a = 1'0 + '/*';\n#include \"x.h\"\n// */",  # (a digit separator is no quote)
        b'const char* r = R"(/*)";\n#include "x.h"\n// */',  # (a raw string: read as written too)
    ],
)
def test_quoted_includes_are_read_as_the_preprocessor_reads_them(line):
    assert scan.quoted_includes(b"int a;\n" + line + b"\nint b;\n") == ["x.h"]


@pytest.mark.parametrize(
    "text",
    [
        b'// #include "x.h"\n',
        b'/* #include "x.h" */\n',
        b'int a; /* a\nb */ #include "x.h"\n',  # (after the comment, not at the start of its line)
        b'const char* s = "\\n#include \\"x.h\\"";\n',
    ],
)
def test_what_only_looks_like_a_quoted_include_is_none(text):
    assert scan.quoted_includes(text) == []


@pytest.mark.parametrize(
    ("text", "computed"),
    [
        (b"#include NAME\n", True),
        (b"  #  include_next CUDA_STD_HEADER(tuple)\n", True),
        (b"#include /* c */ NAME\n", True),
        (b"%:include NAME\n", True),
        (b'#include "x.h"\n#include <y.h>\n#include_next <z.h>\n', False),
        (b"// #include NAME\n#define include_me 1\nint include;\n", False),
        (b"#includeNAME\n", False),  # (no directive gcc knows)
    ],
)
def test_an_include_of_a_name_a_macro_makes_is_seen(text, computed):
    assert scan.computed_include(b"int a;\n" + text) is computed


def _beside(tmp_path, here, read, search):
    return completeness._beside_computed([str(tmp_path / here)], [str(tmp_path / r) for r in read],
                                         [str(tmp_path / s) for s in search])  # fmt: skip


def test_what_a_computed_include_may_have_named_is_looked_for_next_to_its_includer(tmp_path):
    (tmp_path / "inc" / "sub" / "cute").mkdir(parents=True)
    (tmp_path / "sys" / "bits").mkdir(parents=True)
    read = ["inc/sub/a.h", "inc/cute/t.hpp", "sys/bits/c.h", "sys/std.h", "elsewhere/e.h"]
    found = _beside(tmp_path, "inc/sub", read, ["inc", "sys"])
    rel = sorted(os.path.relpath(p, tmp_path) for p in found)
    # sub/a.h, by its name under inc/, would be inc/sub/sub: absent, so the name's first part stands for it.
    assert rel == sorted([
        "inc/sub/sub",  # (inc/sub/a.h read as sub/a.h: inc/sub/sub is not there)
        "inc/sub/cute/t.hpp", "inc/sub/cute/t.hpp.gch",  # inc/sub/cute is there: the header itself
        "inc/sub/bits",  # inc/sub/bits is not: nothing under it can appear while it stays absent
        "inc/sub/std.h", "inc/sub/std.h.gch",
    ])  # fmt: skip


def test_a_probe_in_a_comment_is_none_and_one_after_a_raw_string_is_seen():
    """Probes are read as the preprocessor reads them: one in a comment was refused as a
    lookup outside the roots (a sound compile failed); a raw string holding a quote and a
    comment opener hid what followed it."""
    assert scan.has_include_probes(b'/* #if __has_include("/etc/hostname") */\nint a;\n') == []
    text = b'const char* r = R"("/*)";\n#if __has_include("/x.h")\n#endif\n// */\n'
    assert scan.has_include_probes(text) == [('"', "/x.h")]


def test_has_include_probes_are_read_through_comments_and_splices():
    text = b'#if __has_include(/**/"a.h") || __has_include(\\\n<b.h>) || __has_include /* c */ ("c.h")\n#endif\n'
    assert scan.has_include_probes(text) == [('"', "a.h"), ("<", "b.h"), ('"', "c.h")]


@pytest.mark.parametrize(
    ("text", "probes"),
    [
        # gcc in its GNU modes takes no trigraph: the probe after the comment is one
        (b'// what??/\n#if __has_include("opt.h")\n#endif\n', [('"', "opt.h")]),
        # strict modes do: the probe spliced across the line is one too
        (b'#if __has_??/\ninclude("z.h")\n#endif\n', [('"', "z.h")]),
        (b"#if __has_\\\ninclude(<w.h>)\n#endif\n", [("<", "w.h")]),
        (b"/* __has_include(<c.h>) */\n", []),
    ],
)
def test_a_probe_either_reading_of_trigraphs_shows_is_found(text, probes):
    """Trigraphs read always: a ``??/`` ending a comment line joined the next line, a
    probe, to the comment; it was never recorded (a stale hit once the header appeared,
    and an existence oracle outside the roots)."""
    assert scan.has_include_probes(text) == probes


def test_a_directive_spelt_with_trigraphs_is_found():
    assert scan.quoted_includes(b'??=include "a.h"\n#inc??/\nlude "b.h"\n') == ["a.h", "b.h"]


@pytest.mark.parametrize("splice", [b"\\\r\n", b"??/\r\n"])
def test_a_probe_split_by_a_splice_in_a_crlf_file_is_found(splice):
    """A file of CRLF lines splices with a backslash before ``\\r\\n``: such a probe was read
    unjoined and never recorded (a stale hit once the header appeared)."""
    text = b"#if __has_" + splice + b'include("c.h")\r\n#endif\r\n'
    assert scan.has_include_probes(text) == [('"', "c.h")]


def test_probe_macros_finds_wrappers_their_literal_calls_and_probes_of_named_headers():
    text = (
        # (a wrapper, split by a splice)
        b"#ifdef __has_include\n#  define HAS(_X) \\\n    __has_include( _X )\n#endif\n"
        b"#if HAS(<a.h> ) || defined(X)\n#endif\n"
        b'  #  elif \\\r\n HAS("b.h")\n'  # (a call on a continued line, CRLF)
        b"#define ALSO HAS(<c.h>) // HAS(NOT_A_CALL)\n"  # (a call in a macro's body; a comment)
        b"int x = a # if HAS(<not_a_directive.h>)\n"
        b"#define TWICE(x) HAS(x)\n"  # (a wrapper of a wrapper: what it probes is named by a macro)
        b"#define VA(...) __has_include(__VA_ARGS__)\n#define ALIAS __has_include\n"
        b"#if __has_include(FEAT)\n#endif\n#define TWO(a, b) __has_include(c)\n"
        b"#if /* over\n two lines */ CAT(H, AS)(<d.h>)\n"
    )
    found = probe_macros(text)
    assert found is not None
    assert found.wrappers == {"HAS", "VA"}
    assert found.aliases == (("ALIAS", "__has_include"),)
    assert set(found.calls) == {("HAS", "<", "a.h", False), ("HAS", '"', "b.h", False), ("HAS", "<", "c.h", True)}
    assert "HAS" in found.names and "NOT_A_CALL" not in found.names and "defined" not in found.names
    assert found.opaque[:2] == ("__has_include(FEAT", "__has_include(c")
    assert "CAT(H, AS)(<" in found.opaque[2]


def test_probe_macros_reads_a_line_of_many_calls_once():
    """A line of calls none of which closes (``f(<a f(<a ...``) was read again from each
    call: 160 KB took 38 s, and the compile's timeout did not cover it. These lines (500
    KB, 320 KB) would take over six minutes that way, past the suite's per-test timeout;
    read once, about a second. (No clock is asserted on.)"""
    line = b"#define UNUSED " + b"f(<a " * 100_000 + b"\n" + b"#if " + b"__has_include(a " * 20_000 + b"\n"
    found = probe_macros(line)
    assert found is not None and found.calls == () and found.names == {"f", "a"}
    assert "__has_include(a __has_include" in found.opaque
    # Lines a directive continues are read with it, not again as directives of their own
    # (20,000 spliced "#if" lines were each read on to the end).
    spliced = probe_macros(b"#if A \\\n" * 20_000 + b"   || W(<x.h>)\n")
    assert spliced is not None and spliced.calls == (("W", "<", "x.h", False),)


def test_a_header_name_read_as_tokens_is_a_call_only_when_it_names_one_header():
    """A ``<...>`` name given to a macro, or in a macro's body, is read as tokens: a
    parameter in it, a blank (spelt as the compiler joins tokens) or a ``#`` makes it no
    one name. A literal probe's name is kept as written, blanks and all."""
    text = (
        b"#define W(x) __has_include(<x>)\n#define W2(x) __has_include(<x.h>)\n"
        b"#define W3(x) HAS(<x/a.h>)\n#define FEAT feat.h\n#define CHECK __has_include(<FEAT>)\n"
        b"#if HAS(< b.h>) || HAS(<c.h>) || __has_include(< d.h>)\n#endif\n"
    )
    found = probe_macros(text)
    assert found is not None and found.wrappers == set()
    assert set(found.calls) == {
        ("HAS", "<", "c.h", False),
        ("__has_include", "<", " d.h", False),
        ("__has_include", "<", "FEAT", True),
    }
    assert found.opaque == ("__has_include(<x>)", "__has_include(<x.h>)")
    assert "HAS" in found.names  # (called with a name not known: W3's, the blank one)
    assert found.defined == {"W", "W2", "W3", "FEAT", "CHECK"}
    assert scan.has_include_probes(b"#if __has_include(< d.h>)\n#endif\n") == [("<", " d.h")]


def test_probe_macros_reads_calls_within_an_unclosed_name_once():
    """``W(<a W(<a ...`` shares one far ``>``: the blanks after it were skipped again for
    each call (1 MB of them after 20,000 calls: hours); each call's name was copied to
    that ``>`` (160 KB: 5 GB). A call within a name makes it none. (No clock asserted.)"""
    line = b"#define X " + b"W(<a " * 20_000 + b">" + b" " * 1_000_000 + b"x\n"
    found = probe_macros(line)
    assert found is not None and found.calls == () and found.names == {"W", "a", "x"}


def test_a_file_of_many_unclosed_raw_strings_is_read_once():
    """Each ``R"d(`` read on to the end of the file for its ``)d"``: 20,000 unclosed ones
    (80 KB, valid C where ``R`` is a macro) took 4 s; these 200,000 would take over six
    minutes, past the suite's per-test timeout. (No clock asserted.)"""
    text = b"\xef\xbb\xbf" + b'R"(\n' * 100_000 + b"".join(b'R"d%d(\n' % i for i in range(100_000))
    assert scan.as_read(text + b'#include "x.h"\n') == text[3:] + b'#include "x.h"\n'


def test_a_quote_left_open_reads_to_its_lines_end_as_gcc_lexes_it():
    """``#error don't /*`` in a skipped group is valid C: gcc lexes ``'t /*`` as a
    character constant left open, to the line's end, so the ``/*`` opens no comment.
    Each such ``/*`` was read on to the end of the file for its ``*/``: 720 KB took
    111 s; these 2 MB would take over 14 minutes, past the suite's per-test timeout.
    (No clock asserted.)"""
    text = b"#if 0\n" + b"#error don't /*\n" * 128_000 + b'#endif\n#if __has_include("x.h")\n#endif\n'
    assert scan.has_include_probes(text) == [('"', "x.h")]


def test_a_header_name_is_read_whole_once():
    """``#include <a/*>`` in a skipped group: g++ reads ``<a/*>`` as a header name, no
    comment; each such ``/*`` was read on to the end of the file for its ``*/`` (320 KB:
    20 s). These 1.6 MB would take over eight minutes that way. (No clock asserted.)"""
    text = b"#if 0\n" + b"#include <a/*>\n" * 100_000 + b'#endif\n#if __has_include("x.h")\n#endif\n'
    assert scan.has_include_probes(text) == [('"', "x.h")]


#: The reading as a single pattern gave it (quadratic on unclosed raw strings): the spec
#: (a literal left open reads to its line's end, as gcc lexes it).
_READ_AS_ONE_PATTERN = re.compile(
    rb"^[ \t\f\v]*#[ \t\f\v]*(?:include|include_next|import)[ \t\f\v]*<[^>\n]*>"
    rb"|__has_include(?:_next)?[ \t\f\v]*\([ \t\f\v]*<[^>\n]*>"
    rb"|(?<![\w.])\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*"
    rb'|(?<![\w])(?:u8|[uUL])?R"([^()\\ \t\n]{0,16})\(.*?\)\1"'
    rb'|"(?:\\.|[^"\\\n])*(?:"|$)|\'(?:\\.|[^\'\\\n])*(?:\'|$)|/\*.*?\*/|//[^\n]*',
    re.S | re.M,
)
_PIECES = [b'R"', b"(", b")", b'"', b"u8", b"L", b"x", b"/*", b"*/", b"//", b"\n", b"1", b"'", b"\\", b" "]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.sampled_from([*_PIECES, b'R"a(', b')a"', b'a"', b"R", b".", b"#include <", b"__has_include(<", b">"]),
        max_size=30,
    )
)
def test_raw_strings_and_comments_are_read_as_one_pattern_read_them(pieces):
    text = b"".join(pieces)
    spec = _READ_AS_ONE_PATTERN.sub(lambda m: b" " if m.group(0)[:1] == b"/" else m.group(0), text)
    assert scan._kept(text) == spec


def test_a_file_that_probes_nothing_through_macros_has_no_probe_macros():
    assert probe_macros(b"#include <x.h>\nint f(void) { return g(1); }\n") is None
