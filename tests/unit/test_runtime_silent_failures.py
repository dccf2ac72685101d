"""One test per silent failure mode of a JIT cache (issue: the spine).

Each runs the real compiler through the public API, on real files.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import safejit
from safejit.cache import staging as spares
from safejit.cache.disk import DiskTier
from safejit.cache.leaf import ArtifactInfo, VerifiedLeaf
from safejit.closure.depfiles import parse_depfile
from safejit.outcomes import Miss
from safejit.sandbox import lookups
from safejit.sandbox.runner import Sandbox
from tests.conftest import ADD_C, CLANG, KERNEL_WITH_HEADER, assert_cache_sound, leaves, settle, staging_residue


def _value_source(project: Path) -> safejit.Source:
    return safejit.Source(KERNEL_WITH_HEADER, "value")


def _compile_value(rt: safejit.Runtime, project: Path) -> safejit.Module:
    return rt.compile(_value_source(project), include_dirs=(str(project / "include"),))


def _fresh(make_runtime, project: Path) -> safejit.Runtime:
    return make_runtime(source_roots=(str(project),))


def test_hit_when_nothing_changed(make_runtime, project, cache_dir):
    first = _fresh(make_runtime, project)
    assert _compile_value(first, project).kernel("value")() == 42
    second = _fresh(make_runtime, project)
    mod = _compile_value(second, project)
    assert mod.kernel("value")() == 42
    assert mod.artifact.source == "disk"
    assert second.stats()["compiles"] == 0 and second.stats()["disk_hits"] == 1
    assert len(leaves(cache_dir)) == 1


def test_touch_only_change_does_not_rebuild(make_runtime, project, cache_dir):
    rt = _fresh(make_runtime, project)
    _compile_value(rt, project)
    inner = project / "include" / "inner.h"
    os.utime(inner, ns=(1, 1))
    inner.write_text(inner.read_text())  # rewrite, same bytes: new mtime and ctime
    settle()
    other = _fresh(make_runtime, project)
    assert _compile_value(other, project).kernel("value")() == 42
    assert other.stats()["compiles"] == 0
    live = make_runtime(source_roots=(str(project),), max_staleness_s=0)
    _compile_value(live, project)
    os.utime(inner)
    _compile_value(live, project)
    assert live.stats()["compiles"] == 0 and live.stats()["stale"] == 0


def test_transitive_header_edit_rebuilds_and_names_the_file(make_runtime, project, caplog):
    _compile_value(_fresh(make_runtime, project), project)
    inner = project / "include" / "inner.h"
    inner.write_text("#define INNER 99\n")
    settle()
    rt = _fresh(make_runtime, project)
    with caplog.at_level(logging.INFO, logger="safejit.runtime"):
        assert _compile_value(rt, project).kernel("value")() == 100
    assert rt.stats()["compiles"] == 1
    assert f"rebuilding value: a dependency changed ({inner})" in caplog.messages
    explanation = rt.explain(_value_source(project), include_dirs=(str(project / "include"),))
    assert explanation.result == "hit"


def test_explain_names_the_first_changed_dependency(make_runtime, project):
    rt = _fresh(make_runtime, project)
    _compile_value(rt, project)
    inner = project / "include" / "inner.h"
    inner.write_text("#define INNER 7\n")
    settle()
    explanation = rt.explain(_value_source(project), include_dirs=(str(project / "include"),))
    assert (explanation.result, explanation.path) == ("miss", str(inner))
    assert "dependency changed" in str(explanation)


def test_explain_of_a_key_never_built_names_what_differs_from_the_nearest_build(make_runtime, tmp_path):
    rt = make_runtime()
    code = "REAL twice(REAL x) { return 2 * x; }\n"
    rt.compile(safejit.Source(code, "twice"), defines={"REAL": "float"}, flags=("-O2",))
    rt.compile(safejit.Source("int other(void) { return 0; }\n", "other"))  # (another kernel: not a candidate)
    explanation = rt.explain(safejit.Source(code, "twice"), defines={"REAL": "double"}, flags=("-O2",))
    assert (explanation.result, explanation.miss) == ("miss", Miss.ABSENT)
    assert explanation.nearest is not None
    assert [(d.input, d.detail) for d in explanation.nearest.differs] == [
        ("defines", "define REAL: double here, float there")
    ]
    assert "differs in: define REAL: double here, float there" in str(explanation)
    never = rt.explain(safejit.Source("int lone(void) { return 1; }\n", "lone"))
    assert never.miss is Miss.ABSENT and never.nearest is None  # no other build of that kernel


def test_explain_walks_only_its_tenant_and_shows_planted_text_escaped(make_runtime, monkeypatch):
    """The nearest build is looked for in this tenant's and backend's leaves only (another
    tenant's cannot slow it down), and what another build's manifest says (unverified
    text) is shown with its control characters escaped."""
    from safejit.cache import maintenance

    code = "int f(void) { return X; }\n"
    make_runtime(tenant="other").compile(safejit.Source(code, "f"), defines={"X": "1"})
    rt = make_runtime(tenant="mine")
    manifest = Path(rt.compile(safejit.Source(code, "f"), defines={"X": "1"}).artifact.path) / "manifest.json"
    data = json.loads(manifest.read_text())
    data["inputs"]["defines"] = [["X", "1\n\x1b[31mplanted"]]
    manifest.write_text(json.dumps(data))
    walked = []
    real_info = maintenance._info
    monkeypatch.setattr(maintenance, "_info", lambda root, found: walked.append(found.tenant) or real_info(root, found))
    explanation = rt.explain(safejit.Source(code, "f"), defines={"X": "2"})
    assert set(walked) == {"mine"}
    assert explanation.nearest is not None
    (detail,) = [d.detail for d in explanation.nearest.differs]
    assert detail == "define X: 2 here, 1\n\x1b[31mplanted there"  # (the data, as the manifest has it)
    assert "define X: 2 here, 1\\n\\x1b[31mplanted there" in str(explanation)  # (shown escaped)
    assert "\n" not in str(explanation) and "\x1b" not in str(explanation)


def test_reverting_an_edit_reuses_the_old_leaf_without_compiling(make_runtime, project, cache_dir):
    inner = project / "include" / "inner.h"
    original = inner.read_text()
    _compile_value(_fresh(make_runtime, project), project)
    inner.write_text("#define INNER 1\n")
    settle()
    assert _compile_value(_fresh(make_runtime, project), project).kernel("value")() == 2
    inner.write_text(original)
    settle()
    rt = _fresh(make_runtime, project)
    assert _compile_value(rt, project).kernel("value")() == 42
    assert rt.stats()["compiles"] == 0
    assert len(leaves(cache_dir)) == 2


def test_missing_dependency_is_a_miss(make_runtime, project):
    _compile_value(_fresh(make_runtime, project), project)
    inner = project / "include" / "inner.h"
    inner.unlink()
    settle()
    rt = _fresh(make_runtime, project)
    with pytest.raises(safejit.CompileError) as info:
        _compile_value(rt, project)
    assert "inner.h" in info.value.log
    assert rt.stats()["disk_hits"] == 0 and rt.stats()["compiles"] == 1


def _tampered(raw: bytes, old: bytes, new: bytes) -> bytes:
    assert old in raw, raw[:200]
    return raw.replace(old, new)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda raw: _tampered(raw, b'"name":"value"', b'"name":"evil!"'), id="tampered"),
        pytest.param(lambda raw: raw[: len(raw) // 2], id="truncated"),
        pytest.param(lambda raw: b"\x00garbage\xff" * 10, id="garbage"),
        pytest.param(lambda raw: b'{"schema": 1}', id="wrong-shape"),
    ],
)
def test_damaged_manifest_is_a_miss_not_a_crash(make_runtime, project, cache_dir, damage):
    _compile_value(_fresh(make_runtime, project), project)
    (leaf,) = leaves(cache_dir)
    manifest = Path(leaf.path) / "manifest.json"
    manifest.write_bytes(damage(manifest.read_bytes()))
    rt = _fresh(make_runtime, project)
    assert _compile_value(rt, project).kernel("value")() == 42
    assert rt.stats()["disk_hits"] == 0 and rt.stats()["compiles"] == 1
    assert_cache_sound(cache_dir)  # the damaged leaf was quarantined, the new one verifies
    assert os.listdir(cache_dir / "v1" / "quarantine")


def test_leaf_whose_deps_no_longer_reproduce_its_name_is_skipped_and_a_sibling_found(make_runtime, project, cache_dir):
    inner = project / "include" / "inner.h"
    _compile_value(_fresh(make_runtime, project), project)
    inner.write_text("#define INNER 1\n")
    settle()
    _compile_value(_fresh(make_runtime, project), project)
    inner.write_text("#define INNER 41\n")
    settle()
    newest = max(leaves(cache_dir), key=lambda info: info.mtime)
    # Rewrite the newest leaf's dependency list consistently (marker updated) but
    # under a name its deps do not reproduce: it must be skipped, not trusted.
    man_path = Path(newest.path) / "manifest.json"
    data = json.loads(man_path.read_bytes())
    data["deps"][0][2] = "0" * 64
    raw = json.dumps(data).encode()
    man_path.write_bytes(raw)
    from safejit.keys import digest_bytes

    (Path(newest.path) / ".committed").write_bytes(digest_bytes(raw).encode())
    os.utime(newest.path, ns=(2**62, 2**62))  # make sure it is tried first
    rt = _fresh(make_runtime, project)
    assert _compile_value(rt, project).kernel("value")() == 42
    assert rt.stats()["compiles"] == 0 and rt.stats()["disk_hits"] == 1


def test_unwritable_root_still_serves_hits(make_runtime, project, cache_dir, tmp_path, monkeypatch):
    _compile_value(_fresh(make_runtime, project), project)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    spares.settle()  # the first compile's work dir goes in the background
    before = sorted(str(p) for p in cache_dir.rglob("*"))

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "read-only file system")

    monkeypatch.setattr(os, "utime", refuse)
    rt = make_runtime(cache_dirs=(str(blocker / "cache"), str(cache_dir)), source_roots=(str(project),))
    assert _compile_value(rt, project).kernel("value")() == 42
    assert rt.stats()["disk_hits"] == 1 and rt.stats()["compiles"] == 0
    assert sorted(str(p) for p in cache_dir.rglob("*")) == before


def test_unwritable_roots_on_a_miss_raise_or_bypass(make_runtime, project, tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    strict = make_runtime(cache_dirs=(str(blocker / "c"),))
    with pytest.raises(safejit.CacheError):
        strict.compile(safejit.Source(ADD_C, "add"))
    lenient = make_runtime(cache_dirs=(str(blocker / "c"),), on_cache_error="bypass")
    with caplog.at_level(logging.WARNING):
        mod = lenient.compile(safejit.Source(ADD_C, "add"))
    assert mod.kernel("add")(2, 3) == 5
    assert mod.artifact.source == "bypass" and lenient.stats()["bypass"] == 1
    assert any("cache bypassed" in m for m in caplog.messages)


@pytest.mark.parametrize("damage", ["delete", "flip", "truncate"])
def test_missing_or_corrupted_artifact_is_a_miss_and_is_rebuilt(make_runtime, project, cache_dir, damage):
    _compile_value(_fresh(make_runtime, project), project)
    (leaf,) = leaves(cache_dir)
    art = Path(leaf.path) / "artifact.so"
    data = art.read_bytes()
    if damage == "delete":
        art.unlink()
    elif damage == "flip":
        art.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        art.write_bytes(data[:-10])
    rt = _fresh(make_runtime, project)
    assert _compile_value(rt, project).kernel("value")() == 42
    assert rt.stats()["compiles"] == 1
    assert_cache_sound(cache_dir)
    assert len(leaves(cache_dir)) == 1


def test_empty_dependency_scan_is_never_published(make_runtime, project, cache_dir, caplog):
    wrapper = project / "cc-empty-depfile"
    wrapper.write_text(
        "#!/bin/sh\n"
        '/usr/bin/cc "$@"; rc=$?\n'
        'prev=""; for a in "$@"; do if [ "$prev" = "-MF" ]; then : > "$a"; fi; prev="$a"; done\n'
        "exit $rc\n"
    )
    wrapper.chmod(0o755)
    rt = make_runtime(source_roots=(str(project),), host_cc=str(wrapper))
    with caplog.at_level(logging.WARNING):
        mod = rt.compile(safejit.Source(ADD_C, "add"))
    assert mod.kernel("add")(1, 2) == 3
    assert leaves(cache_dir) == []
    assert rt.stats()["not_published"] == 1
    assert any("dependency scan is incomplete" in m for m in caplog.messages)


def test_lost_publish_race_adopts_the_winner(make_runtime, project, cache_dir):
    rt = _fresh(make_runtime, project)
    art = rt.build(_value_source(project), include_dirs=(str(project / "include"),))
    disk = DiskTier((str(cache_dir),), tenant="default", backend="host")
    winner = disk.verify(art.path, str(cache_dir), art.build_key, None)
    assert isinstance(winner, VerifiedLeaf)
    import dataclasses

    loser_bytes = winner.artifact + b"\0loser"
    import msgspec

    from safejit.keys import digest_bytes

    loser = msgspec.structs.replace(
        winner.manifest,
        artifact=ArtifactInfo(winner.manifest.artifact_file, len(loser_bytes), digest_bytes(loser_bytes)),
    )
    built = dataclasses.replace(winner, path="", manifest=loser, artifact=loser_bytes)
    leaf, outcome = disk.publish(str(cache_dir), art.build_key, built)
    assert outcome == "adopted"
    assert leaf.artifact == winner.artifact and leaf.path == art.path
    assert staging_residue(cache_dir) == []  # the loser's staging is gone
    assert_cache_sound(cache_dir)


def test_second_checkout_at_another_path_hits(make_runtime, project, tmp_path, cache_dir):
    (project / "kernel.c").write_text(KERNEL_WITH_HEADER)
    clone = tmp_path / "elsewhere" / "clone"
    shutil.copytree(project, clone)
    a = make_runtime(source_roots=(str(project),))
    art_a = a.build(a.source(project / "kernel.c"), include_dirs=(str(project / "include"),))
    b = make_runtime(source_roots=(str(clone),))
    mod_b = b.compile(b.source(clone / "kernel.c"), include_dirs=(str(clone / "include"),))
    assert mod_b.artifact.build_key == art_a.build_key
    assert mod_b.artifact.source == "disk" and b.stats()["compiles"] == 0
    assert mod_b.kernel("value")() == 42


def test_no_unordered_container_reaches_the_key(project, cache_dir):
    script = (
        "import safejit, sys\n"
        f"rt = safejit.Runtime(config=safejit.Config(cache_dirs=({str(cache_dir)!r},), "
        "declared_extras=('sm_count', 'mode', 'alpha')))\n"
        "defines = {f'D{i}': i for i in range(20)}\n"
        "extras = {'sm_count': 132, 'mode': 'fast', 'alpha': 0.5}\n"
        "print(rt.build(safejit.Source('int f(void){return D3;}', 'f'), defines=defines, extras=extras).build_key)\n"
    )
    keys = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        keys.add(out.stdout.strip())
    assert len(keys) == 1
    from safejit.keys import encode

    for unordered in ({1, 2}, {"a": 1}, frozenset({3})):
        with pytest.raises(TypeError):
            encode(unordered)


def test_depfiles_with_continuations_and_escaped_spaces_parse():
    text = (
        "out.so: /src/my\\ kernel.c \\\n"
        "  /inc/a\\ b.h /inc/c.h\\\n"
        " /inc/d$$.h \\\r\n"
        " /inc/e\\#.h\n"
        "/inc/c.h:\n"
        "\n"
        "other.o : /inc/c.h /inc/f.h\n"
    )
    assert parse_depfile(text) == [
        "/src/my kernel.c",
        "/inc/a b.h",
        "/inc/c.h",
        "/inc/d$.h",
        "/inc/e#.h",
        "/inc/f.h",
    ]
    assert parse_depfile("a.o:\n") == []
    assert parse_depfile("") == []


#: Shell: the wrapped compiler's output (``-o``) is put in place again, after what
#: precedes it: the compiler's output is final only then, so whatever happened before
#: may have gone into it.
_FINISH_OUTPUT_AGAIN = (
    'out=; prev=; for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done\n'
    'cp "$out" "$out.tmp" && mv "$out.tmp" "$out"\n'
)


def test_header_edited_after_the_output_is_final_is_vouched_for_what_was_read(make_runtime, project, cache_dir, caplog):
    """An edit after the compiler closed its output for the last time cannot have gone
    into it: the build is vouched for with what the compiler read (the old header), and
    the edit makes the next lookup a miss, never a stale hit."""
    inner = project / "include" / "inner.h"
    wrapper = project / "cc-editing-late"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *"-MD -MF"*) ;; *) exec /usr/bin/cc "$@";; esac\n'
        '/usr/bin/cc "$@"; rc=$?\n'
        "sleep 0.2\n"  # (the runtime reads the output at its close, before the edit)
        f'[ -e {project}/edited ] || {{ echo "#define INNER 7" > {inner}; touch {project}/edited; }}\n'
        "exit $rc\n"
    )
    wrapper.chmod(0o755)
    config = {"source_roots": (str(project),), "host_cc": str(wrapper), "sandbox": "off"}
    rt = make_runtime(**config)
    assert _compile_value(rt, project).kernel("value")() == 42  # what the compiler read: INNER 41
    assert rt.stats()["compiles"] == 1 and rt.stats()["published"] == 1
    settle()
    again = make_runtime(**config)
    explanation = again.explain(_value_source(project), include_dirs=(str(project / "include"),))
    assert explanation.result == "miss" and explanation.path == str(inner)
    assert _compile_value(again, project).kernel("value")() == 8
    assert again.stats()["compiles"] == 1 and again.stats()["disk_hits"] == 0


@pytest.mark.parametrize("staleness", [0, 60])
def test_header_edited_while_the_compiler_runs_is_never_vouched_for(
    make_runtime, project, cache_dir, caplog, staleness
):
    """The compiler reads inner.h, then it changes before the closure is hashed: the
    build must not be published under the new digest, nor trusted by the memory tier
    (whatever its window: with one, the entry was served again until it passed)."""
    inner = project / "include" / "inner.h"
    wrapper = project / "cc-editing"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *"-MD -MF"*) ;; *) exec /usr/bin/cc "$@";; esac\n'
        '/usr/bin/cc "$@"; rc=$?\n'
        f"n=$(cat {project}/n 2>/dev/null || echo 100); n=$((n+1)); echo $n > {project}/n\n"
        f'echo "#define INNER $n" > {inner}\n'  # an edit after the compiler read the header
        f"{_FINISH_OUTPUT_AGAIN}"  # ... and before its output was final
        "exit $rc\n"
    )
    wrapper.chmod(0o755)
    rt = make_runtime(source_roots=(str(project),), host_cc=str(wrapper), sandbox="off", max_staleness_s=staleness)
    with caplog.at_level(logging.INFO):
        value = _compile_value(rt, project).kernel("value")()
    assert value == 102  # built from the content written by the first run (101 + 1)
    assert rt.stats()["compiles"] == 2  # compiled again once the tick had passed
    assert leaves(cache_dir) == []  # the second run was edited too: nothing published
    assert any("changed during compile" in m for m in caplog.messages)
    # The memory entry does not vouch for it either: the next call rebuilds.
    assert _compile_value(rt, project).kernel("value")() >= 103


#: A compiler driver that, like nvcc, writes its depfile first and reads the headers
#: again afterwards: here the header is edited (once) in between.
_REREADING_CC = """#!/bin/sh
case "$*" in *"-MD -MF"*) ;; *) exec /usr/bin/cc "$@";; esac
/usr/bin/cc "$@" || exit $?
sleep 0.3
if [ ! -e {marker} ]; then echo '#define INNER 50' > {inner}; touch {marker}; fi
skip=0
for a in "$@"; do
  shift
  if [ $skip = 1 ]; then skip=0; continue; fi
  case "$a" in -MD) continue;; -MF) skip=1; continue;; esac
  set -- "$@" "$a"
done
exec /usr/bin/cc "$@"
"""


def test_header_edited_after_the_depfile_is_scanned_again(make_runtime, project, cache_dir, spans):
    """The closure is scanned as soon as the depfile is written, while the compiler still
    runs; a header changed after that scan must not be vouched for by it."""
    inner = project / "include" / "inner.h"
    wrapper = project / "cc-rereading"
    wrapper.write_text(_REREADING_CC.format(marker=project / "edited", inner=inner))
    wrapper.chmod(0o755)
    config = {"source_roots": (str(project),), "host_cc": str(wrapper), "sandbox": "off"}
    rt = make_runtime(**config)
    assert _compile_value(rt, project).kernel("value")() == 51  # built from the edited header
    # The early scan ran inside the compiler's span, and a later one after it: the edit was seen.
    checks = [
        s
        for s in spans.get_finished_spans()
        if s.name == "safejit.policy.check" and s.attributes.get("safejit.kind") == "completeness"
    ]
    runs = {s.context.span_id for s in spans.get_finished_spans() if s.name == "safejit.compiler.run"}
    assert [s.parent is not None and s.parent.span_id in runs for s in checks][:2] == [True, False]
    assert rt.stats()["compiles"] == 2 and rt.stats()["published"] == 1
    settle()
    # The only leaf is the clean rebuild's: with the header back as it was, nothing hits it.
    inner.write_text("#define INNER 41\n")
    again = make_runtime(**config)
    assert _compile_value(again, project).kernel("value")() == 42
    assert again.stats()["disk_hits"] == 0  # (and compiled: twice if the rewrite was within a tick)


def test_shadowing_header_made_during_the_compile_is_never_vouched_for(make_runtime, tmp_path, cache_dir):
    """A header that appears, during the compile, where the compiler would have looked
    first: what the compiler saw is unknown, so that build is not published."""
    root = tmp_path / "proj"
    first, second = root / "first", root / "second"
    first.mkdir(parents=True)
    second.mkdir()
    (second / "cfg.h").write_text("#define CFG 2\n")
    wrapper = root / "cc-shadowing"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *"-MD -MF"*) ;; *) exec /usr/bin/cc "$@";; esac\n'
        '/usr/bin/cc "$@"; rc=$?\n'
        "sleep 0.3\n"
        f"[ -e {first}/cfg.h ] || echo '#define CFG 1' > {first}/cfg.h\n"
        f"{_FINISH_OUTPUT_AGAIN}"
        "exit $rc\n"
    )
    wrapper.chmod(0o755)
    src = safejit.Source('#include "cfg.h"\nint cfg(void) { return CFG; }\n', "cfg")
    dirs = (str(first), str(second))
    config = {"source_roots": (str(root),), "host_cc": str(wrapper), "sandbox": "off"}
    rt = make_runtime(**config)
    assert rt.compile(src, include_dirs=dirs).kernel("cfg")() == 1  # compiled again, with the shadow
    assert rt.stats()["compiles"] == 2 and rt.stats()["published"] == 1
    settle()
    fresh = make_runtime(**config)
    assert fresh.compile(src, include_dirs=dirs).kernel("cfg")() == 1
    assert fresh.stats()["compiles"] == 0  # the one leaf is the rebuild's, and it hits


def test_memory_scratch_is_private_and_gone_after_the_compile(make_runtime, project):
    """The compiler works in a private directory in memory (0700, this user's; root's is
    0711, passed through by its compilers' unprivileged uid, never listed), which is
    deleted once the compile is over; with scratch="cache" it works in the cache root."""
    base = spares.memory_scratch()
    if base is None:
        pytest.skip("no /dev/shm")
    st = os.lstat(base)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == (0o711 if os.geteuid() == 0 else 0o700)

    def mine() -> set[str]:  # (other processes of this user share the base)
        return {n for n in os.listdir(base) if n.startswith(f"p{os.getpid()}.") and not n.endswith(".alive")}

    before = mine()
    assert _compile_value(_fresh(make_runtime, project), project).kernel("value")() == 42
    spares.settle()
    assert mine() == before, "the compile's scratch was left in memory"
    on_disk = make_runtime(scratch="cache", source_roots=(str(project),))
    assert on_disk.compile(safejit.Source(ADD_C, "add")).kernel("add")(2, 3) == 5
    spares.settle()
    assert mine() == before
    with pytest.raises(safejit.ConfigError):
        safejit.Config(scratch="tmpfs")  # type: ignore[arg-type]


def test_a_runtime_dropped_without_close_leaves_no_work_dir_behind(cache_dir, tmp_path):
    """Each Runtime that compiled prepares two work dirs ahead; one dropped without
    close() left them in the shared cache's tmp/ for good, even after a clean exit
    (50 short-lived Runtimes: 100 dirs, which gc kept for a day). They go once the
    Runtime is collected, or at exit."""
    child = (
        "import gc, sys, safejit\n"
        "config = safejit.Config(cache_dirs=(sys.argv[1],))\n"
        "for i in range(3):\n"
        "    safejit.Runtime(config=config).compile(safejit.Source('int k%d(void) { return 1; }' % i, 'k'))\n"
        "import os, time\n"
        "from safejit.cache.staging import settle\n"
        # (a pool thread may hold a dropped Runtime's spares a moment after its work is done:
        # they are removed then, on that thread, not at this gc.collect)
        "deadline = time.monotonic() + 10\n"
        "while True:\n"
        "    settle()\n"  # (the last one's spares are made in the background: it lives until then)
        "    gc.collect()\n"
        "    left = os.listdir(sys.argv[1] + '/v1/tmp')\n"
        "    if not left or time.monotonic() > deadline:\n"
        "        break\n"
        "    time.sleep(0.05)\n"
        "print(len(left), flush=True)\n"
        "keep = safejit.Runtime(config=config)\n"  # (not collected before exit)
        "keep.compile(safejit.Source('int kept(void) { return 1; }', 'k'))\n"
    )
    out = subprocess.run([sys.executable, "-c", child, str(cache_dir)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"]  # (collected: their spares gone)
    assert staging_residue(cache_dir) == []  # (at exit, the last one's too)


def test_a_runtime_closed_while_it_compiles_leaves_no_work_dir_behind(make_runtime, cache_dir, monkeypatch):
    """close() deleted the prepared work dirs, then the compile under way ended and
    prepared two more, which nothing removed while the process lived."""
    import threading

    from safejit import faults

    spawning, go = threading.Event(), threading.Event()
    real_point = faults.point

    def point(name: str, data: bytes | None = None):  # (the compiler about to start: close() now)
        if name == "compiler.spawn":
            spawning.set()
            go.wait(30)
        return real_point(name, data) if data is not None else real_point(name)

    rt = make_runtime()
    rt.compile(safejit.Source(ADD_C, "add"))  # (spares made for the next compile)
    monkeypatch.setattr(faults, "point", point)
    errors: list[BaseException] = []

    def compile_one() -> None:
        try:
            rt.compile(safejit.Source("int two(void) { return 2; }\n", "two"))
        except BaseException as exc:  # (a closed runtime may refuse it)
            errors.append(exc)

    worker = threading.Thread(target=compile_one)
    worker.start()
    assert spawning.wait(30)
    rt.close()
    go.set()
    worker.join(60)
    settle()
    left = [n for n in os.listdir(cache_dir / "v1" / "tmp") if not n.endswith(".alive")]
    assert left == [], errors  # (not even prepared ones, unused)


def test_runtimes_made_on_demand_add_no_exit_hooks(make_runtime):
    """Each Runtime registered two exit hooks, never removed: a process making Runtimes
    on demand grew by two per Runtime for its life."""
    import atexit

    make_runtime().compile(safejit.Source(ADD_C, "add"))  # (the first: whatever is registered once)
    before = atexit._ncallbacks()
    for _ in range(20):
        make_runtime().compile(safejit.Source(ADD_C, "add"))
    assert atexit._ncallbacks() == before


def test_a_rebuilt_cxx_kernel_never_runs_an_earlier_builds_inline_statics(make_runtime, project):
    """g++ made the static of an inline function STB_GNU_UNIQUE, which the loader binds
    for the whole process to the first library that defined it: after a header edit,
    the rebuilt kernel (compiled, verified, loaded) returned the old build's value, in
    a new Runtime too. Built with -fno-gnu-unique, each build has its own."""
    header = project / "include" / "counter.h"
    code = '#include "counter.h"\nextern "C" int read_counter(void) { return counter(); }\n'
    src = safejit.Source(code, "read_counter", filename="k.cpp")
    for value in (1, 2, 3):
        header.write_text(f"inline int counter() {{ static int c = {value}; return c; }}\n")
        rt = make_runtime(source_roots=(str(project),), max_staleness_s=0)
        mod = rt.compile(src, include_dirs=(str(project / "include"),))
        assert mod.artifact.tier == "compiled" and mod.kernel("read_counter")() == value


def _aged(*paths: Path) -> None:
    """Past the racy window: a file written this instant is never vouched for by its stat."""
    old = time.time() - 10
    for p in paths:
        os.utime(p, (old, old))


def test_a_dotdot_include_after_a_symlinked_dir_is_never_cached_stale(make_runtime, tmp_path, cache_dir):
    """``include/mylib`` links to ``../vA/mylib``, whose a.h includes "../common/b.h":
    the compiler reads vA/common/b.h. The leaf recorded that file, not where the link
    pointed: re-pointed to vB (the same a.h, another b.h), a fresh process hit the old
    binary. Such a build is returned, never published."""
    root = tmp_path / "root"
    for version, value in (("vA", 1), ("vB", 2)):
        (root / version / "mylib").mkdir(parents=True)
        (root / version / "common").mkdir()
        (root / version / "mylib" / "a.h").write_text('#include "../common/b.h"\n')
        (root / version / "common" / "b.h").write_text(f"#define V {value}\n")
    (root / "include").mkdir()
    link = root / "include" / "mylib"
    link.symlink_to("../vA/mylib")
    _aged(*root.rglob("*.h"))
    src = safejit.Source("#include <mylib/a.h>\nint k(void) { return V; }\n", "k")
    inc = (str(root / "include"),)
    assert make_runtime(source_roots=(str(root),)).compile(src, include_dirs=inc).kernel("k")() == 1
    assert leaves(cache_dir) == []
    link.unlink()
    link.symlink_to("../vB/mylib")
    assert make_runtime(source_roots=(str(root),)).compile(src, include_dirs=inc).kernel("k")() == 2


def test_a_has_include_that_found_a_header_never_included_rebuilds_when_it_goes(make_runtime, project, cache_dir):
    """A literal ``__has_include`` that was true for a header the source never includes:
    the header was neither a dependency nor a negative, so removing it (the probe now
    false) hit the old binary."""
    feat = project / "include" / "feat.h"
    feat.write_text("// present\n")
    _aged(feat)
    code = "#if __has_include(<feat.h>)\n#define V 1\n#else\n#define V 2\n#endif\nint k(void) { return V; }\n"
    src, inc = safejit.Source(code, "k"), (str(project / "include"),)
    assert make_runtime(source_roots=(str(project),)).compile(src, include_dirs=inc).kernel("k")() == 1
    feat.unlink()
    again = make_runtime(source_roots=(str(project),)).compile(src, include_dirs=inc)
    assert again.kernel("k")() == 2 and again.artifact.tier == "compiled"


@pytest.mark.parametrize("made", ["include/common/c.h", "common/c.h"])
def test_a_dotdot_include_records_where_the_compiler_looked_first(make_runtime, tmp_path, made):
    """``#include "../common/c.h"`` in include/mylib/a.h, found through the later search
    dir x/y (as x/y/../common/c.h): the lookups next to the includer and in the earlier
    dir (include/../common/c.h) were not recorded, so a c.h made there hit the old binary."""
    root = tmp_path / "root"
    for d in ("include/mylib", "x/y", "x/common"):
        (root / d).mkdir(parents=True)
    (root / "include/mylib/a.h").write_text('#include "../common/c.h"\n')
    (root / "x/common/c.h").write_text("#define V 3\n")
    _aged(*root.rglob("*.h"))
    src = safejit.Source("#include <mylib/a.h>\nint k(void) { return V; }\n", "k")
    inc = (str(root / "include"), str(root / "x/y"))
    assert make_runtime(source_roots=(str(root),)).compile(src, include_dirs=inc).kernel("k")() == 3
    (root / made).parent.mkdir(parents=True, exist_ok=True)
    (root / made).write_text("#define V 5\n")
    again = make_runtime(source_roots=(str(root),)).compile(src, include_dirs=inc)
    assert again.kernel("k")() == 5 and again.artifact.tier == "compiled"


PROBE = "#if __has_include({name})\n#define V 1\n#else\n#define V 2\n#endif\n"


def _probe_case(root: Path, case: str) -> tuple[str, tuple[str, ...], Callable[[], None], int]:
    """``(source, include dirs, the change, what a cold build returns after it)``."""
    if case == "has_include_next":  # (the next one found, not the prober itself)
        for d in ("d0", "d1"):
            (root / d).mkdir(parents=True)
        (root / "d0/feat.h").write_text(PROBE.replace("__has_include", "__has_include_next").format(name="<feat.h>"))
        (root / "d1/feat.h").write_text("// next\n")
        return "#include <feat.h>\n", ("d0", "d1"), (root / "d1/feat.h").unlink, 2
    if case == "directory_passed_over":  # (a directory where a probe looks first)
        (root / "d0/feat.h").mkdir(parents=True)
        (root / "d1").mkdir()
        (root / "d1/feat.h").write_text("// present\n")
        return PROBE.format(name="<feat.h>"), ("d0", "d1"), (root / "d1/feat.h").unlink, 2
    if case == "quoted_probe_next_to_its_header":
        (root / "inc/mylib").mkdir(parents=True)
        (root / "inc/mylib/a.h").write_text(PROBE.format(name='"feat.h"'))
        return "#include <mylib/a.h>\n", ("inc",), lambda: (root / "inc/mylib/feat.h").write_text("//\n"), 1
    # "link_after_dotdot": "../lnk/x.h", lnk re-pointed (the link comes after the '..')
    for d in ("include/mylib", "vA", "vB"):
        (root / d).mkdir(parents=True)
    (root / "vA/x.h").write_text("#define V 1\n")
    (root / "vB/x.h").write_text("#define V 2\n")
    (root / "include/lnk").symlink_to("../vA")
    (root / "include/mylib/a.h").write_text('#include "../lnk/x.h"\n')

    def repoint() -> None:
        (root / "include/lnk").unlink()
        (root / "include/lnk").symlink_to("../vB")

    return "#include <mylib/a.h>\n", ("include",), repoint, 2


@pytest.mark.parametrize(
    "case", ["has_include_next", "directory_passed_over", "quoted_probe_next_to_its_header", "link_after_dotdot"]
)
def test_what_a_probe_or_a_dotdot_include_found_is_recorded(make_runtime, tmp_path, case):
    """Found in review of the fixes above, each a stale hit: a ``__has_include_next`` hit,
    a probe hit past a directory, a quoted probe's lookup next to its header, and a link
    after a ``..`` (anchored by its real path, a re-pointed link went unseen)."""
    root = tmp_path / "root"
    head, dirs, change, after = _probe_case(root, case)
    _aged(*[p for p in root.rglob("*") if p.is_file()])
    src = safejit.Source(head + "int k(void) { return V; }\n", "k")
    inc = tuple(str(root / d) for d in dirs)
    before = 3 - after
    assert make_runtime(source_roots=(str(root),)).compile(src, include_dirs=inc).kernel("k")() == before
    change()
    again = make_runtime(source_roots=(str(root),)).compile(src, include_dirs=inc)
    assert again.kernel("k")() == after and again.artifact.tier == "compiled"


def test_a_probed_hard_link_never_read_fails_no_compile(make_runtime, tmp_path):
    """A probe may find a header in a later dir that the compiler never opens: a hard
    link there made a valid compile fail ('the compiler read ... hard links')."""
    root = tmp_path / "root"
    for d in ("a", "b", "elsewhere"):
        (root / d).mkdir(parents=True)
    (root / "a" / "cfg.h").write_text("#define V 7\n")
    (root / "elsewhere" / "cfg.h").write_text("#define V 9\n")
    os.link(root / "elsewhere" / "cfg.h", root / "b" / "cfg.h")
    _aged(*[p for p in root.rglob("*") if p.is_file()])
    src = safejit.Source("#if __has_include(<cfg.h>)\n#include <cfg.h>\n#endif\nint k(void) { return V; }\n", "k")
    inc = (str(root / "a"), str(root / "b"))
    assert make_runtime(source_roots=(str(root),)).compile(src, include_dirs=inc).kernel("k")() == 7


def test_a_tenants_link_into_the_toolchain_then_dotdot_is_never_cached(make_runtime, tmp_path, cache_dir):
    """Only links inside the toolchain's own dirs are exempt: a tenant's link (under a
    source root) pointing into one, followed by '..', anchored a file never read."""
    root = tmp_path / "root"
    (root / "include").mkdir(parents=True)
    (root / "include" / "lnk").symlink_to("/usr/include/linux")
    src = safejit.Source("#include <lnk/../stdint.h>\nint k(void) { return sizeof(int32_t); }\n", "k")
    inc = (str(root / "include"),)
    assert make_runtime(source_roots=(str(root),)).compile(src, include_dirs=inc).kernel("k")() == 4
    assert leaves(cache_dir) == []


WRAPPER_H = (
    "#ifdef __has_include\n#  define MY_HAS_INCLUDE(_X) __has_include(_X)\n"
    "#else\n#  define MY_HAS_INCLUDE(_X) 0\n#endif\n"
)
V_OR_NOT = "\n#define V 1\n#else\n#define V 2\n#endif\n"
USES_WRAPPER_H = '#include "wrap.h"\n#if MY_HAS_INCLUDE(<feat.h> )' + V_OR_NOT  # (CCCL's shapes)


def _turned(
    make_runtime: Callable[..., safejit.Runtime],
    root: Path,
    files: dict[str, str | bytes],
    head: str,
    dirs: tuple[str, ...],
    change: Callable[[], object],
    values: tuple[int, int],
    **kw: object,
) -> safejit.Module:
    """Write ``files`` under ``root`` (aged), compile ``head`` + a kernel returning V in a
    fresh Runtime (``values[0]``), ``change()``, compile again in another: it returns
    ``values[1]``, and the module it gives back."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text if isinstance(text, bytes) else text.encode())
    for d in dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
    _aged(*[p for p in root.rglob("*") if p.is_file()])
    src = safejit.Source(head + "int k(void) { return V; }\n", "k")
    inc = tuple(str(root / d) for d in dirs)
    assert make_runtime(source_roots=(str(root),)).compile(src, include_dirs=inc, **kw).kernel("k")() == values[0]
    change()
    again = make_runtime(source_roots=(str(root),)).compile(src, include_dirs=inc, **kw)
    assert again.kernel("k")() == values[1]
    return again


@pytest.mark.parametrize("change", ["made_in_an_earlier_dir", "removed"])
def test_a_probe_through_a_macro_is_recorded(make_runtime, tmp_path, change):
    """CCCL probes through a macro defined in one header and called in another
    (``_CCCL_HAS_INCLUDE(<nvtx3/nvtx3.hpp>)``): neither the header it found nor the one
    it did not find was recorded, so one made (or removed) later hit the old binary."""
    root = tmp_path / "root"
    files: dict[str, str | bytes] = {"lib/wrap.h": WRAPPER_H, "lib/uses.h": USES_WRAPPER_H}
    if change == "removed":
        files["lib/feat.h"] = "// present\n"
        turn, values = (root / "lib/feat.h").unlink, (1, 2)
    else:
        turn, values = lambda: (root / "first/feat.h").write_text("// now here\n"), (2, 1)
    again = _turned(make_runtime, root, files, "#include <uses.h>\n", ("first", "lib"), turn, values)
    assert again.artifact.tier == "compiled"


@pytest.mark.parametrize(
    "code",
    [
        "#define FEAT <feat.h>\n#if __has_include(FEAT)" + V_OR_NOT,
        '#include "wrap.h"\n#define FEAT <feat.h>\n#if MY_HAS_INCLUDE(FEAT)' + V_OR_NOT,
        '#include "wrap.h"\n#define HAS_FEAT(x) MY_HAS_INCLUDE(x)\n#if HAS_FEAT(<feat.h>)' + V_OR_NOT,
    ],
    ids=["named_probe", "wrapper_given_a_named_header", "wrapper_of_a_wrapper"],
)
def test_a_probe_of_a_name_a_macro_makes_is_never_cached(make_runtime, tmp_path, cache_dir, code):
    """What ``__has_include(FEAT)`` looked for is not in the source: a header made later
    where it looked hit the old binary. Such a build is returned, never published."""
    root = tmp_path / "root"

    def unpublished_then_made() -> None:
        assert leaves(cache_dir) == []
        (root / "inc/feat.h").write_text("// now here\n")

    _turned(make_runtime, root, {"inc/wrap.h": WRAPPER_H}, code, ("inc",), unpublished_then_made, (2, 1))


#: Found in review of the fix above, each a stale hit: (what lib/wrap.h holds, the condition
#: lib/uses.h tests). A header made later in an earlier include dir turns the condition.
PROBE_SHAPES = {
    "object_alias": ("#ifdef __has_include\n#define HASINC __has_include\n#endif\n", "#if HASINC(<feat.h>)"),
    "alias_of_wrapper": ("#define HASINC_(x) __has_include(x)\n#define HASINC HASINC_\n", "#if HASINC(<feat.h>)"),
    "apply_macro": ("#define HASINC(x) __has_include(x)\n#define APPLY(f, x) f(x)\n", "#if APPLY(HASINC, <feat.h>)"),
    "pasted_name": ("#define HASINC(x) __has_include(x)\n#define CAT(a, b) a##b\n", "#if CAT(HAS, INC)(<feat.h>)"),
    "variadic": ("#define HASINC(...) __has_include(__VA_ARGS__)\n", "#if HASINC(<feat.h>)"),
    "splice_before_name": ("#define \\\nHASINC(x) __has_include(x)\n", "#if HASINC(<feat.h>)"),
    "comment_before_name": ("#define /* wraps */ HASINC(x) __has_include(x)\n", "#if HASINC(<feat.h>)"),
    "comment_before_paren": ("#define HASINC(x) __has_include(x)\n", "#if HASINC /* probe */ (<feat.h>)"),
    "comment_spanning_if": ("#define HASINC(x) __has_include(x)\n", "#if /* a comment\n over two */ HASINC(<feat.h>)"),
    "formfeed_before_hash": ("\f#define HASINC(x) __has_include(x)\n", "#if HASINC(<feat.h>)"),
    "vtab_in_define": ("#define\vHASINC(x) __has_include(x)\n", "#if HASINC(<feat.h>)"),
    "bom_first_line": ("\ufeff#define HASINC(x) __has_include(x)\n", "#if HASINC(<feat.h>)"),
    "space_after_backslash": ("#define HASINC(x) \\ \n  __has_include(x)\n", "#if HASINC(<feat.h>)"),
    # A <...> name given to a macro, or in a macro's body, is read as tokens, and each
    # identifier in it expanded (found in a second review):
    "macro_in_the_name": ("#define FEAT feat.h\n#define HASINC(x) __has_include(x)\n", "#if HASINC(<FEAT>)"),
    "parameter_as_the_name": ("#define W(x) __has_include(<x>)\n", "#if W(feat.h)"),
    "parameter_in_the_name": ("#define W(x) __has_include(<x.h>)\n", "#if W(feat)"),
    "object_macro_naming_it": ("#define FEAT feat.h\n#define CHECK __has_include(<FEAT>)\n", "#if CHECK"),
    "predefined_in_the_name": ("#define HASINC(x) __has_include(x)\n", "#if HASINC(<linux/feat.h>)"),
    "blank_in_the_name": ("#define HASINC(x) __has_include(x)\n", "#if HASINC(< feat.h>)"),
    "literal_blank_in_the_name": ("", "#if __has_include(< feat.h>)"),
}
#: Where the compiler looks for what those conditions probe, when not first/feat.h.
PROBED = {
    "predefined_in_the_name": "first/1/feat.h",  # (linux is 1 in GNU modes)
    "blank_in_the_name": "first/ feat.h",  # (a blank is part of the name)
    "literal_blank_in_the_name": "first/ feat.h",
}


def _made_first(root: Path, rel: str = "first/feat.h") -> Callable[[], object]:
    def made() -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("// now here\n")

    return made


@pytest.mark.parametrize("shape", sorted(PROBE_SHAPES))
def test_every_shape_of_a_probe_through_a_macro_is_recorded_or_never_cached(make_runtime, tmp_path, shape):
    root = tmp_path / "root"
    wrap, condition = PROBE_SHAPES[shape]
    files: dict[str, str | bytes] = {"lib/wrap.h": wrap, "lib/uses.h": '#include "wrap.h"\n' + condition + V_OR_NOT}
    made = _made_first(root, PROBED.get(shape, "first/feat.h"))
    again = _turned(make_runtime, root, files, "#include <uses.h>\n", ("first", "lib"), made, (2, 1))
    assert again.artifact.tier == "compiled"


#: Token pasting makes the wrapper's name where the header is named: no reading of the
#: headers sees this probe (docs/security.md); the preprocessor's recorded lookups do.
PASTED_H = "#define HASINC(x) __has_include(x)\n#define CAT(a, b) a##b\n#define P(n, h) CAT(HAS, n)(h)\n"
RECORDER = pytest.mark.skipif(
    not lookups.supported() or shutil.which("cc", path="/usr/bin:/bin") is None, reason="no lookup recorder here"
)


@RECORDER
def test_a_probe_whose_wrapper_token_pasting_names_is_recorded_by_the_preprocessor(make_runtime, tmp_path):
    root = tmp_path / "root"
    files: dict[str, str | bytes] = {
        "lib/wrap.h": PASTED_H,
        "lib/uses.h": '#include "wrap.h"\n#if P(INC, <feat.h>)' + V_OR_NOT,
    }
    again = _turned(make_runtime, root, files, "#include <uses.h>\n", ("first", "lib"), _made_first(root), (2, 1))
    assert again.artifact.tier == "compiled"


@RECORDER
@pytest.mark.skipif(CLANG is None, reason="no clang")
def test_a_pasted_probe_is_recorded_with_clang_as_the_host_compiler(make_runtime, tmp_path):
    """clang's preprocessor (``clang -cc1``) was not known for one: nothing recorded, and the
    probe token pasting names hit the old binary. It records now. (A host build links: the
    driver runs -cc1 apart whether told to or not; a compile alone, bisheng's, needs
    -fno-integrated-cc1.)"""
    root = tmp_path / "root"
    files: dict[str, str | bytes] = {
        "lib/wrap.h": PASTED_H,
        "lib/uses.h": '#include "wrap.h"\n#if P(INC, <feat.h>)' + V_OR_NOT,
    }
    with_clang = functools.partial(make_runtime, host_cc=CLANG)
    again = _turned(with_clang, root, files, "#include <uses.h>\n", ("first", "lib"), _made_first(root), (2, 1))
    assert again.artifact.tier == "compiled"


@RECORDER
def test_lost_records_and_a_name_that_is_not_text_are_never_vouched_for(make_runtime, tmp_path, cache_dir, monkeypatch):
    """A source can make more lookups than the recorder holds: records lost must not read
    as none (the derived closure alone, and a pasted probe's stale hit again). A name
    looked up that is not UTF-8 made the compile fail in the key's encoder."""
    root = tmp_path / "root"
    files: dict[str, str | bytes] = {
        "lib/wrap.h": PASTED_H,
        "lib/uses.h": b'#include "wrap.h"\n#if P(INC, <caf\xe9.h>)' + V_OR_NOT.encode(),
    }
    _turned(make_runtime, root, files, "#include <uses.h>\n", ("first", "lib"), list, (2, 2))
    assert leaves(cache_dir) == []
    monkeypatch.setattr(lookups, "read_preloaded", lambda cwd, **_: (_ for _ in ()).throw(ValueError("records lost")))
    (root / "lib/other.h").write_text("#define V 3\n")
    src = safejit.Source("#include <other.h>\nint k(void) { return V; }\n", "k")
    rt = make_runtime(source_roots=(str(root),))
    assert rt.compile(src, include_dirs=(str(root / "lib"),)).kernel("k")() == 3 and leaves(cache_dir) == []


@RECORDER
def test_a_compile_no_preprocessor_recorded_is_never_vouched_for(make_runtime, tmp_path, cache_dir, monkeypatch):
    """No records at all (the recorder not preloaded or not installed, a preprocessor it
    did not know for one: clang run by a response file, a clang named cc) read as "none
    to add": vouched for by reading the sources alone, with their gaps (a pasted probe)."""
    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    (root / "lib/other.h").write_text("#define V 3\n")
    src = safejit.Source("#include <other.h>\nint k(void) { return V; }\n", "k")
    with monkeypatch.context() as mp:
        mp.setattr(lookups, "read_preloaded", lambda cwd, **_: None)
        rt = make_runtime(source_roots=(str(root),))
        assert rt.compile(src, include_dirs=(str(root / "lib"),)).kernel("k")() == 3 and leaves(cache_dir) == []
    again = make_runtime(source_roots=(str(root),)).compile(src, include_dirs=(str(root / "lib"),))
    assert again.kernel("k")() == 3 and again.artifact.tier == "compiled" and len(leaves(cache_dir)) == 1


@RECORDER
@pytest.mark.skipif(shutil.which("nvcc", path="/usr/local/cuda/bin:/usr/bin") is None, reason="no nvcc")
def test_a_pasted_probe_is_recorded_through_nvcc_too(make_runtime, tmp_path, cache_dir):
    """nvcc preprocesses with the host compiler's: its lookups are recorded the same way."""
    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    (root / "first").mkdir()
    (root / "lib/wrap.h").write_text(PASTED_H)
    (root / "lib/uses.h").write_text('#include "wrap.h"\n#if P(INC, <feat.h>)' + V_OR_NOT)
    _aged(*[p for p in root.rglob("*") if p.is_file()])
    src = safejit.Source('#include <uses.h>\nextern "C" __global__ void k(int* o) { *o = V; }\n', "k", filename="k.cu")
    config = {"source_roots": (str(root),), "backend": "cuda", "cuda_compiler": "nvcc"}
    inc = (str(root / "first"), str(root / "lib"))
    assert make_runtime(**config).build(src, include_dirs=inc, arch="sm_90").tier == "compiled"
    assert len(leaves(cache_dir)) == 1
    (root / "first/feat.h").write_text("// now here\n")
    assert make_runtime(**config).build(src, include_dirs=inc, arch="sm_90").tier == "compiled"


#: Where the recorder does not run, the scan's reading must be gcc's. Found in a third
#: review, each a stale hit: a #define the scan did not see, so the macro in the probe's
#: name read as a literal name — (what precedes the probe, the name it probes).
HIDDEN_DEFINES: dict[str, tuple[bytes, str]] = {
    "splice_in_the_name": (b"#define FE\\\nAT one\n", "FEAT"),
    "lone_cr_ends_a_line": (b"int d;\r#define FEAT one\n", "FEAT"),
    "dollar_in_the_name": (b"#define a$b one\n", "a$b"),
    "utf8_name": ("#define feat\u00e9 one\n".encode(), "feat\u00e9"),
    "ucn_name": (b"#define feat\\u00e9 one\n", "feat\u00e9"),  # (the same name as a UCN)
}


@pytest.mark.parametrize("shape", sorted(HIDDEN_DEFINES))
def test_a_define_read_as_gcc_reads_it_without_the_recorder(make_runtime, tmp_path, monkeypatch, shape):
    monkeypatch.setattr(Sandbox, "recorder", lambda self: None)
    define, name = HIDDEN_DEFINES[shape]
    uses = b"#define W(x) __has_include(x)\n" + define + f"#if W(<{name}.h>)".encode() + V_OR_NOT.encode()
    root = tmp_path / "root"
    made = _made_first(root, "first/one.h")
    again = _turned(make_runtime, root, {"lib/uses.h": uses}, "#include <uses.h>\n", ("first", "lib"), made, (2, 1))
    assert again.artifact.tier == "compiled"


#: A fourth review (each a stale hit where the scan runs alone): a quote in a header name is
#: no literal, and a quote left open in a macro's body runs to its line's end.
QUOTES: dict[str, bytes] = {
    "quote_in_a_header_name": b"#if __has_include(<a'b.h>) /* c\nR\"(\n*/\n#endif\n"
    b"#if __has_include(/**/<feat.h>)" + V_OR_NOT.encode() + b'// )"\n',
    "quote_left_open_in_a_define": b"#define W(x) __has_include(x)\n#define Q don't /*\n#if W(<feat.h>)"
    + V_OR_NOT.encode()
    + b"// */\n",
}


@pytest.mark.parametrize("shape", sorted(QUOTES))
def test_a_quote_is_read_as_gcc_reads_it_without_the_recorder(make_runtime, tmp_path, monkeypatch, shape):
    monkeypatch.setattr(Sandbox, "recorder", lambda self: None)
    root = tmp_path / "root"
    files: dict[str, str | bytes] = {"lib/uses.h": QUOTES[shape]}
    again = _turned(make_runtime, root, files, "#include <uses.h>\n", ("first", "lib"), _made_first(root), (2, 1))
    assert again.artifact.tier == "compiled"


@pytest.mark.parametrize(
    ("files", "change"),
    [
        ({"lib/uses.h": WRAPPER_H + "int d;\r#if MY_HAS_INCLUDE(<feat.h>)" + V_OR_NOT}, "first/feat.h"),
        (
            {
                "lib/uses.h": "int d;\r#define MY_HAS_INCLUDE(x) __has_include(x)\n#if MY_HAS_INCLUDE(<feat.h>)"
                + V_OR_NOT
            },
            "first/feat.h",
        ),
        ({"lib/uses.h": 'int d;\r#include "v.h"\n', "lib/v.h": "#define V 2\n"}, "lib/v.h"),
    ],
    ids=["before_a_probe", "before_a_wrappers_define", "before_a_quoted_include"],
)
def test_a_lone_carriage_return_ends_a_line_without_the_recorder(make_runtime, tmp_path, monkeypatch, files, change):
    """gcc ends a line at a carriage return alone: what followed one was never read."""
    monkeypatch.setattr(Sandbox, "recorder", lambda self: None)
    root = tmp_path / "root"
    dirs = ("first", "lib")
    if change == "lib/v.h":  # (v.h made next to uses.h, where gcc looks first)
        files, dirs = {"lib/sub/uses.h": files["lib/uses.h"], "lib/v.h": files["lib/v.h"]}, ("lib",)
        made = lambda: (root / "lib/sub/v.h").write_text("#define V 1\n")  # noqa: E731
        head = "#include <sub/uses.h>\n"
    else:
        made, head = _made_first(root), "#include <uses.h>\n"
    again = _turned(make_runtime, root, dict(files), head, dirs, made, (2, 1))
    assert again.artifact.tier == "compiled"


@pytest.mark.parametrize(
    "given",
    [
        {"defines": {"HAS_FEAT": "MY_HAS_INCLUDE(<feat.h>)"}},
        {"defines": {"HAS_FEAT": "__has_include(<feat.h>)"}},
        {"defines": {"HASINC": "__has_include"}},
        {"flags": ["-DHAS_FEAT=__has_include(<feat.h>)"]},
        {"flags": ["-DHASINC=__has_include"]},
    ],
    ids=["wrapper_call", "literal_probe", "alias", "flag_literal_probe", "flag_alias"],
)
def test_a_probe_given_by_a_define_is_recorded(make_runtime, tmp_path, given):
    """``defines=`` and ``-D`` flags are macros the compiler reads first: a probe in one
    was never read (a stale hit; ``-D`` in ``flags=`` after ``defines=`` were fixed)."""
    root = tmp_path / "root"
    condition = "#if HASINC(<feat.h>)" if "HASINC" in str(given) else "#if HAS_FEAT"
    head = '#include "wrap.h"\n' + condition + V_OR_NOT
    files: dict[str, str | bytes] = {"lib/wrap.h": WRAPPER_H}
    again = _turned(make_runtime, root, files, head, ("first", "lib"), _made_first(root), (2, 1), **given)
    assert again.artifact.tier == "compiled"


@pytest.mark.parametrize("body", ['MY_HAS_INCLUDE("c.h")', '__has_include("c.h")'])
def test_a_quoted_probe_in_a_macro_is_looked_for_next_to_the_file_that_expands_it(make_runtime, tmp_path, body):
    """gcc looks for a quoted name next to the file whose ``#if`` expands the macro, not
    next to the header that defines it: only the latter was recorded (a stale hit)."""
    root = tmp_path / "root"
    files: dict[str, str | bytes] = {
        "lib/cfg/wrap.h": WRAPPER_H,
        "lib/cfg/config.h": f'#include "wrap.h"\n#define HAVE_C {body}\n',
        "lib/sub/uses.h": "#include <cfg/config.h>\n#if HAVE_C" + V_OR_NOT,
    }
    made = lambda: (root / "lib/sub/c.h").write_text("// now here\n")  # noqa: E731
    again = _turned(make_runtime, root, files, "#include <sub/uses.h>\n", ("lib",), made, (2, 1))
    assert again.artifact.tier == "compiled"


@pytest.mark.parametrize(
    "header",
    [
        "#define X_HAS_INCLUDE(...) __has_include(__VA_ARGS__)\n#define TWO(a, b) __has_include(b)\n#define V 5\n",
        '#define MY_HAS_INCLUDE(_X) __has_include(_X)\n#define V 5 // was: MY_HAS_INCLUDE("/opt/vendor/f.h")\n',
        "#define V 5\n#if 0\n/* #if MY_HAS_INCLUDE(NAME) */\n#endif\n",
    ],
    ids=["wrappers_never_called", "a_call_in_a_comment", "a_call_in_a_block_comment"],
)
def test_a_header_that_only_defines_or_mentions_wrappers_is_cached(make_runtime, tmp_path, header):
    """Defining a variadic or two-parameter wrapper made every build including it go
    uncached, and a wrapper call in a comment naming a path outside the roots failed the
    compile (UndeclaredDependencyError)."""
    again = _turned(make_runtime, tmp_path / "root", {"inc/x.h": header}, '#include "x.h"\n', ("inc",), list, (5, 5))
    assert again.artifact.tier == "disk"


def test_a_quoted_include_on_the_first_line_after_a_byte_order_mark_is_recorded(make_runtime, tmp_path):
    """``#include "x.h"`` on a header's first line, after a UTF-8 BOM, was not seen: its
    lookup next to the header was not recorded, and an x.h made there hit the old binary."""
    root = tmp_path / "root"
    files: dict[str, str | bytes] = {"lib/sub/a.h": b'\xef\xbb\xbf#include "x.h"\n', "lib2/x.h": "#define V 2\n"}
    made = lambda: (root / "lib/sub/x.h").write_text("#define V 1\n")  # noqa: E731
    again = _turned(make_runtime, root, files, "#include <sub/a.h>\n", ("lib", "lib2"), made, (2, 1))
    assert again.artifact.tier == "compiled"
