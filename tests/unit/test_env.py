"""The environment: one reader (safejit._env), bad values never break the import, unknown
names are said once, and the README's table is the code's."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import safejit
from safejit import _env

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_lists_every_variable_as_the_code_does():
    text = README.read_text()
    found = re.search(r"<!-- variables:[^\n]*-->\n(.*?)<!-- /variables -->", text, re.S)
    assert found is not None, "the README's table of variables is missing its markers"
    assert found.group(1) == _env.table(), "README out of date: regenerate it from safejit._env.table()"


def test_every_variable_has_its_help_and_every_config_field_named_exists():
    names = {*_env.VARIABLES, *_env.OTHER_VARIABLES}
    assert set(_env.HELP) == names
    fields = {f for f, _ in _env.VARIABLES.values()}
    assert fields <= set(safejit.Config.__dataclass_fields__)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SAFEJIT_FAULTS", "nonsense"),
        ("SAFEJIT_MAX_STALENESS_S", "soon"),
        ("SAFEJIT_SANDBOX", "maybe"),
        ("SAFEJIT_REMOTE", "ftp://nowhere"),
        ("SAFEJIT_TRUST_STAT", "perhaps"),
    ],
)
def test_a_bad_variable_never_breaks_import_and_is_named_when_used(name, value):
    code = (
        "import safejit\n"
        "try:\n"
        "    safejit.Runtime().compile(safejit.Source('int k(void){return 1;}', 'k'))\n"
        "except safejit.ConfigError as exc:\n"
        "    print('ConfigError', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEJIT_")}
    env[name] = value
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ConfigError") and name in out.stdout


def test_an_unknown_variable_is_logged_once(caplog, monkeypatch):
    monkeypatch.setenv("SAFEJIT_CACHE_DIR", "/tmp/typo")  # (the real one is SAFEJIT_CACHE_DIRS)
    caplog.set_level(logging.WARNING, logger="safejit.config")
    safejit.Config.from_env()
    safejit.Config.from_env()
    said = [r.getMessage() for r in caplog.records if "SAFEJIT_CACHE_DIR " in r.getMessage()]
    assert len(said) == 1


def test_every_variable_safejit_reads_is_known(monkeypatch, caplog):
    """SAFEJIT_SANDBOX_UID is read (and enforced) where compilers run, yet Config.from_env
    said it was 'not a safejit variable; it is ignored'."""
    source = "\n".join(p.read_text() for p in (Path(safejit.__file__).parent).rglob("*.py"))
    read = set(re.findall(r'"(SAFEJIT_[A-Z0-9_]+)"', source)) - {"SAFEJIT_DEMO_RUN"}  # (a macro the demo defines)
    assert read <= {*_env.VARIABLES, *_env.OTHER_VARIABLES}, read - {*_env.VARIABLES, *_env.OTHER_VARIABLES}
    monkeypatch.setenv("SAFEJIT_SANDBOX_UID", "65534")
    with caplog.at_level(logging.WARNING):
        _env.config_overrides()
    assert not any("SAFEJIT_SANDBOX_UID" in m for m in caplog.messages)


def test_a_bad_fault_spec_is_said_at_exit_without_a_traceback(tmp_path):
    """The usage record written at exit met the bad SAFEJIT_FAULTS too: an atexit
    traceback, as the handler let only CacheError through."""
    code = (
        "import safejit\n"
        "rt = safejit.Runtime()\n"
        "try:\n"
        "    rt.compile(safejit.Source('int f(void) { return 1; }', 'f'))\n"
        "except safejit.ConfigError:\n"
        "    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEJIT_")}
    env.update(SAFEJIT_FAULTS="nonsense", XDG_CACHE_HOME=str(tmp_path), XDG_STATE_HOME=str(tmp_path / "state"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize(
    "name, field", [("SAFEJIT_MEMORY_MAX_BYTES", "memory_max_bytes"), ("SAFEJIT_REMOTE_MAX_BYTES", "remote_max_bytes")]
)
def test_byte_variables_take_sizes_as_cache_max_bytes_does(monkeypatch, name, field):
    """SAFEJIT_CACHE_MAX_BYTES took 10G, the other byte variables refused it."""
    monkeypatch.setenv(name, "1G")
    assert getattr(safejit.Config.from_env(), field) == 1 << 30
    monkeypatch.setenv(name, "4096")
    assert getattr(safejit.Config.from_env(), field) == 4096
