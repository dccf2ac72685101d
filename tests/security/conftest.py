"""Fixtures for the security tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security._support import SECRET_HEADER, SECRET_TOKEN


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside every declared root holding ``secret.h`` and ``secret``."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.h").write_text(SECRET_HEADER)
    (path / "secret").write_text(f"{SECRET_TOKEN}\n")
    return path


@pytest.fixture(autouse=True)
def _no_secret_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Whatever a test provokes, the outside secret never reaches a log record."""
    caplog.set_level(logging.DEBUG)
    yield
    leaked = [r.getMessage() for r in caplog.records if SECRET_TOKEN in r.getMessage()]
    assert leaked == []
