"""Every ```python block of README.md and docs/*.md runs, so the docs cannot rot.

Each block runs in a fresh interpreter (``sys.executable -W error``) in an empty
directory, with HOME and the XDG cache, state and config dirs inside its own temporary
directory, and a timeout. What the doc's source says about a block, in an HTML comment
on the line right above its fence (several separated by ``;``):

- ``<!-- docs-test: continue -->``: the block goes on from the one before it: it runs
  after the blocks before it (back to the first not so marked), as one script.
- ``<!-- docs-test: needs gpu -->`` (``npu``, ``cann``, ``python:MODULE``): skipped,
  saying so, where that is missing. ``needs cann, else raises ConfigError: TEXT``: where
  it is missing the block still runs, and must end in that safejit error (TEXT in its
  message).
- ``<!-- docs-test: skip: WHY -->``: not run; WHY is the skip's reason.

A ```text block right after a block (blank lines between at most) is what it prints,
compared as doctest compares (``...`` matches anything, whitespace runs are one space).
What a test machine must stand in for is substituted (:data:`SUBSTITUTE`): the Redis
host of docs/remote.md is a Valkey started here, whose users are made by the doc's own
``ACL SETUSER`` lines, and docs/observability.md's Prometheus port is a free port.
"""

from __future__ import annotations

import doctest
import functools
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from safejit.cache.remote.redis import FUNCTIONS
from tests.remote._servers import Valkey, free_port, start_valkey

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")))
TIMEOUT_S = 120

_FENCE = re.compile(r"(`{3,})([\w+-]*)\s*\Z")
_DIRECTIVE = re.compile(r"<!--\s*docs-test:(.*?)-->\s*\Z")
_CAPABILITIES = ("gpu", "npu", "cann")

#: What a doc's blocks name that a test machine stands in for: {doc: {text: what replaces it}}.
SUBSTITUTE: dict[str, dict[str, str]] = {
    "docs/remote.md": {"cache.internal:6379": "valkey"},
    "docs/observability.md": {"9464": "free port"},
}


@dataclass(frozen=True)
class Need:
    what: str
    #: ``(error class name, text in its message)`` the block must end in where ``what`` is missing.
    else_raises: tuple[str, str] | None = None


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # of the opening fence, 1-based
    code: str
    output: str | None = None  # the ```text block right after it
    follows: bool = False  # ``continue``
    needs: tuple[Need, ...] = ()
    skip: str | None = None

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass(frozen=True)
class Fenced:
    lang: str
    line: int
    body: str
    directive: str | None
    #: Only blank lines lie between this fence and the block before it.
    blank_before: bool


def _fenced(text: str) -> list[Fenced]:
    lines = text.splitlines()
    found: list[Fenced] = []
    i = 0
    last_end = -1
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        ticks, lang = m.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == ticks), None)
        if end is None:
            raise ValueError(f"line {i + 1}: a fence that is never closed")
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        d = _DIRECTIVE.match(before)
        blank = last_end >= 0 and all(not lines[j].strip() for j in range(last_end + 1, i))
        found.append(Fenced(lang, i + 1, "\n".join(lines[i + 1 : end]) + "\n", d and d.group(1).strip(), blank))
        last_end = end
        i = end + 1
    return found


def _parse_directive(text: str, where: str) -> tuple[bool, tuple[Need, ...], str | None]:
    follows, needs, skip = False, [], None
    for part in (p.strip() for p in text.split(";")):
        if part == "continue":
            follows = True
        elif part.startswith("skip:") and part[5:].strip():
            skip = part[5:].strip()
        elif m := re.fullmatch(r"needs ([\w.:]+)(?:, else raises (\w+)(?:: (.+))?)?", part):
            what, error, message = m.groups()
            if what not in _CAPABILITIES and not what.startswith("python:"):
                raise ValueError(f"{where}: unknown capability {what!r} in docs-test directive")
            needs.append(Need(what, (error, message or "") if error else None))
        else:
            raise ValueError(f"{where}: docs-test directive {part!r} is not continue, needs X, or skip: WHY")
    return follows, tuple(needs), skip


def blocks(doc: str) -> list[Block]:
    """The ```python blocks of ``doc``, with what its source says about each."""
    found = _fenced((REPO / doc).read_text())
    out: list[Block] = []
    for k, f in enumerate(found):
        if f.directive is not None and f.lang != "python":
            raise ValueError(f"{doc}:{f.line}: a docs-test directive above a {f.lang or 'plain'} block")
        if f.lang != "python":
            continue
        after = found[k + 1] if k + 1 < len(found) else None
        output = after.body if after is not None and after.lang == "text" and after.blank_before else None
        follows, needs, skip = _parse_directive(f.directive, f"{doc}:{f.line}") if f.directive else (False, (), None)
        if follows and not out:
            raise ValueError(f"{doc}:{f.line}: 'continue' on the doc's first python block")
        out.append(Block(doc, f.line, f.body, output, follows, needs, skip))
    return out


def chains() -> Iterator[tuple[Block, ...]]:
    """One chain per block: the block, after those it continues."""
    for doc in DOCS:
        found = blocks(doc)
        for k in range(len(found)):
            start = k
            while found[start].follows:
                start -= 1
            yield tuple(found[start : k + 1])


@functools.cache
def has(what: str) -> bool:
    if what == "gpu":
        from safejit.backends.cuda.launch import has_cuda_device

        return bool(has_cuda_device())
    if what == "npu":
        return importlib.util.find_spec("torch_npu") is not None and importlib.util.find_spec("acl") is not None
    if what == "cann":
        from safejit import _env
        from safejit.backends.ascend.backend import find_toolkit
        from safejit.errors import ConfigError

        try:
            find_toolkit(("/usr/local/Ascend/ascend-toolkit/latest", *_env.ascend_home_candidates()))
        except ConfigError:
            return False
        return True
    try:
        return importlib.util.find_spec(what.removeprefix("python:")) is not None
    except ModuleNotFoundError:  # (a parent package is missing)
        return False


# -- fixtures: what the docs' hosts stand for ---------------------------------------


@pytest.fixture(scope="session")
def docs_valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Valkey]:
    server = start_valkey(tmp_path_factory.mktemp("docs-valkey"))
    yield server
    server.stop()


def acl_lines() -> list[str]:
    """docs/remote.md's recipe: its ``ACL SETUSER`` lines, as written (passwords included)."""
    text = (REPO / "docs" / "remote.md").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("ACL SETUSER ")]
    assert len(lines) == 3, lines
    return lines


def substitutions(doc: str, request: pytest.FixtureRequest) -> dict[str, str]:
    out = {}
    for text, kind in SUBSTITUTE.get(doc, {}).items():
        out[text] = _valkey_with_doc_users(request) if kind == "valkey" else str(free_port())
    return out


def _valkey_with_doc_users(request: pytest.FixtureRequest) -> str:
    """The session's Valkey, emptied, with the users of the doc's recipe; its address."""
    valkey: Valkey = request.getfixturevalue("docs_valkey")
    admin = valkey.admin()
    admin.flushall()  # (leaves are write-once: a block sees its own, never one from before)
    admin.function_flush()
    for user in admin.acl_users():
        if user != "default":
            admin.acl_deluser(user)
    for line in acl_lines():
        admin.execute_command(*shlex.split(line))
    # The recipe's admin step (a valkey-cli line there): the functions writers may call.
    assert "admin.function_load(library, replace=True)" in (REPO / "docs" / "remote.md").read_text()
    for library in FUNCTIONS:
        admin.function_load(library, replace=True)
    return f"127.0.0.1:{valkey.port}"


# -- the tests ------------------------------------------------------------------------


def _expected_error(chain: tuple[Block, ...]) -> tuple[str, str] | None:
    """Skip the chain when something it needs is missing here; or the error its last
    block must end in instead."""
    for block in chain:
        if block.skip:
            pytest.skip(f"{block.where}: {block.skip}")
    missing = [(block, need) for block in chain for need in block.needs if not has(need.what)]
    if not missing:
        return None
    if all(block is chain[-1] and need.else_raises for block, need in missing):
        return missing[0][1].else_raises
    what = ", ".join(dict.fromkeys(need.what.removeprefix("python:") for _, need in missing))
    pytest.skip(f"{chain[-1].where}: needs {what}, missing here")


def _run(chain: tuple[Block, ...], tmp_path: Path, subs: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = ""
    for block in chain:  # each at its own line of the doc: a traceback's line numbers are the doc's
        code += "\n" * (block.line - code.count("\n")) + block.code
    for text, value in subs.items():
        code = code.replace(text, value)
    script = tmp_path / "script" / Path(chain[-1].doc).name.replace(".md", "_md.py")
    script.parent.mkdir()
    script.write_text(code)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEJIT_")}
    env.update(
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        XDG_CONFIG_HOME=str(home / ".config"),
        PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
    )
    try:
        return subprocess.run(
            [sys.executable, "-W", "error", str(script)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{chain[-1].where}: still running after {TIMEOUT_S} s\n{exc.stdout}\n{exc.stderr}")


@pytest.mark.parametrize("chain", [pytest.param(c, id=c[-1].where) for c in chains()])
def test_example_runs(chain: tuple[Block, ...], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    error = _expected_error(chain)
    done = _run(chain, tmp_path, substitutions(chain[-1].doc, request))
    where = chain[-1].where
    said = f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    if error is None:
        assert done.returncode == 0, f"{where}: exit {done.returncode}\n{said}"
    else:
        name, text = error
        last = done.stderr.rstrip().rpartition("\n")[2]
        m = re.match(r"(safejit\.[\w.]+): (.*)", last)
        assert done.returncode != 0 and m is not None, f"{where}: expected {name}\n{said}"
        assert m.group(1).rpartition(".")[2] == name and text in m.group(2), f"{where}: expected {name}\n{said}"
    outputs = [block.output for block in chain if block.output is not None]
    if outputs:
        checker = doctest.OutputChecker()
        want = "".join(outputs)
        flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        assert checker.check_output(want, done.stdout, flags), f"{where}: printed\n{done.stdout}\nnot\n{want}"


# -- the rules above hold: a block cannot slip out of the test -------------------------


def test_every_python_fence_is_collected():
    for doc in DOCS:
        text = (REPO / doc).read_text()
        fences = re.findall(r"^[ \t]*```python", text, flags=re.MULTILINE)
        assert len(fences) == len(blocks(doc)), f"{doc}: an indented ```python fence is not collected"
    assert sum(len(blocks(doc)) for doc in DOCS) >= 10


def test_every_directive_sits_above_a_python_block():
    for doc in DOCS:
        text = (REPO / doc).read_text()
        directives = len(re.findall(r"<!--\s*docs-test:", text))
        assert directives == sum(1 for f in _fenced(text) if f.directive is not None), doc


def test_each_substitution_is_in_its_docs_blocks():
    for doc, texts in SUBSTITUTE.items():
        code = "".join(block.code for block in blocks(doc))
        for text in texts:
            assert text in code, f"{doc} no longer names {text!r}: drop it from SUBSTITUTE"
