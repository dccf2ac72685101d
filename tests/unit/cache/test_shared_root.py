"""A cache root shared by two users of one group (setgid, umask 002), as docs/security.md
says to set one up: each user's compiles publish there, each hits the other's leaves,
and a hit refreshes a leaf's age whoever made it (prune's least-recently-used order)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GROUP = 65534  # (nogroup: present on the test machines; the users need no passwd entry)
USERS = (65531, 65532)

CHILD = r"""
import json, os, sys, safejit
cache, n = sys.argv[1], int(sys.argv[2])
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,)))
out = []
for i in range(n):
    m = rt.compile(safejit.Source(f"int k(void) {{ return {i}; }}\n", "k"))
    out.append([m.kernel("k")(), str(m.artifact.tier), m.artifact.path])
rt.close()
print(json.dumps(out))
"""


def _as(uid: int, home: Path, *args: str, python: str = "", umask: str = "002") -> subprocess.CompletedProcess[str]:
    home.mkdir(exist_ok=True)
    os.chown(home, uid, GROUP)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    argv = [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={GROUP}",
        "--clear-groups",
        "--",
        "sh",
        "-c",
        f'umask {umask}; exec "$@"',
    ]
    run = [*argv, "sh", python or _PYTHON[0], *args]
    return subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)


#: An interpreter of this Python's version that another user can run (the test's may lie
#: in root's home): found by the fixture.
_PYTHON = [""]


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as two other users")
    for d in (tmp_path, *tmp_path.parents):
        if d == Path("/tmp") or d == Path("/"):
            break
        os.chmod(d, os.stat(d).st_mode | 0o005)  # (the users reach what is below)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = (sys.executable, os.path.realpath(sys.executable), f"/usr/bin/{version}", f"/usr/local/bin/{version}")
    for python in candidates:
        if _as(USERS[0], tmp_path / "h-probe", "-c", "import safejit", python=python).returncode == 0:
            _PYTHON[0] = python
            break
    else:
        pytest.skip(f"another user can run no {version} that imports safejit")
    root = tmp_path / "shared"
    root.mkdir()
    os.chown(root, 0, GROUP)
    os.chmod(root, 0o2775)
    return root


def test_two_users_of_a_group_share_a_root(shared, tmp_path):
    """Every directory was made 0755 whatever the umask: the second user got hits, but
    each compile of its own failed ('no writable cache root', then Permission denied
    on the first user's shard), and its hits never refreshed the leaves' age."""
    a, b = USERS
    first = _as(a, tmp_path / "ha", "-c", CHILD, str(shared), "1")
    assert first.returncode == 0, first.stderr[-2000:]
    ((value, tier, leaf),) = json.loads(first.stdout)
    assert (value, tier) == (0, "compiled")
    os.utime(leaf, (1_000_000_000, 1_000_000_000))  # (long unused)
    second = _as(b, tmp_path / "hb", "-c", CHILD, str(shared), "2")
    assert second.returncode == 0, second.stderr[-2000:]
    got = json.loads(second.stdout)
    assert [(v, t) for v, t, _ in got] == [(0, "disk"), (1, "compiled")]
    assert os.stat(leaf).st_mtime > 1_000_000_000  # b's hit counts for prune's order
    assert os.stat(got[1][2]).st_uid == b


def test_a_member_with_the_usual_umask_leaves_the_root_shared(shared, tmp_path):
    """One member with umask 022 made what it made first 0755: the others' publishes
    under it failed, their hits could not renew its leaves' age, their prunes could not
    remove them. Whatever a member makes in a group-writable root is group-writable."""
    a, b = USERS
    first = _as(a, tmp_path / "ha", "-c", CHILD, str(shared), "1", umask="022")
    assert first.returncode == 0, first.stderr[-2000:]
    ((_, _, leaf),) = json.loads(first.stdout)
    closed = [str(d) for d in shared.rglob("*") if d.is_dir() and not os.stat(d).st_mode & 0o020]
    assert closed == []
    os.utime(leaf, (1_000_000_000, 1_000_000_000))
    second = _as(b, tmp_path / "hb", "-c", CHILD, str(shared), "1")
    assert second.returncode == 0 and json.loads(second.stdout)[0][1] == "disk", second.stderr[-2000:]
    assert os.stat(leaf).st_mtime > 1_000_000_000
    prune = (
        "import sys; from safejit.cache import maintenance; "
        "print(maintenance.prune(sys.argv[1], max_age_s=0, grace_s=0).removed)"
    )
    pruned = _as(b, tmp_path / "hb", "-c", prune, str(shared))
    assert pruned.stdout.strip() == "1" and not os.path.exists(leaf), pruned.stderr[-2000:]


def test_no_directory_of_a_cache_is_writable_by_others_even_with_umask_0(tmp_path):
    """Directories are made 0775 less the umask: with umask 000 (some containers, CI) every
    one of them was writable by anyone (0777)."""
    cache = tmp_path / "cache"
    child = "import json, os, sys, safejit; os.umask(0)\n" + CHILD
    ran = subprocess.run([sys.executable, "-c", child, str(cache), "2"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    writable = [
        str(d) for d in [cache, *cache.rglob("*")] if d.is_dir() and not d.is_symlink() and os.stat(d).st_mode & 0o002
    ]
    assert writable == [] and len(json.loads(ran.stdout)) == 2


@pytest.mark.parametrize(("parent_mode", "umask"), [(0o3770, "077"), (0o2775, "022"), (0o2775, "077")])
def test_a_root_safejit_makes_is_never_forced_open_to_a_group(tmp_path, parent_mode, umask):
    """A cache made (by safejit, at its first compile) in a group's setgid directory — a
    project's scratch dir, sticky or not — was made group-writable whatever the umask, 077
    included: another member rewrote a leaf and the owner's next process ran its code.
    Only a root set up to be shared (by whoever made it) is shared."""
    parent = tmp_path / "proj"
    parent.mkdir()
    os.chmod(parent, parent_mode)
    cache = parent / "mine"
    child = f"import os; os.umask(0o{umask})\n" + CHILD
    ran = subprocess.run([sys.executable, "-c", child, str(cache), "1"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    closed = 0o070 if umask == "077" else 0o020
    opened = [str(d) for d in [cache, *cache.rglob("*")] if d.is_dir() and os.stat(d).st_mode & closed]
    assert opened == []
    if umask == "077":  # (nor a file: its lock files were made 0644 to be the group's)
        files = [f for f in cache.rglob("*") if f.is_file() and not f.is_symlink()]
        assert files and [str(f) for f in files if os.stat(f).st_mode & 0o077] == []


def test_a_member_with_umask_077_leaves_the_root_shared(shared, tmp_path):
    """One member with umask 077 made the shared tree's dirs (``v1``, a shard, a build
    key's) 0700 and its leaves' files 0600: every compile of the others failed for good
    under them ('no writable cache root', Permission denied publishing), and its lock
    files, which they could not open, were set aside (two holders of one key). In a root
    set up to be shared, what a member makes is the group's whatever its umask."""
    a, b = USERS
    first = _as(a, tmp_path / "ha", "-c", CHILD, str(shared), "1", umask="077")
    assert first.returncode == 0, first.stderr[-2000:]
    ((_, _, leaf),) = json.loads(first.stdout)
    work = shared / "v1" / "tmp"  # (each process's work dirs stay its own: 0700)
    closed = [
        str(d)
        for d in [shared, *shared.rglob("*")]
        if d.is_dir() and work not in d.parents and os.stat(d).st_mode & 0o070 != 0o070
    ]
    assert closed == []
    unreadable = [str(f) for f in Path(leaf).iterdir() if os.stat(f).st_mode & 0o044 != 0o044]
    locks = [str(f) for f in (shared / "v1" / "locks").rglob("*.lock") if os.stat(f).st_mode & 0o044 != 0o044]
    assert unreadable == [] and locks == []
    second = _as(b, tmp_path / "hb", "-c", CHILD, str(shared), "2")
    assert second.returncode == 0, second.stderr[-2000:]
    assert [(v, t) for v, t, _ in json.loads(second.stdout)] == [(0, "disk"), (1, "compiled")]
    assert not list((shared / "v1").rglob("quarantine/*")), "a lock file was set aside"


def test_verify_fix_keeps_another_users_usage_record_it_cannot_read(shared, tmp_path):
    """``safejit verify --fix`` removed a record it could not read as damaged: another
    member's, made 0600 (under umask 077, before records in a shared root were made the
    group's), is reported and kept."""
    a, b = USERS
    first = _as(a, tmp_path / "ha", "-c", CHILD, str(shared), "1", umask="077")
    assert first.returncode == 0, first.stderr[-2000:]
    (record,) = (shared / "v1" / "usage").rglob("*.json")
    os.chmod(record, 0o600)
    fix = "import sys; from safejit.cli import main; sys.exit(main(sys.argv[1:]))"
    ran = _as(b, tmp_path / "hb", "-c", fix, "verify", "--fix", "--cache-dir", str(shared))
    assert "cannot be read" in ran.stdout + ran.stderr, ran
    assert record.exists()
