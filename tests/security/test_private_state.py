"""The shared cache dir is data, never code or trusted state (issue 15, class 7).

The exec shim, the stat memo and the toolchain probes live in a per-user private
directory outside every cache root (``sandbox.statedir``). Whatever is planted in the
old place (``<cache>/v1/tools/u<uid>/``), or in a state dir that is not ours or that
others may write, is never executed, read or trusted. A planted probe is a real
attack: it names the compiler that is then run. So every planted shim and probe here
points at a program that leaves a marker if it ever runs.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

import safejit
from safejit.cache.leaf import MemoRecord
from safejit.cache.statmemo import StatMemo, boot_id
from safejit.sandbox import statedir
from safejit.sandbox._shim_build import shim_name
from safejit.sandbox.runner import SYSTEM_PATH, Sandbox
from tests.conftest import ADD_C, assert_cache_sound, names_under

ADD = safejit.Source(ADD_C, "add")
ROOT = os.geteuid() == 0
CC = shutil.which("cc", path=SYSTEM_PATH)


@pytest.fixture
def fresh_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A new ``XDG_STATE_HOME`` (its ``safejit`` dir not made yet), forgotten by ``state_dir``."""
    home = tmp_path / "xdg"
    home.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    monkeypatch.setattr(statedir, "_opened", {})
    return home


def _marker_program(tmp_path: Path) -> tuple[Path, Path]:
    """A program that leaves a marker when it runs, in a place anyone may run it from."""
    marker = tmp_path / "planted-code-ran"
    prog = tmp_path / "planted"
    prog.write_text(f'#!/bin/sh\ntouch {marker}\nexec /usr/bin/cc "$@"\n')
    prog.chmod(0o755)
    return prog, marker


def _real_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, object]]:
    """The probe record a compile makes for the system compiler: (file name, record)."""
    other = tmp_path / "probe-maker"
    other.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(other))
    monkeypatch.setattr(statedir, "_opened", {})
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(tmp_path / "probe-cache"),)))
    try:
        rt.compile(ADD)
    finally:
        rt.close()
    (found,) = (other / "safejit").glob("probe-*.json")
    return found.name, json.loads(found.read_text())


def _plant(where: Path, probe: tuple[str, dict[str, object]], prog: Path, *, cc: str | None = CC) -> None:
    """A shim (as each compiler would name it), a probe naming ``prog`` as the compiler,
    and a stat memo record, in ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    for name in {shim_name(c) for c in (cc, "/usr/bin/cc") if c}:
        shutil.copy(prog, where / name)
        (where / name).chmod(0o755)
    name, record = probe
    (where / name).write_text(json.dumps({**record, "compiler": str(prog)}))
    memo = where / f"stat-{boot_id()}"
    memo.mkdir(exist_ok=True)
    (memo / ("0" * 40 + ".json")).write_text('{"leaf": "x", "deps_key": "y", "snaps": []}')


def _compile_fresh(tmp_path: Path, cache: Path) -> safejit.Runtime:
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache),)))
    assert rt.compile(ADD).kernel("add")(2, 3) == 5
    return rt


def test_shim_probe_and_stat_memo_planted_in_the_cache_root_are_never_used(tmp_path, monkeypatch):
    """Whoever can write the shared cache root swapped ``v1/`` and had its "shim" run."""
    prog, marker = _marker_program(tmp_path)
    probe = _real_probe(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    _plant(cache / "v1" / "tools" / f"u{os.geteuid()}", probe, prog)
    home = tmp_path / "xdg"
    home.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    monkeypatch.setattr(statedir, "_opened", {})
    rt = _compile_fresh(tmp_path, cache)
    try:
        setup = rt._init()[0]
        assert Path(setup.state.shown) == home / "safejit"
        memo = setup.disk._memo
        assert isinstance(memo, StatMemo) and memo.directory.startswith(setup.state.path)
    finally:
        rt.close()
    assert not marker.exists()
    assert_cache_sound(cache)


def _spoil(path: Path, how: str, away: Path) -> None:
    """Make ``path`` not ours, writable by others, or a symlink (to ``away``, where it goes)."""
    if how == "group-writable":
        path.chmod(0o770)
    elif how == "world-writable":
        path.chmod(0o777)
    elif how == "foreign-owner":
        os.chown(path, 65534, 65534)
    elif how == "symlink":
        away.parent.mkdir(parents=True, exist_ok=True)
        path.rename(away)
        path.symlink_to(away, target_is_directory=away.is_dir())


_DEFECTS = [
    "group-writable",
    "world-writable",
    "symlink",
    pytest.param("foreign-owner", marks=pytest.mark.skipif(not ROOT, reason="chown needs root")),
]


@pytest.mark.parametrize("defect", _DEFECTS)
def test_a_private_dir_not_ours_or_writable_by_others_is_never_used(tmp_path, monkeypatch, defect):
    prog, marker = _marker_program(tmp_path)
    probe = _real_probe(tmp_path, monkeypatch)
    home = tmp_path / "xdg"
    planted = home / "safejit"
    _plant(planted, probe, prog)
    planted.chmod(0o700)
    _spoil(planted, defect, tmp_path / "elsewhere")
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    monkeypatch.setattr(statedir, "_opened", {})
    rt = _compile_fresh(tmp_path, tmp_path / "cache")
    try:
        used = rt._init()[0].state
        assert Path(used.shown) != planted and not Path(used.shown).is_relative_to(tmp_path / "elsewhere")
    finally:
        rt.close()
    assert not marker.exists()


@pytest.mark.parametrize("defect", ["world-writable-parent", "foreign-owned-parent"])
def test_a_private_dir_below_a_directory_others_may_write_is_never_used(tmp_path, monkeypatch, defect):
    """Someone who may write a directory on the way can swap what lies below it."""
    if defect == "foreign-owned-parent" and not ROOT:
        pytest.skip("chown needs root")
    prog, marker = _marker_program(tmp_path)
    probe = _real_probe(tmp_path, monkeypatch)
    shared = tmp_path / "shared"
    home = shared / "xdg"
    planted = home / "safejit"
    _plant(planted, probe, prog)
    planted.chmod(0o700)
    if defect == "world-writable-parent":
        shared.chmod(0o777)  # (not sticky)
    else:
        os.chown(shared, 65534, 65534)
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    monkeypatch.setattr(statedir, "_opened", {})
    rt = _compile_fresh(tmp_path, tmp_path / "cache")
    try:
        assert not Path(rt._init()[0].state.shown).is_relative_to(shared)
    finally:
        rt.close()
    assert not marker.exists()


def test_a_private_dir_inside_a_cache_root_is_never_used(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_STATE_HOME", str(cache / "state"))
    monkeypatch.setattr(statedir, "_opened", {})
    rt = _compile_fresh(tmp_path, cache)
    try:
        assert not Path(rt._init()[0].state.shown).is_relative_to(cache)
    finally:
        rt.close()
    assert names_under(cache, "shim-*") == [] and names_under(cache, "probe-*") == []


@pytest.mark.parametrize("defect", _DEFECTS)
def test_a_planted_shim_or_probe_with_wrong_owner_or_mode_is_never_used(tmp_path, monkeypatch, fresh_state, defect):
    """The directory is ours; files in it that are not (or that others may write) are
    neither run nor trusted: the shim is built again, the probe run again."""
    prog, marker = _marker_program(tmp_path)
    probe = _real_probe(tmp_path, monkeypatch)
    monkeypatch.setenv("XDG_STATE_HOME", str(fresh_state))
    monkeypatch.setattr(statedir, "_opened", {})
    state = statedir.state_dir()
    where = Path(state.shown)
    _plant(where, probe, prog)
    for planted in [*where.glob("shim-*"), *where.glob("probe-*")]:
        _spoil(planted, defect, tmp_path / "away" / planted.name)
    rt = _compile_fresh(tmp_path, tmp_path / "cache")
    rt.close()
    assert not marker.exists()
    shims = [p for p in where.glob("shim-*") if not p.is_symlink()]
    assert shims and all(statedir.private_file(os.lstat(p)) for p in shims)


def test_the_shim_runs_through_its_descriptor_not_its_path(tmp_path, fresh_state):
    """Once opened, the shim is run through that descriptor: a file swapped in under its
    name afterwards is never run."""
    prog, marker = _marker_program(tmp_path)
    sb = Sandbox("auto", state=statedir.state_dir(), cc=CC)
    try:
        sb._executable()  # built and opened
        (shim,) = Path(statedir.state_dir().shown).glob("shim-*")
        swapped = shim.with_name("swap")
        shutil.copy(prog, swapped)
        swapped.chmod(0o700)
        swapped.replace(shim)  # (as only its owner could: the directory is private)
        work = tmp_path / "work"
        work.mkdir()
        result = sb.run(["/bin/true"], cwd=str(work), env={"PATH": SYSTEM_PATH}, timeout=30, write_roots=[str(work)])
        assert result.returncode == 0
        assert sb.walls.landlock == 0 or "landlock" in result.walls  # the real shim's report
    finally:
        sb.close()
    assert not marker.exists()


@pytest.mark.parametrize("defect", ["world-writable", "symlink", "fifo"])
def test_a_stat_memo_record_not_ours_is_never_read(tmp_path, fresh_state, defect):
    state = statedir.state_dir()
    memo = StatMemo(state.path)
    record = MemoRecord(["s0/x.h"], [(1, 2, 3, 4, 5)], [])
    memo.record("leaf", "deps", "roots", record)
    path = Path(memo._path("leaf").replace(state.path, state.shown))
    assert memo.lookup("leaf", "deps", "roots") is not None  # (ours: read)
    if defect == "fifo":
        path.unlink()
        os.mkfifo(path)
    else:
        _spoil(path, defect, tmp_path / "moved" / path.name)
    assert memo.lookup("leaf", "deps", "roots") is None


def test_a_fresh_private_dir_is_made_private(fresh_state):
    state = statedir.state_dir()
    st = os.lstat(state.shown)
    assert Path(state.shown) == fresh_state / "safejit"
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
    assert state.path == f"/proc/self/fd/{state.fd}"
