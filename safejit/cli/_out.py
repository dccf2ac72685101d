"""Where the command line writes: plain aligned text, coloured by rich when it is
installed and the output is a terminal (``pip install 'safejit[cli]'``).

Every string is escaped at this sink (:func:`~._text.safe`): callers pass text as
it came from the cache, the filesystem or an exception, and nothing they pass
can reach the terminal as a control sequence. ``--json`` output is written by
:func:`json.dumps` with ``ensure_ascii``, which escapes every control and
non-ASCII character itself (``\\u001b``); paths keep their exact value there (a
name that was not UTF-8 round-trips through ``os.fsencode``).

Tables are laid out here, the same with and without rich, to fit the terminal's
width (``COLUMNS``, else 80 when the output is not a terminal): the columns a
command marks as shrinkable are cut with ``…`` until the table fits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, TextIO

from ._text import cell_width, safe

__all__ = ["Out", "Part", "render_table"]

#: A piece of a line: text, or ``(text, style)``; styles: ok, bad, warn, dim, bold.
Part = str | tuple[str, str]

_RICH_STYLES = {"ok": "green", "bad": "bold red", "warn": "yellow", "dim": "dim", "bold": "bold"}
_GAP = 2
#: The narrowest a shrinkable column gets (its header may be cut too).
_MIN_COLUMN = 8


def _rich_console(stream: TextIO, force_terminal: bool | None) -> Any:
    """A rich console on ``stream``, or None when rich is not installed."""
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(file=stream, highlight=False, markup=False, emoji=False, force_terminal=force_terminal)


class Out:
    """The command line's output. ``use_rich``: None picks rich when it is installed
    and ``stream`` is a terminal; ``width`` defaults to the terminal's."""

    def __init__(
        self,
        stream: TextIO | None = None,
        err: TextIO | None = None,
        *,
        use_rich: bool | None = None,
        width: int | None = None,
        force_terminal: bool | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.tty = bool(force_terminal) or _isatty(self.stream)
        want = self.tty if use_rich is None else use_rich
        self._rich = _rich_console(self.stream, force_terminal) if want else None
        self.width = max(40, width if width is not None else shutil.get_terminal_size((80, 24)).columns)

    @property
    def rich(self) -> bool:
        return self._rich is not None

    # -- lines -----------------------------------------------------------------
    def line(self, *parts: Part) -> None:
        """One line; each part escaped (a newline in a part is shown as ``\\x0a``)."""
        if self._rich is None:
            self.stream.write("".join(safe(p if isinstance(p, str) else p[0]) for p in parts) + "\n")
            return
        from rich.text import Text

        text = Text()
        for p in parts:
            if isinstance(p, str):
                text.append(safe(p))
            else:
                text.append(safe(p[0]), style=_RICH_STYLES.get(p[1], ""))
        self._rich.print(text, soft_wrap=True, crop=False)

    def error(self, message: str, *more: str) -> None:
        """``error: message`` on stderr, then each of ``more`` indented."""
        self.err.write(f"error: {safe(message)}\n")
        for line in more:
            self.err.write(f"  {safe(line)}\n")

    def warn(self, message: str) -> None:
        """``warning: message`` on stderr (the command goes on)."""
        self.err.write(f"warning: {safe(message)}\n")

    def json(self, data: Any) -> None:
        """``data`` as JSON (control and non-ASCII characters escaped by the encoder)."""
        self.stream.write(json.dumps(data, indent=2, ensure_ascii=True, allow_nan=False) + "\n")

    # -- tables ----------------------------------------------------------------
    def table(
        self,
        headers: Sequence[str],
        rows: Sequence[Sequence[object]],
        *,
        title: str | None = None,
        right: Collection[int] = (),
        shrink: Collection[int] = (),
        middle: Collection[int] = (),
    ) -> None:
        """An aligned table that fits :attr:`width`. ``right``: right-aligned columns
        (numbers); ``shrink``: the columns that may be cut to fit (all when empty);
        ``middle``: those cut in the middle (paths, keys) rather than at the end."""
        if title:
            self.line((title, "bold"))
        lines = render_table(headers, rows, self.width, right=right, shrink=shrink, middle=middle)
        if self._rich is None:
            self.stream.write("".join(line + "\n" for line in lines))
            return
        from rich.text import Text

        self._rich.print(Text(lines[0], style="bold"), soft_wrap=True, crop=False)
        for line in lines[1:]:
            self._rich.print(Text(line), soft_wrap=True, crop=False)

    # -- feedback while waiting ------------------------------------------------
    @contextlib.contextmanager
    def status(self, text: str, *, follow_log: bool = True) -> Iterator[Callable[[str], None]]:
        """A spinner (rich) or a status line (plain) while the block runs, on a terminal
        only; yields ``update(text)``. With ``follow_log``, the library's INFO lines
        (``compiling …``, ``compiled … in …``) update it as they come."""
        if not self.tty:
            yield lambda _text: None
            return
        if self._rich is not None:
            with self._rich.status(safe(text)) as spinner:

                def update(new: str) -> None:
                    spinner.update(safe(new))

                with _following_log(update, follow_log):
                    yield update
            return
        shown = [0]

        def show(new: str) -> None:
            line = _fit(safe(new), self.width - 1, middle=False)
            self.stream.write("\r" + line + " " * max(0, shown[0] - cell_width(line)) + "\r")
            self.stream.flush()
            shown[0] = cell_width(line)

        show(text)
        try:
            with _following_log(show, follow_log):
                yield show
        finally:
            self.stream.write("\r" + " " * shown[0] + "\r")
            self.stream.flush()

    @contextlib.contextmanager
    def progress(self, label: str, total: int) -> Iterator[Callable[[int], None]]:
        """A transient progress bar (rich) or counter (plain) on a terminal; yields
        ``done(n)``, the count of items finished so far."""
        if not self.tty or total <= 0:
            yield lambda _n: None
            return
        if self._rich is not None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            with Progress(*columns, console=self._rich, transient=True) as bar:
                task = bar.add_task(safe(label), total=total)
                yield lambda n: bar.update(task, completed=n)
            return
        with self.status(f"{label} 0/{total}", follow_log=False) as update:
            yield lambda n: update(f"{label} {n}/{total}")


@contextlib.contextmanager
def _following_log(update: Callable[[str], None], enabled: bool) -> Iterator[None]:
    """Send the ``safejit`` logger's INFO lines to ``update`` while the block runs."""
    if not enabled:
        yield
        return
    logger = logging.getLogger("safejit")

    class _Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.INFO:
                with contextlib.suppress(Exception):
                    update(record.getMessage())

    handler = _Handler(logging.INFO)
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def render_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    width: int,
    *,
    right: Collection[int] = (),
    shrink: Collection[int] = (),
    middle: Collection[int] = (),
) -> list[str]:
    """The lines of an aligned table no wider than ``width`` (see :meth:`Out.table`);
    every cell escaped."""
    cells = [[safe(h) for h in headers], *([safe(c) for c in row] for row in rows)]
    ncols = len(headers)
    widths = [max(cell_width(r[i]) for r in cells) for i in range(ncols)]
    movable = [i for i in range(ncols) if not shrink or i in shrink]
    over = sum(widths) + _GAP * (ncols - 1) - width
    while over > 0:
        candidates = [i for i in movable if widths[i] > _MIN_COLUMN]
        if not candidates:
            break
        i = max(candidates, key=lambda c: widths[c])
        others = [widths[c] for c in candidates if c != i]
        # Cut the widest column down to the next widest (or as far as needed).
        step = min(over, widths[i] - _MIN_COLUMN, max(1, widths[i] - max(others, default=0)))
        widths[i] -= step
        over -= step
    lines = []
    for row in cells:
        out = []
        for i, text in enumerate(row):
            fitted = _fit(text, widths[i], middle=i in middle)
            pad = " " * (widths[i] - cell_width(fitted))
            out.append(pad + fitted if i in right else fitted + pad)
        lines.append((" " * _GAP).join(out).rstrip())
    return lines


def _fit(text: str, width: int, *, middle: bool) -> str:
    """``text`` cut to ``width`` columns with ``…`` (at the end, or in the middle)."""
    if cell_width(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    if middle:
        head = _take(text, (width - 1) // 2)
        tail = _take(text[::-1], width - 1 - cell_width(head))[::-1]
        return head + "…" + tail
    return _take(text, width - 1) + "…"


def _take(text: str, width: int) -> str:
    """The longest prefix of ``text`` at most ``width`` columns wide."""
    out, used = [], 0
    for c in text:
        w = cell_width(c)
        if used + w > width:
            break
        out.append(c)
        used += w
    return "".join(out)
