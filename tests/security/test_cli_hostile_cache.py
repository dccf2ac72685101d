"""The command line on a hostile cache (issue 15, class 8): whoever can write a shared
cache root can plant symlinks where directories should be, files and FIFOs where
leaves should be, garbage manifests and usage records, and names full of terminal
escape sequences. One test per attack; each asserts the outcome (exit status, the
finding reported) *and* that nothing outside the cache was deleted, changed or
shown, that no traceback came out, and that no control character reached the
terminal."""

from __future__ import annotations

import io
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

import safejit
from safejit.cache.staging import settle
from safejit.cli import main
from safejit.cli._out import Out
from safejit.keys import digest_bytes
from tests.conftest import leaves

SRC = safejit.Source("#define VALUE 7\n", "k")
#: What only the outside holds: it must never appear in any output.
MARK = "0utside-m4rk"
#: A control character, C1 control, bidi override or surrogate: none may reach the terminal.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
#: Names planted in the cache: OSC (title, hyperlink), CSI, C1 CSI, a bidi override,
#: a forged output line.
EVIL = ["t\x1b]0;pwned\x07", "b\x1b[31mred\x1b[0m", "c\x9b2J", "rtl\u202egnp.exe", "nl\nFAIL forged: line"]


@dataclass(frozen=True)
class Ran:
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def cli(*args: str, width: int = 80) -> Ran:
    """``safejit ARGS`` in this process, its output captured (no terminal: plain text)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        rc = main(list(args), out=Out(stdout, stderr, use_rich=False, width=width))
    except SystemExit as exc:  # (argparse)
        rc = int(exc.code or 0)
    ran = Ran(rc, stdout.getvalue(), stderr.getvalue())
    assert "Traceback" not in ran.text and "internal error" not in ran.text, ran.text
    assert not RAW.search(ran.text), f"raw control character in output: {ran.text!r}"
    ran.text.encode("utf-8")  # (no lone surrogate either)
    return ran


def snapshot(path: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under ``path``: kind, contents or target, mtime — to compare after."""
    snap: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                snap[p] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                snap[p] = ("file", Path(p).read_bytes(), st.st_mtime_ns)
            else:
                snap[p] = (stat.S_IFMT(st.st_mode), st.st_mtime_ns)
    return snap


def _age(path: Path, days: float = 30) -> None:
    t = os.path.getmtime(path) if not path.is_symlink() else os.lstat(path).st_mtime
    t -= days * 86400
    os.utime(path, (t, t), follow_symlinks=False)


def _leaf(make_runtime, **define) -> Path:
    rt = make_runtime(backend="fake")
    path = Path(rt.build(SRC, defines=define or None).path)
    rt.close()
    settle()  # (the spare work dirs a runtime prepares in the background)
    return path


def _forge(leaf: Path, change) -> None:
    """Rewrite a leaf's manifest and its marker consistently (what a writer of the root can do)."""
    data = json.loads((leaf / "manifest.json").read_text())
    change(data)
    raw = json.dumps(data).encode()
    (leaf / "manifest.json").write_bytes(raw)
    (leaf / ".committed").write_bytes(digest_bytes(raw).encode() + b"\n")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the cache, laid out like a cache's v1 (old residue, old
    records, idle locks, leaves), with a marker in every file."""
    out = tmp_path / "outside"
    for sub in ("tmp/old", "quarantine/old", "usage/default", "locks", "default/fake/ab", "tools/shim-1"):
        (out / sub).mkdir(parents=True)
    (out / "tmp" / "old" / "f").write_text(MARK)
    (out / "tools" / "shim-1" / "safejit-shim").write_text(MARK)
    (out / "quarantine" / "old" / "f").write_text(MARK)
    record = {"backend": "fake", "counters": {"compiles": 987654321}, "compile_seconds": []}
    (out / "usage" / "default" / "r.json").write_text(json.dumps(record))
    (out / "locks" / ("a" * 64 + ".lock")).write_text("")
    (out / "secret").write_text(MARK)
    for entry in out.rglob("*"):
        _age(entry)
    return out


def _assert_outside_intact(outside: Path, before: dict[str, tuple[object, ...]]) -> None:
    assert snapshot(outside) == before


def _no_mark(*runs: Ran) -> None:
    for ran in runs:
        assert MARK not in ran.text and "987654321" not in ran.text and "987,654,321" not in ran.text


EVERY_COMMAND = (
    ("ls",),
    ("ls", "--json"),
    ("ls", "--paths"),
    ("stats",),
    ("stats", "--json"),
    ("verify",),
    ("verify", "--json"),
    ("verify", "--fix"),
    ("prune", "--max-bytes", "0", "--grace", "0s"),
    ("gc", "--older-than", "0s"),
)


def test_gc_with_v1_a_symlink_out_of_the_root_deletes_nothing_and_reports_it(cache_dir, outside):
    before = snapshot(outside)
    (cache_dir / "v1").symlink_to(outside, target_is_directory=True)
    gc = cli("gc", "--older-than", "0s", "--cache-dir", str(cache_dir))
    assert gc.rc == 1 and "v1 directory is not a directory" in gc.out
    for args in EVERY_COMMAND:
        ran = cli(*args, "--cache-dir", str(cache_dir))
        assert ran.rc in (0, 1), (args, ran)
        _no_mark(ran)
    assert (cache_dir / "v1").is_symlink()  # (not ours to remove: the operator decides)
    _assert_outside_intact(outside, before)


@pytest.mark.parametrize("reserved", ["tmp", "quarantine", "usage", "locks", "tools"])
def test_gc_with_a_cache_directory_symlinked_out_deletes_nothing_outside(make_runtime, cache_dir, outside, reserved):
    _leaf(make_runtime)
    before = snapshot(outside)
    target = cache_dir / "v1" / reserved
    if target.exists():
        import shutil

        shutil.rmtree(target)
    target.symlink_to(outside / reserved, target_is_directory=True)
    verify = cli("verify", "--cache-dir", str(cache_dir))
    assert verify.rc == 1 and f"{reserved} directory that is not a directory (a symlink)" in verify.out
    gc = cli("gc", "--older-than", "0s", "--cache-dir", str(cache_dir))
    assert gc.rc == 0
    assert not target.is_symlink()  # the planted link itself is gone (it held nothing of the cache)
    _assert_outside_intact(outside, before)
    assert len(leaves(cache_dir)) == 1
    assert cli("verify", "--cache-dir", str(cache_dir)).rc == 0


def test_gc_removes_the_obsolete_tools_dir_but_nothing_its_symlinks_point_to(make_runtime, cache_dir, outside):
    _leaf(make_runtime)
    before = snapshot(outside)
    tools = cache_dir / "v1" / "tools"
    (tools / "shim-1").mkdir(parents=True)
    (tools / "shim-1" / "safejit-shim").write_bytes(b"\x7fELF planted")
    (tools / "probe.json").write_text("{}")
    (tools / "out").symlink_to(outside, target_is_directory=True)
    (tools / "shim-1" / "file").symlink_to(outside / "tmp" / "f")
    gc = cli("gc", "--cache-dir", str(cache_dir), "--json")  # (the default age: it goes whatever its age)
    assert gc.rc == 0 and json.loads(gc.out)["roots"][0]["obsolete"] == 1
    assert not os.path.lexists(tools)
    _assert_outside_intact(outside, before)
    assert len(leaves(cache_dir)) == 1
    assert cli("verify", "--cache-dir", str(cache_dir)).rc == 0


@pytest.mark.parametrize("level", ["tenant", "backend", "shard", "build", "leaf"])
def test_a_tree_level_symlinked_out_is_a_finding_and_never_pruned_through(make_runtime, cache_dir, outside, level):
    leaf = _leaf(make_runtime)
    build = leaf.parent
    path = {
        "tenant": cache_dir / "v1" / "evil",
        "backend": cache_dir / "v1" / "default" / "evil",
        "shard": build.parent.parent / "ee",
        "build": build.parent / ("build-" + "e" * 64),
        "leaf": build / ("deps-" + "e" * 64),
    }[level]
    # outside: a look-alike tree (a leaf with a manifest) the symlink leads into
    fake_leaf = outside / "default" / "fake" / "ab" / ("build-" + "a" * 64) / ("deps-" + "b" * 64)
    fake_leaf.mkdir(parents=True)
    (fake_leaf / "manifest.json").write_text(MARK)
    _age(fake_leaf)
    before = snapshot(outside)
    path.symlink_to(outside, target_is_directory=True)
    for args in EVERY_COMMAND[:7]:
        ran = cli(*args, "--cache-dir", str(cache_dir))
        assert ran.rc == 1, (args, ran)
        _no_mark(ran)
    assert "a symlink" in cli("verify", "--cache-dir", str(cache_dir)).out
    pruned = cli("prune", "--max-bytes", "0", "--grace", "0s", "--cache-dir", str(cache_dir))
    assert pruned.rc == 0
    gc = cli("gc", "--cache-dir", str(cache_dir), "--json")
    assert json.loads(gc.out)["roots"][0]["damaged"] == 1
    assert not os.path.lexists(path)  # moved into quarantine, the link itself
    _assert_outside_intact(outside, before)
    assert cli("verify", "--cache-dir", str(cache_dir)).rc == 0


@pytest.mark.parametrize("kind", ["file", "fifo", "symlink-to-outside-file"])
def test_a_leaf_that_is_a_file_fifo_or_symlink_is_a_finding(make_runtime, cache_dir, outside, kind):
    leaf = _leaf(make_runtime)
    import shutil

    shutil.rmtree(leaf)
    if kind == "file":
        leaf.write_text("x")
    elif kind == "fifo":
        os.mkfifo(leaf)
    else:
        leaf.symlink_to(outside / "secret")
    before = snapshot(outside)
    for args in (("ls",), ("stats",), ("verify",)):
        ran = cli(*args, "--cache-dir", str(cache_dir))
        assert ran.rc == 1 and "a leaf that is not a directory" in ran.out, (args, ran)
        _no_mark(ran)
    fixed = cli("verify", "--fix", "--cache-dir", str(cache_dir))
    assert fixed.rc == 1 and "(quarantined)" in fixed.out
    assert not os.path.lexists(leaf)
    assert cli("verify", "--cache-dir", str(cache_dir)).rc == 0
    _assert_outside_intact(outside, before)


GARBAGE_RECORDS = {
    "deep-nesting": b"[" * 100_000 + b"]" * 100_000,
    "deep-object": b'{"backend":"fake","counters":' + b'{"a":' * 5000 + b"1" + b"}" * 5001,
    "huge-number": b'{"backend":"fake","counters":{"compiles":1e999}}',
    "huge-int": b'{"backend":"fake","counters":{"compiles":' + b"9" * 400 + b"}}",
    "negative": b'{"backend":"fake","counters":{"compiles":-5}}',
    "wrong-types": b'{"backend":7,"counters":[1,2],"compile_seconds":"fast"}',
    "nan-latency": b'{"backend":"fake","counters":{},"compile_seconds":[NaN]}',
    "invalid-utf8": b'{"backend":"\xff\xfe","counters":{}}',
    "nul-bytes": b'{"backend":"fake\x00","counters":{}}\x00\x00',
    "escapes-in-fields": b'{"backend":"\\u001b]0;pwned\\u0007","counters":{"\\u001b[2J":1}}',
    "not-json": b"\x1b]0;pwned\x07 not json",
    "empty": b"",
    "too-large": b'{"backend":"fake","counters":{},"pad":"' + b"x" * (2 << 20) + b'"}',
}


@pytest.mark.parametrize("name", sorted(GARBAGE_RECORDS))
def test_planted_usage_record_is_a_finding_never_a_traceback(make_runtime, cache_dir, name):
    make_runtime(backend="fake").compile(SRC)  # a real record too, when the runtime closes
    records = cache_dir / "v1" / "usage" / "default"
    records.mkdir(parents=True, exist_ok=True)
    planted = records / f"planted-{name}.json"
    planted.write_bytes(GARBAGE_RECORDS[name])
    stats = cli("stats", "--cache-dir", str(cache_dir))
    assert stats.rc == 1 and f"planted-{name}.json" in stats.out and "usage" in stats.out
    as_json = json.loads(cli("stats", "--json", "--cache-dir", str(cache_dir)).out)
    assert [f["kind"] for f in as_json["findings"]] == ["usage"]
    verify = cli("verify", "--cache-dir", str(cache_dir))
    assert verify.rc == 1 and "1 usage records are not valid" in verify.out
    assert "(removed)" in cli("verify", "--fix", "--cache-dir", str(cache_dir)).out
    assert not planted.exists()
    assert cli("stats", "--cache-dir", str(cache_dir)).rc == 0


@pytest.mark.parametrize("kind", ["symlink-to-outside", "fifo", "directory", "tenant-symlink"])
def test_planted_usage_entry_that_is_not_a_file_is_a_finding_and_not_read(cache_dir, outside, kind):
    records = cache_dir / "v1" / "usage" / "default"
    records.mkdir(parents=True)
    entry = records / "r.json"
    if kind == "symlink-to-outside":
        entry.symlink_to(outside / "usage" / "default" / "r.json")
    elif kind == "fifo":
        os.mkfifo(entry)
    elif kind == "directory":
        entry.mkdir()
    else:
        entry = cache_dir / "v1" / "usage" / "evil"
        entry.symlink_to(outside / "usage" / "default", target_is_directory=True)
    before = snapshot(outside)
    stats = cli("stats", "--cache-dir", str(cache_dir))
    assert stats.rc == 1 and "FAIL" in stats.out
    _no_mark(stats, cli("stats", "--json", "--cache-dir", str(cache_dir)))
    assert cli("verify", "--fix", "--cache-dir", str(cache_dir)).rc == 1
    assert not os.path.lexists(entry)
    _assert_outside_intact(outside, before)


GARBAGE_MANIFESTS = {
    "deep-nesting": b"[" * 100_000 + b"]" * 100_000,
    "huge-number": None,  # (built below: a consistent forgery)
    "wrong-types": b'{"schema":2,"build_key":7,"deps":"all"}',
    "invalid-utf8": b'{"schema":2,"name":"\xff\xfe"}',
    "nul-bytes": b"\x00" * 64,
    "escapes": b"\x1b]0;pwned\x07\x1b[2J",
}


@pytest.mark.parametrize("name", sorted(GARBAGE_MANIFESTS))
def test_planted_manifest_is_a_finding_in_ls_inspect_and_verify(make_runtime, cache_dir, name):
    leaf = _leaf(make_runtime)
    if GARBAGE_MANIFESTS[name] is None:
        _forge(leaf, lambda m: m.update(created=10**400))
    else:
        (leaf / "manifest.json").write_bytes(GARBAGE_MANIFESTS[name])
    ls = cli("ls", "--cache-dir", str(cache_dir))
    assert ls.rc == 1 and "the manifest cannot be read" in ls.out and " ? " in ls.out
    (info,) = leaves(cache_dir)
    shown = cli("inspect", info.id, "--cache-dir", str(cache_dir))
    assert shown.rc == 1 and "the manifest cannot be read" in shown.out
    assert json.loads(cli("inspect", info.id, "--json", "--cache-dir", str(cache_dir)).out)["manifest"] is None
    verify = cli("verify", "--cache-dir", str(cache_dir))
    assert verify.rc == 1 and "0/1 leaves verify" in verify.out


@pytest.mark.parametrize("kind", ["fifo", "symlink-to-outside", "directory"])
def test_a_manifest_that_is_not_a_regular_file_is_not_read(make_runtime, cache_dir, outside, kind):
    leaf = _leaf(make_runtime)
    manifest = leaf / "manifest.json"
    good = manifest.read_bytes()
    manifest.unlink()
    (outside / "manifest.json").write_bytes(good.replace(b'"name":"k"', f'"name":"{MARK}"'.encode()))
    if kind == "fifo":
        os.mkfifo(manifest)
    elif kind == "directory":
        manifest.mkdir()
    else:
        manifest.symlink_to(outside / "manifest.json")
    (info,) = leaves(cache_dir)
    for args in (("ls",), ("inspect", info.id), ("inspect", info.id, "--json"), ("verify",), ("verify", "--json")):
        ran = cli(*args, "--cache-dir", str(cache_dir))
        assert ran.rc == 1, (args, ran)
        _no_mark(ran)


def _evil_cache(make_runtime, cache_dir: Path) -> Path:
    """A cache whose names and manifest fields hold escape sequences: leaves under
    tenant and backend directories named so, one under a name that is not UTF-8, a
    forged manifest whose every shown field is hostile, and usage records under
    hostile tenant names."""
    leaf = _leaf(make_runtime)
    base = cache_dir / "v1"
    import shutil

    rel = leaf.relative_to(base / "default" / "fake")
    for tenant in [*EVIL[:3], os.fsdecode(b"bad-\xff\xfe-utf8")]:
        shutil.copytree(leaf, base / tenant / "fake" / rel)
    shutil.copytree(leaf, base / "default" / EVIL[1] / rel)

    def hostile(m: dict) -> None:
        m["name"] = "k"  # (explain's nearest build: same kernel)
        m["kernels"] = EVIL
        m["argv"] = [*m["argv"], *EVIL]
        m["deps"] = [["s0", e, "0" * 64] for e in EVIL]
        m["negatives"] = [["t0", e] for e in EVIL]
        m["toolchain"] = {"compiler": EVIL[0], "version": EVIL[1], "digest": EVIL[2]}
        m["timings"] = dict.fromkeys(EVIL, 1.0)
        m["inputs"]["flags"] = EVIL
        m["inputs"]["defines"] = [[f"D{i}", e] for i, e in enumerate(EVIL)]
        m["inputs"]["extras"] = [[e, e] for e in EVIL]

    _forge(leaf, hostile)
    for i, tenant in enumerate(EVIL):
        d = base / "usage" / tenant
        d.mkdir(parents=True)
        (d / f"r{i}.json").write_text(json.dumps({"backend": tenant, "counters": {"compiles": 3}}))
        (d / f"bad-{tenant}.json").write_text("\x1b]0;pwned\x07")
    return leaf


def test_escape_sequences_in_names_and_fields_never_reach_the_terminal(make_runtime, cache_dir, tmp_path):
    leaf = _evil_cache(make_runtime, cache_dir)
    infos = {i.path: i for i in leaves(cache_dir)}
    c = ("--cache-dir", str(cache_dir))
    runs = [cli(*args, *c) for args in EVERY_COMMAND[:8]]
    runs += [cli("inspect", str(leaf), *c), cli("inspect", str(leaf), "--deps", *c)]
    runs += [cli("inspect", infos[p].id, *c) for p in infos if p != str(leaf)][:2]
    text = "".join(r.text for r in runs)
    # shown, escaped: OSC, CSI, C1 CSI, the bidi override, the forged newline, bytes not UTF-8
    for shown in (
        "t\\x1b]0;pwned\\x07",
        "b\\x1b[31mred\\x1b[0m",
        "c\\x9b2J",
        "rtl\\u202egnp.exe",
        "nl\\x0aFAIL forged",
    ):
        assert shown in text, shown
    assert "bad-\\xff\\xfe-utf8" in text
    assert not any(line.startswith("FAIL forged") for line in text.splitlines())


def test_explain_shows_a_hostile_nearest_build_escaped(make_runtime, cache_dir, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "k.c").write_text("#define VALUE 7\n")
    rt = make_runtime(backend="fake", source_roots=(str(project),))
    leaf = Path(rt.build(rt.source(project / "k.c"), defines={"X": "1"}).path)

    def hostile(m: dict) -> None:
        m["inputs"]["flags"] = EVIL
        m["inputs"]["defines"] = [["X", EVIL[0]]]
        m["toolchain"]["version"] = EVIL[1]
        m["toolchain"]["digest"] = EVIL[2]

    _forge(leaf, hostile)
    args = ("explain", str(project / "k.c"), "--backend", "fake", "--source-root", str(project))
    ran = cli(*args, "-D", "X=2", "--cache-dir", str(cache_dir))
    assert ran.rc == 1 and "nearest" in ran.out
    assert "define X: 2 here, t\\x1b]0;pwned\\x07 there" in ran.out
    assert "flag b\\x1b[31mred\\x1b[0m: there only" in ran.out
    as_json = json.loads(cli(*args, "-D", "X=2", "--json", "--cache-dir", str(cache_dir)).out)
    details = [d["detail"] for d in as_json["nearest"]["differs"]]
    assert f"define X: 2 here, {EVIL[0]} there" in details  # (JSON escaped it itself)


def _strings(data: object) -> set[str]:
    if isinstance(data, str):
        return {data}
    if isinstance(data, dict):
        data = [*data.keys(), *data.values()]
    return set().union(*map(_strings, data)) if isinstance(data, list) else set()


def test_json_output_escapes_control_characters_itself(make_runtime, cache_dir):
    _evil_cache(make_runtime, cache_dir)
    for args in (("ls", "--json"), ("stats", "--json"), ("verify", "--json")):
        ran = cli(*args, "--cache-dir", str(cache_dir))
        assert ran.out.isascii() and "\\u001b" in ran.out  # escaped by the encoder
        assert any(EVIL[0] in s for s in _strings(json.loads(ran.out)))  # round-trips to the exact names
    tenants = {leaf["tenant"] for leaf in json.loads(cli("ls", "--json", "--cache-dir", str(cache_dir)).out)["leaves"]}
    assert {EVIL[0], os.fsdecode(b"bad-\xff\xfe-utf8")} <= tenants


def test_library_warnings_about_hostile_paths_are_escaped_on_stderr(cache_dir, caplog):
    from safejit.cli import _logging

    stream = io.StringIO()
    with _logging(False, stream):
        safejit.cache.disk.logger.warning("quarantining %s: not a directory", "/c/v1/t\x1b]0;pwned\x07")
    assert stream.getvalue() == "WARNING safejit.cache.disk: quarantining /c/v1/t\\x1b]0;pwned\\x07: not a directory\n"


def test_a_planted_cache_reached_through_a_symlinked_v1_is_not_shown(tmp_path):
    """Another cache (say, one the attacker cannot otherwise make us trust) reached through
    ``v1``: none of its leaves, manifests or records is listed or counted."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rt = safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(str(elsewhere),)))
    rt.compile(safejit.Source(f"#define {MARK.replace('-', '_')} 1\n", "secretkernel"))
    rt.close()
    cache = tmp_path / "root"
    cache.mkdir()
    (cache / "v1").symlink_to(elsewhere / "v1", target_is_directory=True)
    for args in EVERY_COMMAND[:7]:
        ran = cli(*args, "--cache-dir", str(cache))
        assert ran.rc == 1 and "secretkernel" not in ran.text, (args, ran)
    assert cli("inspect", leaves(elsewhere)[0].id, "--cache-dir", str(cache)).rc == 2  # not found here
    assert len(leaves(elsewhere)) == 1


def test_prune_never_deletes_through_a_tenant_dir_swapped_for_a_symlink_midway(cache_dir, tmp_path):
    """The race the descriptors close: between the walk and the delete, a writer of the
    root swaps a tenant directory for a symlink to a look-alike tree outside."""
    import shutil

    from safejit.cache import maintenance

    for tenant in ("a", "b"):
        cfg = safejit.Config(backend="fake", cache_dirs=(str(cache_dir),), tenant=tenant)
        with safejit.Runtime(config=cfg) as rt:
            rt.build(SRC)
    settle()
    first = next(i for i in leaves(cache_dir) if i.tenant == "a")
    _age(Path(first.path), days=2)  # (pruned first: least recently used)
    lookalike = tmp_path / "outside" / "b"
    shutil.copytree(cache_dir / "v1" / "b", lookalike, symlinks=True)
    before = snapshot(lookalike)

    def swap(done: int) -> None:
        if done == 1:
            os.rename(cache_dir / "v1" / "b", tmp_path / "b-moved")
            (cache_dir / "v1" / "b").symlink_to(lookalike, target_is_directory=True)

    report = maintenance.prune(str(cache_dir), max_bytes=0, grace_s=0, progress=swap)
    assert report.removed == 1  # only the leaf reached without a symlink
    assert snapshot(lookalike) == before
    assert len(list((tmp_path / "b-moved").rglob("artifact.fake"))) == 1


@pytest.mark.parametrize(
    ("name", "kind", "reason"),
    [
        ("artifact.fake", "fifo", "artifact"),
        ("artifact.fake", "symlink-to-outside", "artifact"),
        (".committed", "symlink-to-outside", "marker"),
        (".committed", "fifo", "marker"),
        ("manifest.json", "fifo", "manifest"),
    ],
)
def test_a_leaf_file_that_is_a_fifo_or_symlink_is_a_finding_and_not_read(
    make_runtime, cache_dir, outside, name, kind, reason
):
    leaf = _leaf(make_runtime)
    (leaf / name).unlink()
    if kind == "fifo":
        os.mkfifo(leaf / name)
    else:
        (leaf / name).symlink_to(outside / "secret")
    before = snapshot(outside)
    verify = cli("verify", "--cache-dir", str(cache_dir))
    assert verify.rc == 1 and f": {reason}: " in verify.out and "0/1 leaves verify" in verify.out
    _no_mark(verify, cli("verify", "--json", "--cache-dir", str(cache_dir)))
    assert "(quarantined)" in cli("verify", "--fix", "--cache-dir", str(cache_dir)).out
    assert leaves(cache_dir) == [] and cli("verify", "--cache-dir", str(cache_dir)).rc == 0
    _assert_outside_intact(outside, before)


@pytest.mark.parametrize("level", ["usage", "tenant"])
def test_a_usage_record_is_never_written_through_a_planted_symlink(cache_dir, outside, level):
    """A Runtime writes its usage record when it closes: through a ``v1/usage`` (or a
    tenant's usage dir) planted as a symlink out, it writes nothing (and says so)."""
    with safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(str(cache_dir),))) as rt:
        rt.compile(SRC)  # (makes v1)
    settle()
    import shutil

    shutil.rmtree(cache_dir / "v1" / "usage")
    if level == "usage":
        (cache_dir / "v1" / "usage").symlink_to(outside / "usage", target_is_directory=True)
    else:
        (cache_dir / "v1" / "usage").mkdir()
        (cache_dir / "v1" / "usage" / "default").symlink_to(outside / "usage" / "default", target_is_directory=True)
    before = snapshot(outside)
    cfg = safejit.Config(backend="fake", cache_dirs=(str(cache_dir),), on_cache_error="bypass")
    with safejit.Runtime(config=cfg) as rt:
        rt.compile(safejit.Source("#define VALUE 8\n", "k"))
    _assert_outside_intact(outside, before)
    with pytest.raises(safejit.CacheError, match="usage record"):
        with safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(str(cache_dir),))) as rt:
            rt.compile(safejit.Source("#define VALUE 9\n", "k"))
    _assert_outside_intact(outside, before)
