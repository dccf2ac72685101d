"""Text from the cache or the filesystem, made safe to show on a terminal.

A shared cache is written by others: a tenant, a backend or a file name, a kernel
name or a dependency path in a manifest can hold escape sequences (CSI/OSC: move
the cursor, rewrite the title, plant a hyperlink, "type" into some terminals),
bidi overrides that reorder what is shown, or newlines that forge a line of
output. Every such string goes through :func:`safe` before it is printed: each
character Python does not count as printable (C0 and C1 controls, DEL, format
characters such as U+202E, line and paragraph separators, surrogates, unassigned
code points) is shown as a Python-style escape, and a backslash as ``\\\\``, so
the text shown is unambiguous. Bytes that were not UTF-8 (decoded by
``os.fsdecode`` as surrogates U+DC80..U+DCFF) are shown as the byte, ``\\xff``.

>>> safe("ok\\x1b]0;pwned\\x07 \\u202e")
'ok\\\\x1b]0;pwned\\\\x07 \\\\u202e'
"""

from __future__ import annotations

import unicodedata

__all__ = ["cell_width", "safe"]


def safe(value: object) -> str:
    """``str(value)`` with every non-printable character escaped (see the module)."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escape(c) for c in text)


def _escape(c: str) -> str:
    if c == "\\":
        return "\\\\"
    if c.isprintable():
        return c
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def cell_width(text: str) -> int:
    """Columns ``text`` takes on a terminal (wide East Asian characters take two,
    combining marks none); ``text`` is already :func:`safe`."""
    if text.isascii():
        return len(text)
    width = 0
    for c in text:
        if unicodedata.combining(c):
            continue
        width += 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
    return width
