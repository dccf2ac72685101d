"""The command line's output layer: escaping at the sink, tables that fit, rich or plain,
spinners and progress only on a terminal."""

from __future__ import annotations

import io
import logging

import pytest

from safejit.cli._out import Out, render_table
from safejit.cli._text import cell_width, safe


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text", "plain text"),
        ("é 日本 ✓", "é 日本 ✓"),  # printable Unicode stays
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),  # OSC
        ("\x1b[2J\x1b[31m", "\\x1b[2J\\x1b[31m"),  # CSI
        ("\x9b2J", "\\x9b2J"),  # C1 CSI
        ("a\nb\rc\td", "a\\x0ab\\x0dc\\x09d"),  # forged lines
        ("\x7f\x00", "\\x7f\\x00"),
        ("x\u202ey\u2066z\u200f", "x\\u202ey\\u2066z\\u200f"),  # bidi overrides and marks
        ("\u2028\u2029", "\\u2028\\u2029"),  # line and paragraph separators
        ("bad-\udcff\udcfe", "bad-\\xff\\xfe"),  # bytes that were not UTF-8 (os.fsdecode)
        ("\ud800", "\\ud800"),  # a lone surrogate
        ("back\\slash", "back\\\\slash"),  # unambiguous: a literal backslash is doubled
        ("\U000e0001", "\\U000e0001"),  # a tag character (format, astral)
    ],
)
def test_safe_escapes_every_non_printable_character(raw, shown):
    assert safe(raw) == shown
    assert safe(raw).isprintable()


def test_cell_width_counts_wide_and_combining_characters():
    assert cell_width("abc") == 3 and cell_width("日本") == 4 and cell_width("e\u0301") == 1


def test_a_table_fits_its_width_cutting_only_the_columns_allowed():
    rows = [("a" * 12, "n" * 70, "/very/long/" + "p" * 60 + "/end.h", "1,234")]
    lines = render_table(("ID", "NAME", "PATH", "SIZE"), rows, 60, right={3}, shrink={1, 2}, middle={2})
    assert all(len(line) <= 60 for line in lines)
    assert lines[1].startswith("a" * 12 + "  ")  # the id was not cut
    assert lines[1].endswith("1,234")  # nor the number
    assert "…" in lines[1] and "end.h" in lines[1]  # the path was cut in its middle
    header = lines[0]
    assert header.index("SIZE") + len("SIZE") == len(header)  # right-aligned with its column


def test_a_table_aligns_wide_characters_and_escapes_cells():
    lines = render_table(("K", "V"), [("日本", "1"), ("ab", "\x1b[2J")], 80)
    assert lines == ["K     V", "日本  1", "ab    \\x1b[2J"]


def _rich(width: int = 80) -> tuple[Out, io.StringIO]:
    buf = io.StringIO()
    return Out(buf, io.StringIO(), use_rich=True, force_terminal=True, width=width), buf


def test_rich_output_escapes_text_and_never_reads_it_as_markup():
    pytest.importorskip("rich")
    out, buf = _rich()
    out.line(("FAIL", "bad"), " t\x1b]0;pwned\x07 [red]x[/red] [link=http://evil]y[/link]")
    out.table(("TENANT",), [("\x1b[2Jt",)])
    text = buf.getvalue()
    assert "\x1b[" in text  # rich's own colours (a terminal was forced)
    assert "\x1b]" not in text and "\x07" not in text and "\x1b[2J" not in text
    assert "t\\x1b]0;pwned\\x07 [red]x[/red] [link=http://evil]y[/link]" in text
    assert "\\x1b[2Jt" in text


def test_plain_output_has_no_escape_sequences_at_all():
    buf = io.StringIO()
    out = Out(buf, io.StringIO(), use_rich=False, width=80)
    out.line(("ok", "ok"), " done")
    out.table(("A",), [("1",)])
    assert buf.getvalue() == "ok done\nA\n1\n"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_status_and_progress_draw_only_on_a_terminal():
    pipe = io.StringIO()
    out = Out(pipe, io.StringIO(), use_rich=False)
    with out.status("compiling") as update, out.progress("verifying", 3) as done:
        update("still compiling")
        done(1)
    assert pipe.getvalue() == ""
    tty = _Tty()
    out = Out(tty, io.StringIO(), use_rich=False, width=80)
    with out.progress("verifying", 3) as done:
        done(2)
    drawn = tty.getvalue()
    assert "\rverifying 2/3" in drawn and drawn.endswith("\r")  # cleared at the end
    assert "\x1b" not in drawn


def test_status_follows_the_library_info_lines_escaped():
    tty = _Tty()
    out = Out(tty, io.StringIO(), use_rich=False, width=80)
    logger = logging.getLogger("safejit.runtime")
    with out.status("starting"):
        logger.info("compiling %s (host, build key %s)", "k\x1b[2J", "abc")
    assert "\rcompiling k\\x1b[2J (host, build key abc)" in tty.getvalue()
    assert logging.getLogger("safejit").handlers == []  # (removed again)


def test_the_rich_spinner_runs_on_a_terminal():
    pytest.importorskip("rich")
    out, buf = _rich()
    with out.status("compiling \x1b]0;x\x07") as update:
        update("compiled")
    assert "\x1b]0;x" not in buf.getvalue()
