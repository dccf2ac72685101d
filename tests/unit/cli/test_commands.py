"""The command line: each operator feature, in this process (``main(argv, out=…)``) where
the output is what is checked, as a real subprocess where the entry point is."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import safejit
from safejit.cli import _parser, main
from safejit.cli._out import Out
from safejit.outcomes import Miss
from tests.conftest import leaves

SRC = safejit.Source("#define VALUE 7\n", "k")


@dataclass(frozen=True)
class Ran:
    rc: int
    out: str
    err: str


def cli(*args: str, width: int = 80, env: dict[str, str] | None = None) -> Ran:
    stdout, stderr = io.StringIO(), io.StringIO()
    try:  # (argparse writes to sys.stdout/sys.stderr itself)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = main(list(args), out=Out(stdout, stderr, use_rich=False, width=width))
    except SystemExit as exc:  # (argparse: --help, --version, bad options)
        rc = int(exc.code or 0)
    ran = Ran(rc, stdout.getvalue(), stderr.getvalue())
    assert "Traceback" not in ran.out + ran.err and "internal error" not in ran.err, ran
    return ran


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "safejit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80", **(env or {})},
        timeout=300,
    )


def _fill(cache_dir: Path, *names: str, tenant: str = "default") -> list[safejit.Artifact]:
    rt = safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(str(cache_dir),), tenant=tenant))
    made = [rt.build(safejit.Source(f"#define VALUE {i}\n", name)) for i, name in enumerate(names)]
    rt.close()
    return made


def _fits(text: str, width: int = 80, *, but: tuple[str, ...] = ()) -> None:
    """Every line fits ``width`` columns, except those holding one of ``but`` (a root path)."""
    long = [line for line in text.splitlines() if len(line) > width and not any(b in line for b in but)]
    assert long == []


# -- the entry point, the version, the help ----------------------------------------
def test_version_names_safejit_python_and_rich():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith(f"safejit {safejit.__version__} (Python ")
    assert "rich" in out.stdout


def _options(parser: argparse.ArgumentParser, prefix: str = "") -> list[tuple[str, argparse.Action]]:
    """Every option of ``parser`` and of its commands (``remote ls`` too), by name."""
    found = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            found.append((f"{prefix}{action.dest}", action))
            continue
        for name, sub in action.choices.items():
            if not name.startswith("_"):
                found += _options(sub, f"{prefix}{name} ")
    return found


def _commands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found = [p for a in subs for n, p in a.choices.items() if not n.startswith("_")]
    return found + [q for p in found for q in _commands(p)]


def test_every_option_and_command_has_help_text():
    missing = [name for name, action in _options(_parser()) if not action.help]
    assert missing == []
    assert len(_commands(_parser())) == 13  # (remote's own three included)
    assert all(p.description for p in _commands(_parser()))


def test_help_shows_units_and_defaults_and_hides_the_internal_command():
    top = run("--help", env={"COLUMNS": "100"})
    assert top.returncode == 0 and "_demo-child" not in top.stdout and "Exit status" in top.stdout
    wrong = run("bogus")  # (argparse lists every command it has: the demo's child process is none)
    assert wrong.returncode == 2 and "'demo'" in wrong.stderr and "_demo" not in wrong.stderr
    assert run("ls", "--backend", "gpu").returncode == 2  # (0 leaves, exit 0, before: explain refused it)
    prune = run("prune", "--help", env={"COLUMNS": "100"}).stdout
    assert "500M, 10G" in prune and "30d" in prune and "(default: 60s)" in prune and "(default: False)" not in prune
    assert "(default: 1d)" in run("gc", "--help", env={"COLUMNS": "100"}).stdout


# -- --cache-dir must exist --------------------------------------------------------
@pytest.mark.parametrize("command", ["ls", "stats", "verify", "gc", "prune", "inspect", "explain"])
@pytest.mark.parametrize("what", ["missing", "a-file"])
def test_a_missing_or_non_directory_cache_dir_is_an_error(tmp_path, command, what):
    path = tmp_path / "nope"
    if what == "a-file":
        path.write_text("x")
    extra = {"prune": ["--max-bytes", "1G"], "inspect": ["abcd"], "explain": [str(tmp_path / "k.c")]}
    ran = cli(command, *extra.get(command, []), "--cache-dir", str(path))
    assert ran.rc == 2 and ran.out == ""
    assert f"--cache-dir {path}: " + ("no such directory" if what == "missing" else "not a directory") in ran.err


@pytest.mark.parametrize("command", ["ls", "stats", "verify", "gc", "prune", "inspect", "explain", "demo", "warm"])
def test_each_commands_help_says_what_a_missing_cache_dir_does(command):
    """``demo`` and ``warm`` fill a cache and make it; the help of every command said
    "must exist"."""
    said = " ".join(run(command, "--help", env={"COLUMNS": "200"}).stdout.split())
    assert ("made if missing" if command in ("demo", "warm") else "must exist") in said


@pytest.mark.parametrize("command", ["ls", "stats", "verify", "gc", "prune"])
def test_an_empty_cache_dir_is_an_error_not_the_default_cache(tmp_path, monkeypatch, command):
    """``--cache-dir "$CACHE"`` with the variable unset: it ran on the default cache (a
    cron job's ``prune --max-bytes 0`` emptied it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    default = tmp_path / "xdg" / "safejit"
    default.mkdir(parents=True)
    (default / "keep").write_text("x")
    extra = {"prune": ["--max-bytes", "0", "--grace", "0"]}
    ran = cli(command, *extra.get(command, []), "--cache-dir", "")
    assert ran.rc == 2 and "empty path" in ran.err
    assert (default / "keep").exists()


def test_verify_of_a_misspelt_cache_dir_fails_the_cron_job(tmp_path):
    out = run("verify", "--cache-dir", str(tmp_path / "typo"))
    assert out.returncode == 2 and "0/0" not in out.stdout and "no such directory" in out.stderr


def test_a_configured_cache_dir_that_is_missing_is_an_error_too(tmp_path, monkeypatch):
    monkeypatch.setenv("SAFEJIT_CACHE_DIRS", str(tmp_path / "typo"))
    ran = cli("ls")
    assert ran.rc == 2 and "SAFEJIT_CACHE_DIRS" in ran.err


def test_the_default_cache_not_made_yet_is_empty_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    ran = cli("verify")
    assert ran.rc == 0 and "no cache at" in ran.out and "0/0 leaves verify" in ran.out


# -- ls --------------------------------------------------------------------------
def test_ls_shows_short_ids_kernels_and_paths(cache_dir):
    arts = _fill(cache_dir, "alpha", "beta")
    ls = cli("ls", "--cache-dir", str(cache_dir))
    assert ls.rc == 0 and "2 leaves" in ls.out
    assert ls.out.splitlines()[0].split() == ["ID", "KERNEL", "TENANT", "BACKEND", "SIZE", "AGE"]
    ids = {i.path: i.id for i in leaves(cache_dir)}
    for art in arts:
        leaf_id = ids[art.path]
        assert leaf_id == art.build_key[:8] + art.deps_key[:4]
        assert any(line.startswith(leaf_id) for line in ls.out.splitlines())
    assert "alpha" in ls.out and "beta" in ls.out
    paths = cli("ls", "--paths", "--cache-dir", str(cache_dir)).out.splitlines()
    assert sorted(paths) == sorted(f"{ids[a.path]}  {a.path}" for a in arts)


def test_ls_filters_by_tenant_and_backend(cache_dir):
    _fill(cache_dir, "alpha")
    _fill(cache_dir, "beta", tenant="team-a")
    only = cli("ls", "--tenant", "team-a", "--cache-dir", str(cache_dir)).out
    assert "beta" in only and "alpha" not in only
    assert "0 leaves" in cli("ls", "--backend", "cuda", "--cache-dir", str(cache_dir)).out


LS_KEYS = {"id", "root", "tenant", "backend", "kernel", "build_key", "deps_key", "path", "bytes", "mtime"}


def test_ls_json_keys(cache_dir):
    (art,) = _fill(cache_dir, "alpha")
    data = json.loads(cli("ls", "--json", "--cache-dir", str(cache_dir)).out)
    assert set(data) == {"roots", "leaves", "findings"} and data["findings"] == []
    (leaf,) = data["leaves"]
    assert set(leaf) == LS_KEYS
    assert (leaf["kernel"], leaf["path"], leaf["build_key"]) == ("alpha", art.path, art.build_key)


# -- inspect -----------------------------------------------------------------------
def test_inspect_accepts_a_short_id_a_key_prefix_or_a_directory(cache_dir):
    (art,) = _fill(cache_dir, "alpha")
    (info,) = leaves(cache_dir)
    for given in (info.id, info.id[:6], art.build_key[:16], art.path, str(Path(art.path).parent)):
        shown = cli("inspect", given, "--cache-dir", str(cache_dir))
        assert shown.rc == 0 and art.build_key in shown.out and "alpha" in shown.out, given


def test_inspect_of_an_ambiguous_id_lists_the_matches(cache_dir):
    _fill(cache_dir, *(f"k{i}" for i in range(40)))
    infos = leaves(cache_dir)
    prefix = (
        next(p for p in (i.id[:4] for i in infos) if sum(1 for j in infos if j.id.startswith(p)) > 1)
        if len({i.id[:4] for i in infos}) < len(infos)
        else infos[0].deps_key[:9]
    )  # (all 40 share a deps key)
    ran = cli("inspect", prefix, "--cache-dir", str(cache_dir))
    assert ran.rc == 2 and "is ambiguous" in ran.err and "give more digits" in ran.err
    matches = [i for i in infos if i.id.startswith(prefix) or i.deps_key.startswith(prefix)]
    assert all(f"{m.id}  {m.path}" in ran.err for m in matches[:20])


def test_inspect_of_an_unknown_id_is_an_error(cache_dir):
    _fill(cache_dir, "alpha")
    assert cli("inspect", "ffffffff0000", "--cache-dir", str(cache_dir)).rc == 2
    ran = cli("inspect", "not-hex", "--cache-dir", str(cache_dir))
    assert ran.rc == 2 and "ID column of `safejit ls`" in ran.err


def _wide_leaf(tmp_path: Path, cache_dir: Path, headers: int) -> safejit.Artifact:
    """A leaf whose build read ``headers`` headers of the source root."""
    project = tmp_path / "project"
    (project / "inc").mkdir(parents=True)
    for i in range(headers):
        (project / "inc" / f"h{i:03d}.h").write_text(f"#define H{i} {i}\n")
    code = "".join(f'#include "h{i:03d}.h"\n' for i in range(headers)) + "#define VALUE 1\n"
    cfg = safejit.Config(backend="fake", cache_dirs=(str(cache_dir),), source_roots=(str(project),))
    with safejit.Runtime(config=cfg) as rt:
        return rt.build(safejit.Source(code, "wide"), include_dirs=(str(project / "inc"),))


def test_inspect_summarises_a_large_closure_and_explains_anchors(tmp_path, cache_dir, monkeypatch):
    art = _wide_leaf(tmp_path, cache_dir, 40)
    monkeypatch.setenv("SAFEJIT_SOURCE_ROOTS", str(tmp_path / "project"))
    shown = cli("inspect", art.path, "--cache-dir", str(cache_dir))
    assert shown.rc == 0
    assert "dependencies: 40  (s0 40)" in shown.out
    assert "… 35 more (--deps lists them all)" in shown.out
    assert "s*  source roots, in the order declared (s0 = the first of Config.source_roots" in shown.out
    assert f"s0 here: {tmp_path / 'project'}" in shown.out
    assert "include dirs s0/inc" in shown.out
    full = cli("inspect", art.path, "--deps", "--cache-dir", str(cache_dir)).out
    assert all(f"inc/h{i:03d}.h" in full for i in range(40)) and "more (--deps" not in full


INSPECT_KEYS = {
    "id",
    "path",
    "manifest",
    "other_files",
    "deps_by_anchor",
    "negatives_by_anchor",
    "source_roots_here",
    "findings",
}


def test_inspect_json_keys(tmp_path, cache_dir):
    art = _wide_leaf(tmp_path, cache_dir, 3)
    data = json.loads(cli("inspect", art.path, "--json", "--cache-dir", str(cache_dir)).out)
    assert set(data) == INSPECT_KEYS
    assert data["manifest"]["build_key"] == art.build_key and len(data["manifest"]["deps"]) == 3
    assert data["deps_by_anchor"] == {"s0": 3} and data["manifest"]["inputs"]["include_dirs"] == [["s0", "inc"]]


# -- stats, verify, gc, prune ------------------------------------------------------------
def test_stats_shows_sizes_usage_and_latency_per_tenant(cache_dir):
    _fill(cache_dir, "alpha", "beta")
    ran = cli("stats", "--cache-dir", str(cache_dir))
    assert ran.rc == 0
    assert "quarantined entries: 0; staging dirs:" in ran.out
    row = next(line for line in ran.out.splitlines() if line.startswith("default") and "%" in line)
    assert row.split()[:3] == ["default", "1", "2"]  # processes, requests
    data = json.loads(cli("stats", "--json", "--cache-dir", str(cache_dir)).out)
    assert set(data) == {"roots", "findings"}
    (root,) = data["roots"]
    assert set(root) == {"root", "leaves", "quarantined", "staging", "usage"}
    (usage,) = root["usage"]
    assert set(usage) == {
        "tenant",
        "processes",
        "requests",
        "memory_hits",
        "disk_hits",
        "misses",
        "compiles",
        "errors",
        "memory_hit_rate",
        "disk_hit_rate",
        "compile_seconds",
    }
    assert usage["compiles"] == 2 and set(usage["compile_seconds"]) == {"p50", "p90", "p99", "max"}
    assert root["leaves"] == [
        {"tenant": "default", "backend": "fake", "leaves": 2, "bytes": root["leaves"][0]["bytes"]}
    ]


def test_verify_reports_a_damaged_leaf_and_fixes_it(cache_dir):
    (art,) = _fill(cache_dir, "alpha")
    assert "1/1 leaves verify" in cli("verify", "--cache-dir", str(cache_dir)).out
    artifact = Path(art.path) / "artifact.fake"
    artifact.write_bytes(artifact.read_bytes() + b"x")
    bad = cli("verify", "--cache-dir", str(cache_dir))
    assert bad.rc == 1 and "0/1 leaves verify" in bad.out and "FAIL" in bad.out and Miss.ARTIFACT.value in bad.out
    data = json.loads(cli("verify", "--json", "--cache-dir", str(cache_dir)).out)
    assert set(data) == {"roots", "checked", "verified", "findings"} and (data["checked"], data["verified"]) == (1, 0)
    (finding,) = data["findings"]
    assert set(finding) == {"kind", "path", "id", "reason", "detail", "fixed"}
    assert (finding["kind"], finding["reason"], finding["path"]) == ("leaf", "artifact", art.path)
    fixed = cli("verify", "--fix", "--cache-dir", str(cache_dir))
    assert fixed.rc == 1 and "(quarantined)" in fixed.out
    assert cli("verify", "--cache-dir", str(cache_dir)).rc == 0


def test_prune_dry_run_deletes_nothing(cache_dir):
    _fill(cache_dir, "alpha", "beta")
    ran = cli("prune", "--max-bytes", "0", "--grace", "0", "--dry-run", "--cache-dir", str(cache_dir))
    assert ran.rc == 0 and "would remove 2" in ran.out and "dry run: nothing was deleted" in ran.out
    assert len(leaves(cache_dir)) == 2
    data = json.loads(cli("prune", "--max-bytes", "0", "--grace", "0", "--json", "--cache-dir", str(cache_dir)).out)
    assert data["dry_run"] is False and data["roots"][0]["removed"] == 2 and leaves(cache_dir) == []
    assert set(data["roots"][0]) == {"root", "leaves", "removed", "freed_bytes", "spared", "failed"}


def test_prune_says_a_huge_grace_in_a_few_digits(cache_dir):
    _fill(cache_dir, "alpha")
    ran = cli("prune", "--max-age", "1d", "--grace", "1e300w", "--dry-run", "--cache-dir", str(cache_dir))
    assert ran.rc == 0 and "used within the last 6.048e+305s" in ran.out, ran.out
    assert "used within the last 60s" in cli("prune", "--max-age", "1d", "--dry-run", "--cache-dir", str(cache_dir)).out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--keep-per-build", "0"), "not a positive integer: '0' (at least 1)"),
        (("--keep-per-build", "-2"), "not a positive integer"),
        (("--max-bytes", "-5"), "not a size: '-5'"),
        (("--max-bytes", "lots"), "512k, 500M, 10G, 1T"),
        (("--max-age=-1d",), "not an age: '-1d'"),
        (("--max-age", "1y"), "s, m, h, d or w, e.g. 30d"),
        (("--grace", "nan"), "not an age"),
    ],
)
def test_prune_refuses_zero_keep_and_negative_sizes_and_ages(cache_dir, args, says):
    _fill(cache_dir, "alpha")
    ran = cli("prune", *args, "--cache-dir", str(cache_dir))
    assert ran.rc == 2 and says in ran.err
    assert len(leaves(cache_dir)) == 1


def test_prune_without_a_limit_uses_the_configured_cap(cache_dir, monkeypatch):
    _fill(cache_dir, "alpha", "beta")
    none = cli("prune", "--cache-dir", str(cache_dir))
    assert none.rc == 2 and "SAFEJIT_CACHE_MAX_BYTES" in none.err
    monkeypatch.setenv("SAFEJIT_CACHE_MAX_BYTES", "1k")
    assert safejit.Config.from_env().cache_max_bytes == 1024
    ran = cli("prune", "--grace", "0", "--cache-dir", str(cache_dir))
    assert ran.rc == 0 and len(leaves(cache_dir)) == 1  # the LRU one went, to get under 1 KiB


@pytest.mark.parametrize("bad", ["-1", "0", "lots", "nan"])
def test_a_bad_cache_cap_names_the_variable_or_field(monkeypatch, bad):
    monkeypatch.setenv("SAFEJIT_CACHE_MAX_BYTES", bad)
    with pytest.raises(safejit.ConfigError, match=r"SAFEJIT_CACHE_MAX_BYTES|cache_max_bytes"):
        safejit.Config.from_env()


def test_gc_removes_idle_locks_and_reports_counts_as_json(make_runtime, cache_dir):
    make_runtime(backend="fake").compile(SRC)
    locks = list((cache_dir / "v1" / "locks").iterdir())
    assert locks
    data = json.loads(cli("gc", "--older-than", "0s", "--json", "--cache-dir", str(cache_dir)).out)
    (root,) = data["roots"]
    assert set(root) == {"root", "staging", "quarantine", "usage", "locks", "empty", "damaged", "obsolete"}
    assert data["findings"] == []
    assert root["locks"] == len(locks) and not any(p.exists() for p in locks)


# -- 80 columns ------------------------------------------------------------------------
def test_tables_fit_80_columns(cache_dir):
    long_tenant = "t" + "x" * 62
    _fill(cache_dir, "k" * 60, "short")
    _fill(cache_dir, "other", tenant=long_tenant)
    for args in (("ls",), ("stats",), ("verify",), ("gc",), ("prune", "--max-age", "30d")):
        ran = cli(*args, "--cache-dir", str(cache_dir), width=80)
        assert ran.rc == 0
        _fits(ran.out, 80, but=(str(cache_dir),))
    assert "t" + "x" * 20 in cli("ls", "--cache-dir", str(cache_dir)).out  # cut with …, not dropped


def test_tables_fit_a_real_80_column_console(cache_dir):
    _fill(cache_dir, "k" * 60)
    for args in (("ls",), ("stats",)):
        out = run(*args, "--cache-dir", str(cache_dir), env={"COLUMNS": "80"})
        assert out.returncode == 0
        _fits(out.stdout, 80, but=(str(cache_dir),))


# -- explain -----------------------------------------------------------------------------
@pytest.fixture
def kernel(tmp_path):
    project = tmp_path / "project"
    (project / "inc").mkdir(parents=True)
    (project / "inc2").mkdir()
    (project / "inc" / "v.h").write_text("#define V 1\n")
    (project / "k.c").write_text('#include "v.h"\n#define VALUE (V + X)\n')
    return project


def _explain(project: Path, cache_dir: Path, *more: str) -> Ran:
    return cli(
        "explain",
        str(project / "k.c"),
        "--backend",
        "fake",
        "--source-root",
        str(project),
        "-I",
        str(project / "inc"),
        "--cache-dir",
        str(cache_dir),
        *more,
    )


def _build(project: Path, cache_dir: Path, **kw) -> safejit.Artifact:
    cfg = safejit.Config.from_env(backend="fake", cache_dirs=(str(cache_dir),), source_roots=(str(project),))
    kw.setdefault("include_dirs", (str(project / "inc"),))
    with safejit.Runtime(config=cfg) as rt:
        return rt.build(rt.source(project / "k.c"), **kw)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (("-D", "X=3"), "define X: 3 here, 2 there"),
        (("-D", "X=2", "-D", "Y"), "define Y: here only"),
        (("-D", "X=2", "--flag=-O2"), "flag -O2: here only"),
        (("-D", "X=2", "-I", "{inc2}"), "include dir s0/inc2: here only"),
        (("-D", "X=2", "--extra", "n=5"), "extra n: 5 here, 4 there"),
        (("-D", "X=2", "--arch", "sm_90"), "arch sm_90 here, - there"),
    ],
)
def test_explain_names_the_input_that_differs_from_the_nearest_build(kernel, cache_dir, monkeypatch, change, says):
    monkeypatch.setenv("SAFEJIT_DECLARED_EXTRAS", "n")
    art = _build(kernel, cache_dir, defines={"X": 2}, extras={"n": 4})
    if "--extra" not in change:
        change = (*change, "--extra", "n=4")
    change = tuple(c.replace("{inc2}", str(kernel / "inc2")) for c in change)
    if "--arch" in change:  # (the fake backend keeps arch as given)
        pass
    ran = _explain(kernel, cache_dir, *change)
    assert ran.rc == 1 and "miss: never built with these inputs" in ran.out, ran
    assert f"nearest    {art.build_key[:8]}" in ran.out
    assert says in ran.out


def test_explain_of_a_source_outside_the_roots_says_the_option_that_declares_one(kernel, cache_dir):
    """It said to declare the root in Config.source_roots: on the command line that is
    --source-root."""
    ran = cli("explain", str(kernel / "k.c"), "--backend", "fake", "--cache-dir", str(cache_dir))
    assert ran.rc == 2 and "PathConfinementError" in ran.err and "--source-root DIR" in ran.err, ran


def test_explain_names_a_changed_source(kernel, cache_dir):
    _build(kernel, cache_dir, defines={"X": 2})
    (kernel / "k.c").write_text('#include "v.h"\n#define VALUE (V + X + 1)\n')
    ran = _explain(kernel, cache_dir, "-D", "X=2")
    assert ran.rc == 1 and "differs    the source text differs" in ran.out


def test_explain_hits_and_names_a_changed_header(kernel, cache_dir):
    _build(kernel, cache_dir, defines={"X": 2})
    hit = _explain(kernel, cache_dir, "-D", "X=2")
    assert hit.rc == 0 and hit.out.startswith("hit: a leaf verifies") and "leaf " in hit.out
    (kernel / "inc" / "v.h").write_text("#define V 5\n")
    miss = _explain(kernel, cache_dir, "-D", "X=2")
    assert miss.rc == 1 and "a dependency changed" in miss.out and str(kernel / "inc" / "v.h") in miss.out


def test_explain_takes_tenant_and_says_when_there_is_no_other_build(kernel, cache_dir):
    cfg = safejit.Config(backend="fake", cache_dirs=(str(cache_dir),), source_roots=(str(kernel),), tenant="team-a")
    with safejit.Runtime(config=cfg) as rt:
        rt.build(rt.source(kernel / "k.c"), include_dirs=(str(kernel / "inc"),), defines={"X": 2})
    assert _explain(kernel, cache_dir, "-D", "X=2", "--tenant", "team-a").rc == 0
    other = _explain(kernel, cache_dir, "-D", "X=2")
    assert other.rc == 1 and "no other build of k in this cache (same tenant and backend)" in other.out


EXPLAIN_KEYS = {"result", "reason", "miss", "kernel", "build_key", "path", "leaf", "leaf_id", "nearest"}


def test_explain_json_keys(kernel, cache_dir):
    art = _build(kernel, cache_dir, defines={"X": 2})
    hit = json.loads(_explain(kernel, cache_dir, "-D", "X=2", "--json").out)
    assert set(hit) == EXPLAIN_KEYS and (hit["result"], hit["leaf"], hit["nearest"]) == ("hit", art.path, None)
    miss = json.loads(_explain(kernel, cache_dir, "-D", "X=9", "--json").out)
    assert (miss["result"], miss["miss"]) == ("miss", "absent")
    assert set(miss["nearest"]) == {"id", "path", "build_key", "created", "differs"}
    assert miss["nearest"]["differs"] == [{"input": "defines", "detail": "define X: 9 here, 2 there"}]


def test_explain_extra_values_are_json_like_the_program_passes_them(kernel, cache_dir, monkeypatch):
    monkeypatch.setenv("SAFEJIT_DECLARED_EXTRAS", "sm_count,label")
    _build(kernel, cache_dir, defines={"X": 2}, extras={"sm_count": 132, "label": "a b"})
    ran = _explain(kernel, cache_dir, "-D", "X=2", "--extra", "sm_count=132", "--extra", 'label="a b"')
    assert ran.rc == 0, ran


# -- demo, warm, logging ------------------------------------------------------------------
def test_demo_keeps_its_leaf_and_prints_a_labelled_stats_table(tmp_path):
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": ""}
    out = run("demo", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "cold compile" in out.stdout and "memory hit" in out.stdout and "fresh process" in out.stdout
    assert "(disk hit, verified; compiles there: 0)" in out.stdout
    assert "a first run also probes the compiler" in out.stdout
    cache = tmp_path / "home" / ".cache" / "safejit"
    assert str(cache) in out.stdout
    lines = out.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("COUNTER")))
    assert lines[header].split() == ["COUNTER", "VALUE", "MEANING"]
    assert lines[header + 1].split()[:3] == ["compiles", "1", "kernels"]
    assert any(line.split()[:2] == ["memory_hits", "1,000"] for line in lines)
    (leaf,) = leaves(cache)
    assert f"leaf kept       {leaf.id}" in out.stdout and leaf.path in out.stdout
    _fits(out.stdout, 80, but=(str(cache),))
    removed = run("demo", "--no-keep", env=env)
    assert removed.returncode == 0 and "leaf removed" in removed.stdout
    assert [i.path for i in leaves(cache)] == [leaf.path]  # the first one stays, the second went


def test_the_library_logs_compile_and_disk_hit_lines(cache_dir, caplog):
    import logging

    caplog.set_level(logging.DEBUG, logger="safejit")
    cfg = safejit.Config(backend="fake", cache_dirs=(str(cache_dir),))
    with safejit.Runtime(config=cfg) as rt:
        art = rt.build(SRC)
    with safejit.Runtime(config=cfg) as rt:
        rt.compile(SRC)
    lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("safejit")]
    assert lines[0] == ("safejit.runtime", "INFO", f"compiling k (fake, build key {art.build_key[:16]})")
    assert lines[1][:2] == ("safejit.runtime", "INFO") and lines[1][2].startswith("compiled k in ")
    assert ("safejit.runtime", "DEBUG", f"disk hit for k: {art.path}") in lines


def test_the_library_logs_a_failed_compile(make_runtime, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="safejit")
    rt = make_runtime()
    with pytest.raises(safejit.CompileError):
        rt.compile(safejit.Source("int f(void) { return 1 }\n", "bad"))
    (line,) = [r.getMessage() for r in caplog.records if "failed after" in r.getMessage()]
    assert line.startswith("compiling bad failed after ") and line.endswith("exited with 1")


def test_verbose_shows_the_library_lines_on_stderr(tmp_path):
    out = run("-v", "demo", "--no-keep", "--cache-dir", str(tmp_path), env={"HOME": str(tmp_path)})
    assert out.returncode == 0
    assert "INFO safejit.runtime: compiling demo (host, build key " in out.stderr
    assert "INFO safejit.runtime: compiled demo in " in out.stderr


def _recorded(tmp_path: Path, kernel: Path) -> Path:
    """An inventory of one compile of ``kernel``'s k.c (its cache ``c1``), and an empty
    cache dir ``c2`` to warm."""
    inventory = tmp_path / "inventory.jsonl"
    cfg = safejit.Config(
        backend="fake", cache_dirs=(str(tmp_path / "c1"),), source_roots=(str(kernel),), inventory=str(inventory)
    )
    with safejit.Runtime(config=cfg) as rt:
        rt.compile(rt.source(kernel / "k.c"), include_dirs=(str(kernel / "inc"),), defines={"X": 1})
    (tmp_path / "c2").mkdir()
    return inventory


def test_warm_says_why_requests_were_skipped_and_fails(tmp_path, kernel):
    inventory = _recorded(tmp_path, kernel)
    out = run("warm", str(inventory), "-j", "1", "--cache-dir", str(tmp_path / "c2"), env={"SAFEJIT_BACKEND": "fake"})
    assert out.returncode == 1 and "1 requests: skipped 1" in out.stdout
    assert "a root it names is not declared here" in out.stdout
    assert "    k: it names s0; declared here: none" in out.stdout  # (which request, which root)


def test_warm_replays_what_compiled_and_shows_a_compile_log_a_line_each(tmp_path):
    """A request that failed to compile was recorded, so every later warm of that
    inventory failed (exit 1); and a compiler log was printed on one line, its newlines
    shown as \\x0a. Only what compiled is recorded; a log is shown a line each, indented."""
    project = tmp_path / "project"
    (project / "inc").mkdir(parents=True)
    (project / "inc" / "v.h").write_text("#define V 1\n")
    inventory = tmp_path / "inventory.jsonl"
    cfg = safejit.Config(cache_dirs=(str(tmp_path / "c1"),), source_roots=(str(project),), inventory=str(inventory))
    with safejit.Runtime(config=cfg) as rt:
        rt.compile(
            safejit.Source('#include "v.h"\nint v(void) { return V; }\n', "v"), include_dirs=(str(project / "inc"),)
        )
        with pytest.raises(safejit.CompileError):
            rt.compile(safejit.Source("int typo(void) { return 1 }\n", "typo"))
    assert [json.loads(line)["name"] for line in inventory.read_text().splitlines()] == ["v"]
    out = run("warm", str(inventory), "--cache-dir", str(tmp_path / "c2"), "--source-root", str(project))
    assert out.returncode == 0 and "1 requests: built 1" in out.stdout, out.stdout + out.stderr
    (project / "inc" / "v.h").write_text("#define V 1 +\n")  # (the header breaks: the replay fails)
    out = run("warm", str(inventory), "--cache-dir", str(tmp_path / "c3"), "--source-root", str(project))
    assert out.returncode == 1 and "\\x0a" not in out.stdout
    failed = out.stdout.splitlines()
    first = next(i for i, line in enumerate(failed) if line.startswith("failed: v: "))
    assert failed[first + 1].startswith("    ") and "error" in out.stdout


def test_every_stats_counter_has_a_meaning_in_the_demo_table(make_runtime):
    from safejit.cli.demo import COUNTER_MEANINGS

    assert set(make_runtime().stats()) <= set(COUNTER_MEANINGS)


@pytest.mark.parametrize("text", ["not json at all\n", '{"v": 999, "source": "x"}\n', "[1, 2]\n"])
def test_warm_on_a_file_that_is_no_inventory_fails(tmp_path, text):
    """A wrong or corrupt inventory (or a newer format's) said '0 requests' and exit 0:
    a CI warm step passed having warmed nothing."""
    inventory = tmp_path / "inventory.jsonl"
    inventory.write_text(text * 3)
    (tmp_path / "c").mkdir()
    out = run("warm", str(inventory), "-j", "1", "--cache-dir", str(tmp_path / "c"))
    assert out.returncode == 2 and "no line is a request" in out.stderr and "(3 read)" in out.stderr
    inventory.write_text("")
    assert run("warm", str(inventory), "-j", "1", "--cache-dir", str(tmp_path / "c")).returncode == 0


def test_verify_checks_the_leaves_whatever_else_the_environment_holds(cache_dir, monkeypatch):
    """verify began reading the whole configuration (for the signature keys): an unrelated
    bad setting (SAFEJIT_TENANT=tmp) stopped it with exit 2 before any leaf was read."""
    _fill(cache_dir, "a")
    monkeypatch.setenv("SAFEJIT_TENANT", "tmp")
    ran = cli("verify", "--cache-dir", str(cache_dir))
    assert ran.rc == 0 and "1/1 leaves verify" in ran.out, (ran.out, ran.err)
    assert "signatures not checked" in ran.err


def test_explain_takes_the_name_the_source_was_compiled_under(kernel, cache_dir):
    cfg = safejit.Config(backend="fake", cache_dirs=(str(cache_dir),), source_roots=(str(kernel),))
    with safejit.Runtime(config=cfg) as rt:
        rt.build(rt.source(kernel / "k.c", name="saxpy"), include_dirs=(str(kernel / "inc"),), defines={"X": 2})
    assert _explain(kernel, cache_dir, "-D", "X=2", "--name", "saxpy").rc == 0
    other = _explain(kernel, cache_dir, "-D", "X=2")
    assert other.rc == 1 and "no other build of k" in other.out


def test_verify_checks_the_signatures_of_the_tenant_it_is_given(cache_dir, monkeypatch):
    """Signatures are checked for one tenant's leaves (as that tenant's processes check
    them); --tenant names it, and the text says which."""
    from safejit.policy.trust import Ed25519Signer

    builder, other = Ed25519Signer.generate(), Ed25519Signer.generate()
    cfg = safejit.Config(backend="fake", cache_dirs=(str(cache_dir),), tenant="t1", signing_key=builder.private_pem())
    with safejit.Runtime(config=cfg) as rt:
        rt.build(safejit.Source("#define VALUE 1\n", "k"))
    monkeypatch.setenv("SAFEJIT_VERIFY_KEYS", f"{other.key_id}={other.public_key.hex()}")
    default = cli("verify", "--cache-dir", str(cache_dir))
    assert default.rc == 0 and "1/1 leaves verify" in default.out and "tenant 'default'" in default.out
    t1 = cli("verify", "--cache-dir", str(cache_dir), "--tenant", "t1")
    assert t1.rc == 1 and "0/1 leaves verify" in t1.out and "unknown_key" in t1.out and "tenant 't1'" in t1.out


def test_warm_verbose_shows_each_requests_library_lines_and_takes_v_after_the_command(tmp_path, kernel):
    """The requests run in processes of their own: their log lines reached no one (-v
    printed nothing), and ``warm -v`` was a usage error."""
    inventory = _recorded(tmp_path, kernel)
    args = (str(inventory), "-j", "1", "--cache-dir", str(tmp_path / "c2"), "--source-root", str(kernel))
    for argv in (("-v", "warm", *args), ("warm", "-v", *args)):
        out = run(*argv, env={"SAFEJIT_BACKEND": "fake"})
        assert out.returncode == 0 and "INFO safejit.runtime: compil" in out.stderr, (argv, out.stderr[-2000:])
        shutil.rmtree(tmp_path / "c2" / "v1", ignore_errors=True)  # (the next compiles again)
    quiet = run("warm", *args, env={"SAFEJIT_BACKEND": "fake"})
    assert quiet.returncode == 0 and "INFO" not in quiet.stderr
