"""docs/observability.md lists every miss reason with the text ``explain`` gives it."""

from __future__ import annotations

import re
from pathlib import Path

from safejit.outcomes import Miss

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


def test_the_reasons_table_is_the_miss_enum():
    text = DOC.read_text()
    head = text.index("<!-- reasons: made from safejit.outcomes.Miss")
    rows = re.findall(r"^\| `([a-z_]+)` \| (.+) \|$", text[head:].split("\n\n", 1)[0], re.MULTILINE)
    assert rows == [(m.value, m.text) for m in Miss]
