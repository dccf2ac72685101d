"""prune, gc, warm/inventory and the CLI around them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import safejit
from safejit._proc import claimed
from safejit.cache import fsio, maintenance
from safejit.cache.leaf import Rejection
from safejit.cache.staging import Staging
from safejit.cli import parse_age, parse_size
from safejit.inventory import read_inventory
from safejit.outcomes import Miss
from tests.conftest import assert_cache_sound, leaves, settle


def _fill(cache_dir: Path, n: int) -> list[maintenance.LeafInfo]:
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache_dir),)))
    for i in range(n):
        rt.build(safejit.Source(f"int k(void) {{ return {i}; }}\n", "k"))
    rt.close()
    return sorted(leaves(cache_dir), key=lambda i: i.mtime)


def _age(path: str, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_prune_by_age_spares_recent_leaves(cache_dir):
    infos = _fill(cache_dir, 3)
    _age(infos[0].path, 3 * 86400)
    report = maintenance.prune(str(cache_dir), max_age_s=86400)
    assert (report.examined, report.removed) == (3, 1)
    assert {i.path for i in leaves(cache_dir)} == {i.path for i in infos[1:]}
    assert_cache_sound(cache_dir)


def test_prune_by_size_is_lru_and_respects_the_grace_period(cache_dir):
    infos = _fill(cache_dir, 4)
    for n, info in enumerate(infos):
        _age(info.path, 1000 - n * 100)  # infos[0] is the least recently used
    report = maintenance.prune(str(cache_dir), max_bytes=sum(i.size for i in infos[2:]), grace_s=60)
    assert report.removed == 2
    assert {i.path for i in leaves(cache_dir)} == {i.path for i in infos[2:]}
    fresh = _fill(cache_dir, 1)  # just touched
    report = maintenance.prune(str(cache_dir), max_bytes=0, grace_s=60)
    assert fresh[-1].path in {i.path for i in leaves(cache_dir)}
    assert report.kept_recent >= 1
    assert_cache_sound(cache_dir)


def test_a_leaf_published_from_a_spare_made_long_before_is_as_new_as_its_publish(cache_dir):
    """Spare work dirs are made ahead, after the previous compile; a leaf's age is its
    directory's mtime. Published from a spare made ten minutes before, a leaf looked that
    old: prune within its grace period removed it, and keep-per-build kept an older one."""
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache_dir),)))
    try:
        rt.build(safejit.Source("int a(void) { return 1; }\n", "a"))
        settle()  # (the spares made after it)
        spares = [r for r, _, _ in os.walk(cache_dir / "v1" / "tmp") if os.path.basename(r) == "leaf"]
        assert spares
        for stage in spares:
            _age(stage, 600)
        started = time.time()
        path = rt.build(safejit.Source("int b(void) { return 2; }\n", "b")).path
    finally:
        rt.close()
    assert os.lstat(path).st_mtime >= started - 1
    report = maintenance.prune(str(cache_dir), max_age_s=300, grace_s=60)
    assert report.removed == 0 and os.path.isdir(path)


def test_prune_keep_per_build(make_runtime, project, cache_dir):
    rt = make_runtime(source_roots=(str(project),))
    src, inc = safejit.Source('#include "value.h"\nint v(void) { return VALUE; }\n', "v"), (str(project / "include"),)
    for value in (1, 2, 3):
        (project / "include" / "inner.h").write_text(f"#define INNER {value}\n")
        settle()
        rt.build(src, include_dirs=inc)
    infos = sorted(leaves(cache_dir), key=lambda i: i.mtime)
    assert len(infos) == 3 and len({i.build_key for i in infos}) == 1
    for n, info in enumerate(infos):
        _age(info.path, 1000 - n)
    maintenance.prune(str(cache_dir), keep_per_build=1)
    assert [i.path for i in leaves(cache_dir)] == [infos[-1].path]


def test_prune_never_follows_symlinks(cache_dir, tmp_path):
    infos = _fill(cache_dir, 1)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    build = Path(infos[0].path).parent
    os.symlink(victim, build / ("deps-" + "0" * 64))
    _age(infos[0].path, 10 * 86400)
    maintenance.prune(str(cache_dir), max_age_s=1, max_bytes=0, grace_s=0)
    assert (victim / "keep.txt").read_text() == "precious"


def test_gc_removes_old_residue_only(cache_dir):
    _fill(cache_dir, 1)
    base = cache_dir / "v1"
    old_stage, new_stage = base / "tmp" / "old", base / "tmp" / "new"
    old_stage.mkdir()
    (old_stage / "partial").write_text("x")
    new_stage.mkdir()
    quarantined = base / "quarantine" / "q1"
    quarantined.mkdir(parents=True)
    for path in (old_stage, quarantined):
        _age(str(path), 2 * 86400)
    counts = maintenance.gc(str(cache_dir), max_age_s=86400)
    assert counts["staging"] == 1 and counts["quarantine"] == 1
    assert not old_stage.exists() and new_stage.exists() and not quarantined.exists()
    assert len(leaves(cache_dir)) == 1


def test_gc_at_age_0_leaves_a_usage_writers_temporary_and_takes_a_dead_ones(cache_dir):
    """A usage record is written to ``.<name>.tmp`` and renamed: gc at ``--older-than 0``
    unlinked a live writer's temporary between the two, and that Runtime's close failed
    ('writing the usage record failed'). One a dead writer left is taken past a grace."""
    _fill(cache_dir, 1)
    (records,) = (cache_dir / "v1" / "usage").iterdir()
    live, dead = records / ".live-1.json.tmp", records / ".dead-1.json.tmp"
    live.write_bytes(b"{}")
    dead.write_bytes(b"{}")
    _age(str(dead), maintenance.TEMP_GRACE_S + 5)
    counts = maintenance.gc(str(cache_dir), max_age_s=0)
    assert live.exists() and not dead.exists() and counts["usage"] >= 1


def test_gc_goes_on_past_a_lock_file_it_may_not_remove(cache_dir, monkeypatch):
    """A lock file gc could open but not unlink (another user's, in a shared root) ended
    the whole gc ('error: Permission denied'): nothing after the locks was done, at every
    run. It is left for next time, and the rest is done."""
    _fill(cache_dir, 1)
    (lock,) = (cache_dir / "v1" / "locks").rglob("*.lock")
    obsolete = cache_dir / "v1" / "tools"  # (removed after the locks)
    obsolete.mkdir()
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    counts = maintenance.gc(str(cache_dir), max_age_s=0)
    assert lock.exists() and counts["locks"] == 0
    assert not obsolete.exists() and counts["obsolete"] == 1


def test_a_publish_makes_its_build_dir_again_however_often_gc_removes_it(project, cache_dir, monkeypatch):
    """A gc at age 0 in a loop removed the empty build dir of a publish under way twice;
    the publish made it again once, then failed (a CacheError out of compile)."""
    from safejit.cache import disk

    real_rename = disk.rename
    removed = []

    def rename(src, dst):
        if len(removed) < 3:  # (gc, between the build dir's making and the rename)
            build = os.path.dirname(dst)
            with contextlib.suppress(OSError):
                os.rmdir(build)
                removed.append(build)
        return real_rename(src, dst)

    monkeypatch.setattr(disk, "rename", rename)
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache_dir),), source_roots=(str(project),)))
    mod = rt.compile(safejit.Source("int k(void) { return 7; }\n", "k"))
    assert mod.kernel("k")() == 7 and len(removed) == 3
    assert rt.stats()["published"] == 1
    rt.close()


def test_inventory_records_and_warm_rebuilds_elsewhere(project, tmp_path):
    (project / "kernel.c").write_text('#include "value.h"\nint value(void) { return VALUE + V; }\n')
    inventory = tmp_path / "inventory.jsonl"
    first = safejit.Runtime(
        config=safejit.Config(
            cache_dirs=(str(tmp_path / "c1"),), source_roots=(str(project),), inventory=str(inventory)
        )
    )
    for v in (1, 2, 2):
        first.compile(first.source(project / "kernel.c"), include_dirs=(str(project / "include"),), defines={"V": v})
    first.close()
    lines = inventory.read_text().splitlines()
    assert len(lines) == 2 and all(str(project) not in line for line in lines)  # anchored, portable
    clone = tmp_path / "clone"
    import shutil

    shutil.copytree(project, clone)
    cache2 = tmp_path / "c2"
    env = {**os.environ, "SAFEJIT_SOURCE_ROOTS": str(clone)}
    cmd = [sys.executable, "-m", "safejit", "warm", str(inventory), "-j", "2", "--cache-dir", str(cache2)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 requests: built 2" in out.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert "2 requests: hit 2" in again.stdout
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache2),), source_roots=(str(clone),)))
    mod = rt.compile(rt.source(clone / "kernel.c"), include_dirs=(str(clone / "include"),), defines={"V": 2})
    assert mod.kernel("value")() == 44 and rt.stats()["compiles"] == 0
    rt.close()
    assert json.loads(lines[0])["include_dirs"] == [["s0", "include"]]


@pytest.mark.parametrize(("text", "value"), [("10", 10), ("2k", 2048), ("1.5M", 1572864), ("3G", 3 << 30)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize(("text", "value"), [("30", 30), ("2m", 120), ("1h", 3600), ("7d", 604800)])
def test_parse_age(text, value):
    assert parse_age(text) == value


def test_cli_prune_gc_explain_inspect(project, cache_dir):
    (project / "kernel.c").write_text('#include "value.h"\nint value(void) { return VALUE; }\n')
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache_dir),), source_roots=(str(project),)))
    art = rt.build(rt.source(project / "kernel.c"), include_dirs=(str(project / "include"),))
    rt.close()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "safejit", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
            timeout=120,
        )

    hit = cli(
        "explain",
        str(project / "kernel.c"),
        "-I",
        str(project / "include"),
        "--source-root",
        str(project),
        "--cache-dir",
        str(cache_dir),
    )
    assert hit.returncode == 0 and "hit" in hit.stdout
    (project / "include" / "inner.h").write_text("#define INNER 0\n")
    miss = cli(
        "explain",
        str(project / "kernel.c"),
        "-I",
        str(project / "include"),
        "--source-root",
        str(project),
        "--cache-dir",
        str(cache_dir),
    )
    assert miss.returncode == 1 and "a dependency changed" in miss.stdout and "inner.h" in miss.stdout
    shown = cli("inspect", art.path)
    assert shown.returncode == 0 and art.build_key in shown.stdout and "include/inner.h" in shown.stdout
    assert cli("gc", "--cache-dir", str(cache_dir)).returncode == 0
    assert cli("prune", "--cache-dir", str(cache_dir)).returncode == 2  # nothing asked
    pruned = cli("prune", "--max-bytes", "0", "--grace", "0", "--cache-dir", str(cache_dir))
    assert pruned.returncode == 0 and leaves(cache_dir) == []


def test_gc_never_removes_a_work_dir_whose_process_lives_however_old(cache_dir, tmp_path):
    """A work dir's mtime is set when a compile takes it: a compile longer than
    ``gc --older-than`` had its work dir removed under it (the compile failed). Work dirs
    are named by their process's owner token now: gc leaves a living one's alone, and
    removes an ended one's at once."""
    marks = tmp_path / "state"  # (the user's private state dir, where a process keeps its mark)
    marks.mkdir(mode=0o700)
    argv = [sys.executable, "-c", _WORKDIR_HOLDER, str(cache_dir), str(marks)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        live = Path(child.stdout.readline().strip())
        assert live.is_dir() and live.parent == cache_dir / "v1" / "tmp"
        _age(str(live), 10 * 86400)
        counts = maintenance.gc(str(cache_dir), max_age_s=0, marks=str(marks))
        assert live.is_dir() and (live / "partial").exists(), counts
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    counts = maintenance.gc(str(cache_dir), max_age_s=86400, marks=str(marks))  # (young; its process ended)
    assert not live.exists() and counts["staging"] >= 1
    assert os.listdir(marks) == []  # (its mark, left by a killed process, too)


_WORKDIR_HOLDER = r"""
import os, sys, time
from safejit.cache.staging import Staging
os.makedirs(sys.argv[1] + "/v1/tmp", exist_ok=True)
stage = Staging("artifact.so", marks=sys.argv[2]).new_stage(sys.argv[1])
open(stage + "/partial", "w").write("x")
print(stage, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("made_by", ["workdir", "new_stage"])
def test_gc_run_elsewhere_never_removes_a_work_dir_a_compile_uses(cache_dir, tmp_path, made_by):
    """gc run by another user, HOME or node cannot see a compiling process's mark (it is
    kept in that user's private state dir): it judged the work dir by its age, and
    removed a live compile's after ``--older-than``. A work dir in use is locked itself
    now: gc, wherever it runs, leaves it alone, and removes it once its process ended."""
    theirs, ours = tmp_path / "their-state", tmp_path / "our-state"
    for marks in (theirs, ours):
        marks.mkdir(mode=0o700)
    argv = [sys.executable, "-c", _WORKDIR_USER, str(cache_dir), str(theirs), made_by]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        live = Path(child.stdout.readline().strip())
        assert live.is_dir() and live.parent == cache_dir / "v1" / "tmp"
        _age(str(live), 10 * 86400)
        for marks in (str(ours), None):
            counts = maintenance.gc(str(cache_dir), max_age_s=0, marks=marks)
            assert live.is_dir() and (live / "partial").exists(), counts
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    counts = maintenance.gc(str(cache_dir), max_age_s=0, marks=str(ours))  # (its process ended: unlocked)
    assert not live.exists() and counts["staging"] >= 1


def test_a_spare_gc_is_removing_is_never_handed_to_a_compile(cache_dir):
    """A spare made ahead is not locked until a compile takes it: one that a gc run
    elsewhere holds (about to remove it) is passed over, and one it removed is too."""
    staging = Staging("artifact.so", marks=None)
    base = str(cache_dir / "v1" / "tmp")
    os.makedirs(base)
    try:
        staging.workdir(str(cache_dir))  # (the first: made now; the next two made ahead)
        staging._spares.refill(base)
        settle()
        spares = [wd.path for _, wd in staging._spares._ready[base]]
        assert len(spares) == 2
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with claimed(fd, os.path.basename(spares[1])) as free:
                assert free
                taken = staging.workdir(str(cache_dir))
            assert taken.path == spares[0]  # (the held one, next in line, passed over)
        finally:
            os.close(fd)
        fd = os.open(taken.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with claimed(fd, ".") as free:
                assert not free  # (taken: in use)
        finally:
            os.close(fd)
    finally:
        staging.close()


_WORKDIR_USER = r"""
import os, sys, time
from safejit.cache.staging import Staging
os.makedirs(sys.argv[1] + "/v1/tmp", exist_ok=True)
staging = Staging("artifact.so", marks=sys.argv[2])
path = staging.workdir(sys.argv[1]).path if sys.argv[3] == "workdir" else staging.new_stage(sys.argv[1])
open(path + "/partial", "w").write("x")  # (a compile's, or a remote hit's backfill, under way)
print(path, flush=True)
time.sleep(60)
"""


def test_gc_removes_a_tree_deeper_than_the_recursion_limit(cache_dir):
    """rmtree recursed (Python 3.11): a 3,000-deep tree planted in tmp/ made every gc end
    in RecursionError before the rest of its work, and so would a compiler's scratch."""
    _fill(cache_dir, 1)
    deep = cache_dir / "v1" / "tmp" / "deep"
    fd = os.open(cache_dir / "v1" / "tmp", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.mkdir("deep", dir_fd=fd)
        for _ in range(3000):
            nxt = os.open("deep", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
            os.mkdir("deep", dir_fd=fd)
        os.close(os.open("leaf.txt", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    _age(str(deep), 2 * 86400)
    try:
        counts = maintenance.gc(str(cache_dir), max_age_s=86400)
        assert counts["staging"] == 1 and not deep.exists()
        assert len(leaves(cache_dir)) == 1
    finally:  # (pytest's own clean-up of old temporary dirs recurses too)
        tmp = os.open(deep.parent, os.O_RDONLY | os.O_DIRECTORY)
        with contextlib.suppress(FileNotFoundError):
            fsio._rmtree_deep(tmp, "deep")
        os.close(tmp)


def _deep_tree(parent: Path, depth: int) -> None:
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.mkdir("deep", dir_fd=fd)
        for _ in range(depth):
            nxt = os.open("deep", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
            os.mkdir("deep", dir_fd=fd)
    finally:
        os.close(fd)


REMOVE_UNDER_A_LIMIT = r"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from safejit.cache import fsio
top = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fsio.rmtree_at(top, "deep")
print(os.listdir(sys.argv[1]))
"""


def test_a_deep_tree_is_removed_under_a_low_descriptor_limit(tmp_path):
    """From Python 3.13 rmtree no longer recurses: it holds a descriptor per level, and a
    tree deeper than the process's descriptor limit failed with EMFILE, nothing removed
    (a planted one stopped every gc, prune and staging clean-up). Either way it ends in
    the removal one directory at a time."""
    _deep_tree(tmp_path, 3000)
    try:
        ran = subprocess.run(
            [sys.executable, "-c", REMOVE_UNDER_A_LIMIT, str(tmp_path)], capture_output=True, text=True, timeout=120
        )
        assert ran.returncode == 0 and ran.stdout.strip() == "[]", ran.stderr[-2000:]
    finally:  # (pytest's own clean-up of old temporary dirs recurses: none is left for it)
        _remove_deep(tmp_path)


def _remove_deep(parent: Path) -> None:
    top = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    with contextlib.suppress(FileNotFoundError):
        fsio._rmtree_deep(top, "deep")
    os.close(top)


def test_rmtree_running_out_of_descriptors_goes_on_one_directory_at_a_time(tmp_path, monkeypatch):
    """The same on every Python: rmtree failing with EMFILE part way (3.13) is taken over."""
    import errno

    _deep_tree(tmp_path, 50)

    def out_of_descriptors(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(fsio.shutil, "rmtree", out_of_descriptors)
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsio.rmtree_at(top, "deep")
    finally:
        os.close(top)
    assert os.listdir(tmp_path) == []


def test_a_sparse_file_in_one_leaf_cannot_make_prune_remove_the_others(cache_dir):
    """A writer of a shared root adds a sparse 1 TiB file to its own (newest) leaf: it
    counted at its length, so 'prune --max-bytes' removed every other leaf to make room;
    and verify said nothing of it. A file counts at what it takes on disk now, and verify
    finds the foreign entry (--fix sets that leaf aside)."""
    victims = _fill(cache_dir, 3)
    for info in victims:
        _age(info.path, 3600)
    (attacker,) = [i for i in _fill(cache_dir, 4) if i.path not in {v.path for v in victims}]
    with open(Path(attacker.path) / "pad", "wb") as f:
        f.truncate(1 << 40)
    total = sum(i.size for i in leaves(cache_dir))
    assert total < 1 << 30
    report = maintenance.prune(str(cache_dir), max_bytes=total + 4096, grace_s=0)
    assert report.removed == 0 and len(leaves(cache_dir)) == 4
    found = [(i.path, bad.reason) for i, bad in maintenance.verify_all(str(cache_dir)) if bad is not None]
    assert found == [(attacker.path, Miss.DAMAGED)]
    list(maintenance.verify_all(str(cache_dir), fix=True))
    assert {i.path for i in leaves(cache_dir)} == {v.path for v in victims}


def test_prune_counts_a_leaf_it_spares_toward_the_cap(cache_dir, tmp_path):
    """A leaf --keep-per-build dooms but --grace spares stays on disk: it was left out of
    the total, so an old leaf whose removal would bring the cache under the cap was kept."""
    inc = tmp_path / "src" / "inc"
    inc.mkdir(parents=True)
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache_dir),), source_roots=(str(tmp_path / "src"),)))
    old = rt.build(safejit.Source("int o(void) { return 9; }\n", "o"))
    src = safejit.Source('#include "h.h"\nint k(void) { return V; }\n', "k")
    same_build = []
    for v in (1, 2):  # one build key, two closures: two leaves of one build
        (inc / "h.h").write_text(f"#define V {v}\n")
        settle()
        same_build.append(rt.build(src, include_dirs=(str(inc),)))
    rt.close()
    assert os.path.dirname(same_build[0].path) == os.path.dirname(same_build[1].path)
    _age(old.path, 86400)
    _age(same_build[0].path, 10)  # doomed by --keep-per-build 1, spared by --grace 60
    _age(same_build[1].path, 5)
    by_path = {i.path: i for i in leaves(cache_dir)}
    cap = sum(by_path[a.path].size for a in same_build)
    report = maintenance.prune(str(cache_dir), max_bytes=cap, keep_per_build=1, grace_s=60)
    assert not os.path.exists(old.path) and report.removed == 1 and report.kept_recent == 1
    assert sum(i.size for i in leaves(cache_dir)) <= cap


def test_a_deep_removal_never_climbs_into_another_tree(tmp_path, monkeypatch):
    """Removing a tree deeper than the recursion limit climbs back by '..': a directory on
    its way renamed elsewhere meanwhile (a writer of a shared root can) led it into that
    other place, which it emptied. It stops there now."""
    tmp, victim = tmp_path / "tmp", tmp_path / "victim"
    tmp.mkdir()
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    os.mkdir("evil", dir_fd=fd)
    for name in ["evil", *["d"] * 3000][:-1]:
        nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
        os.mkdir("d", dir_fd=fd)
    os.close(fd)
    real_rmdir, moved = os.rmdir, []

    def racing_rmdir(path, *args, **kwargs):
        if not moved:  # (the other writer's move, while the removal is deep in the tree)
            moved.append(True)
            os.rename(tmp / "evil" / "d" / "d", victim / "d")
        return real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", racing_rmdir)

    def recursing_rmtree(*args, **kwargs):  # (3.13's rmtree iterates: the fallback as where it recursed)
        raise RecursionError

    monkeypatch.setattr(fsio.shutil, "rmtree", recursing_rmtree)
    top = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError, match="moved"):
            fsio.rmtree_at(top, "evil")
    finally:
        os.close(top)
        monkeypatch.undo()
        for where in (tmp, victim):  # (what is left: pytest's own clean-up recurses)
            held = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
            for name in ("evil", "d"):
                with contextlib.suppress(FileNotFoundError):
                    fsio._rmtree_deep(held, name)
            os.close(held)
    assert moved and (victim / "precious").read_text() == "keep me"


def test_an_inventory_that_cannot_be_written_fails_no_compile(cache_dir, tmp_path, caplog):
    """The inventory is a record: one that cannot be opened (its directory missing) made
    the compile raise a raw OSError, and the same call again succeeded with its line lost.
    Now the compile succeeds, says why nothing was recorded, and records it once it can."""
    import logging

    inv = tmp_path / "missing" / "inventory.jsonl"
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache_dir),), inventory=str(inv)))
    try:
        with caplog.at_level(logging.WARNING):
            assert rt.compile(safejit.Source("int k(void) { return 7; }\n", "k")).kernel("k")() == 7
        assert any("could not record k in the inventory" in m for m in caplog.messages)
        inv.parent.mkdir()
        rt._memory.clear()  # (asked again, past the memory tier: recorded now)
        rt.compile(safejit.Source("int k(void) { return 7; }\n", "k"))
    finally:
        rt.close()
    assert len(inv.read_text().splitlines()) == 1


def test_prune_leaves_a_leaf_found_while_it_runs(cache_dir):
    """Prune decided from the mtimes of its walk: a leaf a process found (and touched)
    after the walk was removed all the same. Each leaf's mtime is looked at again just
    before it goes."""
    infos = _fill(cache_dir, 3)
    for info in infos:
        _age(info.path, 3600)
    later = infos[-1].path

    def progress(n: int) -> None:
        if n == 1:
            os.utime(later)  # (a process finds it now)

    report = maintenance.prune(str(cache_dir), max_age_s=60, grace_s=60, progress=progress)
    assert report.removed == 2 and report.kept_recent == 1 and os.path.isdir(later)


def test_prune_says_what_it_could_not_remove(cache_dir, monkeypatch, capsys):
    """A leaf prune could not move (a cache this user may not write) was counted nowhere:
    'removed 0' and exit 0 as if all went well."""
    from safejit import cli

    infos = _fill(cache_dir, 2)
    for info in infos:
        _age(info.path, 3600)

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(maintenance.os, "rename", refused)
    assert cli.main(["prune", "--json", "--max-age", "1m", "--cache-dir", str(cache_dir)]) == 1
    (root,) = json.loads(capsys.readouterr().out)["roots"]
    assert (root["removed"], root["failed"]) == (0, 2)
    assert cli.main(["prune", "--max-age", "1m", "--cache-dir", str(cache_dir)]) == 1
    assert "could not remove 2" in capsys.readouterr().out
    monkeypatch.undo()
    assert len(leaves(cache_dir)) == 2


def test_a_leaf_this_user_cannot_read_is_a_finding_not_left_out(cache_dir, monkeypatch, capsys):
    """Another user's private leaf was left out of ls and verify without a word: '0/0
    leaves verify', exit 0, as if the cache were sound."""
    from safejit import cli

    (info,) = _fill(cache_dir, 1)
    real_scandir = os.scandir

    def private(path):  # (what this user's read of another's 0700 leaf meets)
        if str(path) == info.path:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(maintenance.os, "scandir", private)
    assert cli.main(["verify", "--json", "--cache-dir", str(cache_dir)]) == 1
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert finding["path"] == info.path and "cannot read" in finding["detail"]
    assert cli.main(["ls", "--json", "--cache-dir", str(cache_dir)]) == 1
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert finding["path"] == info.path
    assert maintenance.prune(str(cache_dir), max_age_s=0, grace_s=0).removed == 0  # (never removed unread)


def test_a_leaf_pruned_while_verify_walks_is_no_finding(cache_dir):
    """A leaf a concurrent prune removed after the walk found it was reported 'this user
    cannot read the leaf' (exit 1); it is gone, and nothing to report."""
    infos = _fill(cache_dir, 3)
    walked = maintenance.verify_all(str(cache_dir))
    next(walked)  # (the walk has listed the leaves)
    for info in infos:
        _age(info.path, 3600)
    maintenance.prune(str(cache_dir), max_age_s=60, grace_s=0)
    assert [bad for _, bad in walked if bad is not None] == []  # (nor "gone": exit 1 for a prune)


def test_verify_fix_leaves_a_leaf_published_again_while_it_was_read(cache_dir, monkeypatch):
    """verify read the old leaf's marker and the new leaf's manifest (a prune and a
    publish between): it took a sound leaf for a damaged one and moved it aside."""
    (info,) = _fill(cache_dir, 1)
    real = maintenance.DiskTier.verify
    calls = []

    def torn(self, leaf, root, build_key, memo):  # (the first read straddles a republish)
        calls.append(leaf)
        if len(calls) == 1:
            return Rejection(Miss.MANIFEST, "manifest does not match its commit marker", leaf, root)
        return real(self, leaf, root, build_key, memo)

    monkeypatch.setattr(maintenance.DiskTier, "verify", torn)
    moved: set[str] = set()
    assert [bad for _, bad in maintenance.verify_all(str(cache_dir), fix=True, moved=moved)] == [None]
    assert moved == set() and os.path.isdir(info.path) and len(calls) == 2


def test_a_quarantined_leaf_is_kept_for_gcs_full_age(cache_dir):
    """Moved aside with its old mtime, it was removed by the next gc at once."""
    (info,) = _fill(cache_dir, 1)
    _age(info.path, 3 * 86400)
    (Path(info.path) / "artifact.so").write_bytes(b"damaged")
    moved: set[str] = set()
    assert [bad.reason for _, bad in maintenance.verify_all(str(cache_dir), fix=True, moved=moved)] == [Miss.ARTIFACT]
    assert moved == {info.path}
    assert maintenance.gc(str(cache_dir))["quarantine"] == 0
    assert len(os.listdir(cache_dir / "v1" / "quarantine")) == 1
    assert maintenance.gc(str(cache_dir), now=time.time() + 2 * 86400)["quarantine"] == 1


def test_verify_checks_signatures_as_this_users_processes_do(cache_dir, tmp_path):
    """A leaf another writer replaced with an unsigned one: every node that requires a
    signature misses it, and verify said 1/1 leaves verify."""
    from safejit.policy.trust import Ed25519Signer, config_policy

    pem = Ed25519Signer.generate().private_pem()
    signed = safejit.Config(cache_dirs=(str(cache_dir),), signing_key=pem)
    _fill(cache_dir, 1)  # (unsigned)
    policy = config_policy(signed)
    findings = [bad for _, bad in maintenance.verify_all(str(cache_dir), verifier=policy, tenant="default")]
    assert [b.reason for b in findings if b is not None] == [Miss.UNSIGNED]
    # (another tenant's leaves answer to its own keys, not these)
    assert [b for _, b in maintenance.verify_all(str(cache_dir), verifier=policy, tenant="other")] == [None]
    assert [b for _, b in maintenance.verify_all(str(cache_dir))] == [None]  # (no key: as before)


def test_gc_removes_the_build_dir_a_failed_compile_left_empty(cache_dir):
    """A build dir is made when its compile begins: one that failed, was killed or was
    not published left it empty, and nothing ever removed it."""
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache_dir),)))
    for i in range(3):
        with pytest.raises(safejit.CompileError):
            rt.compile(safejit.Source(f"int broken{i}(void) {{ return x; }}\n", f"broken{i}"))
    rt.build(safejit.Source("int k(void) { return 1; }\n", "k"))
    rt.close()
    builds = sorted((cache_dir / "v1").glob("*/*/*/build-*"))
    empty = [b for b in builds if not any(b.iterdir())]
    assert len(builds) == 4 and len(empty) == 3
    assert maintenance.gc(str(cache_dir), max_age_s=86400)["empty"] == 0  # (young: a compile may be about to fill it)
    for build in builds:
        _age(str(build), 2 * 86400)
    assert maintenance.gc(str(cache_dir), max_age_s=86400)["empty"] == 3
    assert [b for b in builds if b.exists()] == [b for b in builds if b not in empty]
    assert len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)


def test_gc_sweeps_the_stat_memo_of_leaves_gone_and_of_other_boots(cache_dir, tmp_path):
    """The per-user stat memo kept a record of every leaf ever verified, of every boot,
    and what killed writers left: the private state dir grew for good."""
    from safejit.cache.statmemo import boot_id

    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")}
    private = tmp_path / "xdg" / "safejit"
    memo = private / f"stat-{boot_id()}"
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache_dir),)))
    for i in range(3):
        rt.build(safejit.Source(f"int k(void) {{ return {i}; }}\n", "k"))
    rt.close()
    time.sleep(2.1)  # (past the racy window: the next full check records each leaf)
    hits = (
        "import sys, safejit\n"
        "rt = safejit.Runtime(config=safejit.Config(cache_dirs=(sys.argv[1],)))\n"
        "for i in range(3):\n"
        "    assert rt.compile(safejit.Source(f'int k(void) {{ return {i}; }}\\n', 'k')).artifact.tier == 'disk'\n"
    )
    subprocess.run([sys.executable, "-c", hits, str(cache_dir)], check=True, env=env)
    assert len(list(memo.glob("*.json"))) == 3
    other_boot, other_node = private / ("stat-" + "0" * 32), private / ("stat-" + "1" * 32)
    for memo_dir in (other_boot, other_node):  # (a past boot's; a node's sharing this home, in use)
        memo_dir.mkdir()
        (memo_dir / "x.json").write_text("{}")
    _age(str(other_boot), 2 * 86400)
    killed = memo / "x.json.123.tmp"  # (a writer killed before its rename)
    killed.write_text("{")
    _age(str(killed), 3600)
    maintenance.gc(str(cache_dir), max_age_s=86400, marks=str(private))
    assert len(list(memo.glob("*.json"))) == 3 and not killed.exists()
    assert not other_boot.exists() and other_node.exists()
    infos = leaves(cache_dir)
    maintenance.prune(str(cache_dir), max_bytes=sum(i.size for i in infos) - 1, grace_s=0)  # (one goes)
    assert len(leaves(cache_dir)) == 2
    maintenance.gc(str(cache_dir), max_age_s=86400, marks=str(private))
    assert len(list(memo.glob("*.json"))) == 2  # (the pruned leaf's record only)


def test_gc_removes_a_mark_a_process_killed_while_making_it_left(cache_dir, tmp_path):
    """A process killed between making ``.<token>.making`` and renaming it to its mark left
    the file for good: gc looked only at ``*.alive``. One still held (its maker alive), or
    made a moment ago, stays."""
    import fcntl

    private = tmp_path / "state"
    private.mkdir(mode=0o700)
    left, held, young = (private / f".p{n}.0123456789ab.making" for n in (11, 12, 13))
    for path in (left, held, young):
        path.write_text("")
    for path in (left, held):
        _age(str(path), 3600)
    with open(held, "rb") as fh:
        fcntl.flock(fh, fcntl.LOCK_SH)
        maintenance.gc(str(cache_dir), max_age_s=86400, marks=str(private))
    assert not left.exists() and held.exists() and young.exists()


def test_gc_removes_a_killed_processs_young_work_dir_before_its_mark(cache_dir, tmp_path):
    """gc took away the killed process's mark first, and with it the proof that its young
    work dir was free: the dir then waited a full gc age."""
    marks = tmp_path / "state"
    marks.mkdir(mode=0o700)
    (cache_dir / "v1" / "tmp").mkdir(parents=True)
    child = subprocess.Popen(
        [sys.executable, "-c", _WORKDIR_HOLDER, str(cache_dir), str(marks)], stdout=subprocess.PIPE, text=True
    )
    live = Path(child.stdout.readline().strip())
    child.kill()
    child.wait()
    child.stdout.close()
    assert live.is_dir() and os.listdir(marks)
    counts = maintenance.gc(str(cache_dir), max_age_s=86400, marks=str(marks))
    assert counts["staging"] == 1 and not live.exists() and os.listdir(marks) == []


def test_warm_refuses_an_inventorys_float_that_is_no_number(project, tmp_path):
    """compile() refuses a NaN extra; an inventory (its extras' values JSON, where NaN is
    a literal) fed one to warm, which builds its requests past compile()'s checks."""
    (project / "kernel.c").write_text("int value(void) { return 3; }\n")
    inventory = tmp_path / "inventory.jsonl"
    cfg = {"source_roots": (str(project),), "declared_extras": ("e",)}
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(tmp_path / "c1"),), inventory=str(inventory), **cfg))
    rt.compile(rt.source(project / "kernel.c"), extras={"e": 1.5})
    rt.close()
    assert '["e", "1.5"]' in inventory.read_text()
    inventory.write_text(inventory.read_text().replace('["e", "1.5"]', '["e", "NaN"]'))
    cache2 = tmp_path / "c2"
    with safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache2),), **cfg)) as warm:
        (request,) = read_inventory(str(inventory))
        with pytest.raises(safejit.ConfigError, match="not a finite number"):
            warm.warm(request)
    assert not leaves(cache2)
