"""The private state directory (``sandbox.statedir``) in the lives of processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_FORKED = r"""
import json, os, sys
import safejit
tmp = sys.argv[1]
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(os.path.join(tmp, "cache"),)))
rt.compile(safejit.Source("int a(int x) { return x; }", "a"))
from safejit.sandbox.statedir import state_dir
state = state_dir().shown
pid = os.fork()
if pid == 0:
    sys.exit(0)  # (a worker that ends as workers do: its exit hooks run)
os.waitpid(pid, 0)
there = os.path.isdir(state)
rt.compile(safejit.Source("int b(int x) { return x + 1; }", "b"))
stats = rt.stats()
rt.close()
print(json.dumps({"temporary": state.startswith(tmp), "there": there, "published": stats["published"]}))
"""


def _no_state_dir(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A temporary dir, and an environment in which no state dir can be kept (a container:
    HOME unwritable, no XDG dirs): a process then uses a temporary one, made there."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SAFEJIT_", "XDG_"))},
        "HOME": str(blocked / "home"),
        "XDG_STATE_HOME": str(blocked / "state"),
        "XDG_RUNTIME_DIR": str(blocked / "run"),
        "TMPDIR": str(tmp),
    }
    return tmp, env


def test_a_forked_child_leaves_its_parents_temporary_state_dir(tmp_path):
    """With no state dir to keep (a container: HOME unwritable, no XDG dirs), the process
    uses a temporary one, removed at exit. A forked child's normal exit removed its
    parent's: the parent's later compiles were not cached (no lookup recorder)."""
    tmp, env = _no_state_dir(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", _FORKED, str(tmp)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == {"temporary": True, "there": True, "published": 2}, out.stderr
    assert not any(p.name.startswith("safejit-state-") for p in Path(tmp).iterdir())  # (the parent's exit: gone)


_HANDLER_STARTS_A_RUNTIME = r"""
import faulthandler, logging, os, sys
import safejit
tmp = sys.argv[1]
heard = []

class Starts(logging.Handler):
    def emit(self, record):
        if heard:
            return
        heard.append(record.getMessage())
        other = safejit.Runtime(config=safejit.Config(cache_dirs=(os.path.join(tmp, "other"),)))
        heard.append(other.compile(safejit.Source("int g(void) { return 7; }", "g")).kernel("g")())

logging.getLogger("safejit").addHandler(Starts(level=logging.WARNING))
faulthandler.dump_traceback_later(60, exit=True)
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(os.path.join(tmp, "cache"),)))
print(rt.compile(safejit.Source("int a(int x) { return x; }", "a")).kernel("a")(5), heard[1:])
"""


def test_what_finding_the_state_dir_says_is_said_once_it_lets_go(tmp_path):
    """The warning that no state dir can be kept was logged while the module's lock was
    held: a handler that started a Runtime (a plugin's own) waited on it for good."""
    tmp, env = _no_state_dir(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", _HANDLER_STARTS_A_RUNTIME, str(tmp)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["5", "[7]"], out.stdout
