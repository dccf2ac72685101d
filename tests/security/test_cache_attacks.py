"""Attacks on the cache itself and on the names that build paths: one test per
attack, each asserting the typed outcome and that nothing was read, written
outside the staging dir, or published."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

import safejit
from safejit.cache.staging import settle
from safejit.keys import digest_bytes
from tests.conftest import ADD_C, assert_cache_sound, leaves
from tests.security._support import SECRET_TOKEN, assert_no_secret, assert_nothing_published, write_wrapper

ADD = safejit.Source(ADD_C, "add")
KEY = b"k" * 32


@pytest.mark.parametrize("tenant", ["../other", "a/b", "A", "", "x" * 64, ".hidden", "t\0", "t\n"])
def test_tenant_name_injection_is_refused(tenant, cache_dir):
    with pytest.raises(safejit.ConfigError):
        safejit.Config(tenant=tenant, cache_dirs=(str(cache_dir),))
    assert os.listdir(cache_dir) == []


@pytest.mark.parametrize("name", ["../evil", "a/b", "a b", "x;rm", "-o", "ä", "\0", "1st"])
def test_kernel_name_injection_is_refused(name, make_runtime, cache_dir):
    with pytest.raises(safejit.ConfigError):
        safejit.Source(ADD_C, name)
    # A file name only ever contributes its last component to the staging dir.
    staged = safejit.Source(ADD_C, "ok", filename="../../etc/x.c").staged_filename(".c")
    assert staged == "x.c"
    assert os.listdir(cache_dir) == []


def test_oversized_source_is_refused_before_any_work(make_runtime, cache_dir):
    rt = make_runtime(max_source_bytes=1024)
    with pytest.raises(safejit.LimitExceededError):
        rt.compile(safejit.Source(ADD_C + "/*" + "x" * 2000 + "*/", "add"))
    assert rt.stats()["compiles"] == 0
    assert not (cache_dir / "v1").exists() or leaves(cache_dir) == []


def test_compile_that_writes_without_bound_is_stopped(make_runtime, project, cache_dir):
    """A compiler writing forever hits the file-size rlimit (or the timeout), never fills the disk."""
    cc = write_wrapper(project, "yes > big.bin; echo rc=$?; ls -l big.bin; exit 1")
    from safejit.sandbox import runner as sandbox

    rt = make_runtime(source_roots=(str(project),), host_cc=str(cc), compile_timeout_s=60)
    limits = sandbox.Limits(file_size=1 << 20)
    rt._init()[0].sandbox.limits = limits  # a small limit keeps the test quick
    with pytest.raises(safejit.CompileError) as exc:
        rt.compile(ADD)
    assert "rc=153" in exc.value.log  # 128 + SIGXFSZ: stopped by the file-size limit
    assert " 1048576 " in exc.value.log  # and the file stopped at the limit
    assert_nothing_published(cache_dir)


def _one_leaf(make_runtime, cache_dir, **cfg) -> tuple[safejit.Runtime, Path]:
    rt = make_runtime(**cfg)
    art = rt.build(ADD)
    return rt, Path(art.path)


def _rewrite_manifest(leaf: Path, change) -> None:
    manifest = leaf / "manifest.json"
    data = json.loads(manifest.read_text())
    change(data)
    raw = json.dumps(data).encode()
    manifest.write_bytes(raw)
    (leaf / ".committed").write_bytes(digest_bytes(raw).encode())  # a consistent forgery


@pytest.mark.parametrize("relpath", ["../../../../etc/hostname", "/etc/hostname", "a/../../../etc/hostname"])
def test_manifest_rewritten_to_point_outside_the_roots_is_a_miss_and_reads_nothing(
    make_runtime, cache_dir, outside, relpath
):
    _, leaf = _one_leaf(make_runtime, cache_dir)

    def point_outside(data):
        data["deps"][0][1] = relpath
        from safejit.keys import deps_key

        data["deps_key"] = deps_key([tuple(d) for d in data["deps"]], [tuple(n) for n in data["negatives"]])

    _rewrite_manifest(leaf, point_outside)
    rt = make_runtime()
    mod = rt.compile(ADD)
    assert mod.kernel("add")(1, 2) == 3
    assert rt.stats()["disk_hits"] == 0 and rt.stats()["compiles"] == 1
    assert_cache_sound(cache_dir)


def test_planted_unsigned_leaf_is_a_miss_under_a_signing_key(make_runtime, cache_dir):
    _one_leaf(make_runtime, cache_dir)  # written by someone without the key
    rt = make_runtime(signing_key=KEY, require_signed=True)
    assert rt.compile(ADD).kernel("add")(2, 2) == 4
    assert rt.stats()["disk_hits"] == 0 and rt.stats()["compiles"] == 1
    signed = make_runtime(signing_key=KEY)
    assert signed.compile(ADD).artifact.source == "disk"  # the signed one now verifies


def test_planted_leaf_with_a_forged_signature_is_a_miss(make_runtime, cache_dir):
    _, leaf = _one_leaf(make_runtime, cache_dir, signing_key=KEY)
    _rewrite_manifest(leaf, lambda d: d.update(signature="0" * 64))
    rt = make_runtime(signing_key=KEY)
    rt.compile(ADD)
    assert rt.stats()["disk_hits"] == 0 and rt.stats()["compiles"] == 1


def test_planted_artifact_swap_with_a_consistent_manifest_is_caught_by_the_signature(make_runtime, cache_dir):
    """Someone with write access replaces the artifact and fixes the manifest digest and marker."""
    _, leaf = _one_leaf(make_runtime, cache_dir, signing_key=KEY)
    evil = make_runtime(cache_dirs=(str(cache_dir.parent / "evil"),)).build(
        safejit.Source("int add(int a, int b) { return a - b; }", "add")
    )
    evil_bytes = (Path(evil.path) / "artifact.so").read_bytes()
    (leaf / "artifact.so").write_bytes(evil_bytes)
    _rewrite_manifest(leaf, lambda d: d["artifact"].update(size=len(evil_bytes), digest=digest_bytes(evil_bytes)))
    rt = make_runtime(signing_key=KEY)
    assert rt.compile(ADD).kernel("add")(5, 3) == 8  # never the planted subtraction
    assert rt.stats()["disk_hits"] == 0


def test_leaf_copied_from_another_tenant_is_not_used(make_runtime, cache_dir):
    a = make_runtime(tenant="team-a")
    art = a.build(ADD)
    b = make_runtime(tenant="team-b")
    b_key = b.build(ADD).build_key
    assert b_key != art.build_key  # tenants never share a key
    # Copy team-a's leaf to where team-b would look for its own key.
    b_leaf_dir = cache_dir / "v1" / "team-b" / "host" / b_key[:2] / f"build-{b_key}"
    settle()  # (the compiles' background work is done: nothing races the removal)
    shutil.rmtree(b_leaf_dir)
    b_leaf_dir.mkdir(parents=True)
    shutil.copytree(art.path, b_leaf_dir / Path(art.path).name)
    fresh = make_runtime(tenant="team-b")
    fresh.compile(ADD)
    assert fresh.stats()["disk_hits"] == 0 and fresh.stats()["compiles"] == 1  # "mismatch": another key, tenant


def test_cache_root_swapped_for_a_symlink_between_calls(make_runtime, tmp_path, outside):
    """The root is resolved once; a later swap to a symlink pointing elsewhere is not followed."""
    root = tmp_path / "cache-root"
    root.mkdir()
    rt = make_runtime(cache_dirs=(str(root),))
    rt.compile(ADD)
    moved = tmp_path / "moved"
    settle()  # (the spare work dirs made after a compile go with the rest, not to a root made again)
    root.rename(moved)
    root.symlink_to(outside)  # now "cache-root" points at the outside dir
    with pytest.raises(safejit.CacheError):
        rt.compile(safejit.Source("int mul(int a, int b) { return a * b; }", "mul"))
    assert not (outside / "v1").exists()  # nothing written through the swapped link
    assert sorted(os.listdir(outside)) == ["secret", "secret.h"]
    assert_cache_sound(moved)


def test_secret_never_appears_in_errors_of_a_rejected_leaf(make_runtime, cache_dir, outside):
    _, leaf = _one_leaf(make_runtime, cache_dir)
    _rewrite_manifest(leaf, lambda d: d.update(name=(outside / "secret").read_text()))
    rt = make_runtime()
    rt.compile(ADD)
    assert_no_secret(*(str(v) for v in rt.stats().values()))
    assert SECRET_TOKEN not in json.dumps(rt.stats())


@pytest.mark.parametrize("planted", ["artifact.so", "manifest.json", ".committed"])
def test_fifo_planted_in_a_leaf_does_not_hang_readers(planted, make_runtime, cache_dir):
    """Anyone who can write the cache swaps a leaf file for a FIFO: opening it to read would
    block every process that looks the key up. The leaf must be a miss, at once."""
    _, leaf = _one_leaf(make_runtime, cache_dir)
    (leaf / planted).unlink()
    os.mkfifo(leaf / planted)
    rt = make_runtime()
    assert rt.compile(ADD).kernel("add")(2, 5) == 7
    assert rt.stats()["disk_hits"] == 0 and rt.stats()["compiles"] == 1
    assert_cache_sound(cache_dir)


def test_header_swapped_for_a_fifo_does_not_hang_revalidation(make_runtime, project, cache_dir):
    """A dependency replaced by a FIFO: the memory and disk tiers must not block reading it
    (the rebuild then blocks in the compiler, which the timeout ends; where the lookup
    recorder runs in the preprocessor, it refuses to open a FIFO, which reads to the
    compiler as not there: the compile fails at once)."""
    src = safejit.Source('#include "value.h"\nint value(void) { return VALUE; }\n', "value")
    inc = (str(project / "include"),)
    rt = make_runtime(source_roots=(str(project),), max_staleness_s=0, compile_timeout_s=2)
    assert rt.compile(src, include_dirs=inc).kernel("value")() == 42
    inner = project / "include" / "inner.h"
    inner.unlink()
    os.mkfifo(inner)
    for runtime in (rt, make_runtime(source_roots=(str(project),), compile_timeout_s=2)):  # memory, then disk
        with pytest.raises(safejit.CompileError, match=r"ran past|inner\.h: (Invalid argument|not found)"):
            runtime.compile(src, include_dirs=inc)
    assert len(leaves(cache_dir)) == 1  # the first build's, and nothing new


@pytest.mark.parametrize("field", ["deps", "artifact", "build_key", "kernels"])
def test_planted_manifest_without_a_field_is_a_miss_not_a_crash(make_runtime, cache_dir, field):
    # A manifest missing "signature" once raised KeyError out of every lookup of the key.
    _, leaf = _one_leaf(make_runtime, cache_dir)
    _rewrite_manifest(leaf, lambda d: d.pop(field))
    rt = make_runtime()
    assert rt.compile(ADD).kernel("add")(1, 2) == 3
    assert rt.stats()["disk_hits"] == 0 and rt.stats()["compiles"] == 1
    assert_cache_sound(cache_dir)


def test_planted_manifest_without_a_signature_is_a_miss_under_a_key(make_runtime, cache_dir):
    _, leaf = _one_leaf(make_runtime, cache_dir, signing_key=KEY)
    _rewrite_manifest(leaf, lambda d: d.pop("signature"))
    rt = make_runtime(signing_key=KEY)
    assert rt.compile(ADD).kernel("add")(1, 2) == 3
    assert rt.stats()["disk_hits"] == 0 and rt.stats()["compiles"] == 1
    assert_cache_sound(cache_dir)


def test_a_dependency_reached_through_a_directory_swapped_for_a_symlink_out_is_a_miss(
    make_runtime, project, outside, cache_dir
):
    # A verification confines the file it actually opens: through a symlinked dir on the
    # way (not only a symlink at the end), a dependency outside the roots is no hit, even
    # with the very bytes it was hashed with (else a planted manifest could test guesses
    # of files outside the roots).
    (project / "sub").mkdir()
    (project / "sub" / "h.h").write_text("#define H 4\n")
    source = safejit.Source('#include "sub/h.h"\nint h(void) { return H; }\n', "h")
    first = make_runtime(source_roots=(str(project),), sandbox="off")
    assert first.compile(source, include_dirs=(str(project),)).kernel("h")() == 4
    (project / "sub").rename(outside / "sub")
    (project / "sub").symlink_to(outside / "sub")
    rt = make_runtime(source_roots=(str(project),), sandbox="off")
    assert rt.explain(source, include_dirs=(str(project),)).result == "miss"
    with pytest.raises(safejit.UndeclaredDependencyError):
        rt.compile(source, include_dirs=(str(project),))
    assert rt.stats()["disk_hits"] == 0


def test_planted_dependency_through_a_symlink_to_an_endless_file_is_refused_unread(make_runtime, project, cache_dir):
    # /proc/self/pagemap is a regular file of size 0 with ~512 GiB to read: a planted
    # manifest naming it through a symlink under a root must be refused before any read.
    (project / "evil").symlink_to("/proc/self/pagemap")
    _, leaf = _one_leaf(make_runtime, cache_dir, source_roots=(str(project),))

    def point_at_evil(data):
        from safejit.keys import deps_key

        data["deps"].insert(0, ["s0", "evil", "0" * 64])
        data["deps_key"] = key[0] = deps_key([tuple(d) for d in data["deps"]], [tuple(n) for n in data["negatives"]])

    key = [""]
    _rewrite_manifest(leaf, point_at_evil)
    leaf.rename(leaf.with_name(f"deps-{key[0]}"))  # a leaf's name is its deps key
    rt = make_runtime(source_roots=(str(project),))
    started = time.monotonic()
    assert rt.compile(ADD).kernel("add")(1, 2) == 3
    assert time.monotonic() - started < 30 and rt.stats()["disk_hits"] == 0


def _plant_dependency(make_runtime, cache_dir, roots, anchor, relpath) -> None:
    """A consistent, unsigned leaf for ADD whose first dependency is ``anchor/relpath``."""
    _, leaf = _one_leaf(make_runtime, cache_dir, source_roots=roots)
    key = [""]

    def add_dep(data):
        from safejit.keys import deps_key

        data["deps"].insert(0, [anchor, relpath, "0" * 64])
        try:
            key[0] = deps_key([tuple(d) for d in data["deps"]], [tuple(n) for n in data["negatives"]])
        except UnicodeEncodeError:  # no closure holds a lone surrogate: any name will do
            key[0] = "e" * 64
        data["deps_key"] = key[0]

    _rewrite_manifest(leaf, add_dep)
    leaf.rename(leaf.with_name(f"deps-{key[0]}"))


@pytest.mark.parametrize(
    ("roots", "relpath"), [(("/",), "proc/self/pagemap"), (None, "a\ud800b.h")], ids=["proc-under-a-root", "surrogate"]
)
def test_planted_dependency_that_cannot_be_a_file_is_a_quick_miss(make_runtime, project, cache_dir, roots, relpath):
    # A /proc file reachable under a root (size 0, endless to read) is read no further than
    # its size; a name the OS cannot take is a miss, never an exception out of compile().
    roots = roots or (str(project),)
    _plant_dependency(make_runtime, cache_dir, roots, "s0", relpath)
    rt = make_runtime(source_roots=roots)
    started = time.monotonic()
    assert rt.explain(ADD).result == "miss"
    assert rt.compile(ADD).kernel("add")(1, 2) == 3
    assert time.monotonic() - started < 30 and rt.stats()["disk_hits"] == 0


def test_verifying_a_dependency_never_opens_a_terminal_as_its_own(tmp_path):
    # A symlink under a root to a terminal: a session leader without one (a daemon) that
    # verified it would take it as its controlling terminal (then ^C on it reaches it).
    code = (
        "import os, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from safejit.closure.hashing import hash_opened\n"
        "master, slave = os.openpty(); name = os.ttyname(slave); os.close(slave)\n"
        "os.setsid()\n"
        "try:\n"
        "    hash_opened(name, lambda real: True)\n"
        "except OSError:\n"
        "    pass\n"
        "print(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[4])\n"
    )
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code, str(Path(safejit.__file__).parent.parent)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "0", out


def test_a_compiler_working_in_the_cache_root_cannot_fill_the_stage_its_leaf_is_published_from(
    make_runtime, cache_dir, monkeypatch
):
    """With its scratch in the cache root (``scratch="cache"``, or /dev/shm unusable: another
    user can squat this user's name there), a compiler may write anywhere in the work
    dir, the publish stage included: the leaf was staged there early and published from
    it, checked against the bytes safejit remembered writing, not those on disk. A
    compiler subverted by its input (here, a write after its compile) could publish a
    self-consistent leaf of its own, loaded by the next process."""
    from safejit.backends.host import HostBackend

    src = safejit.Source("int k(void) { return 1; }\n", "k")
    rt = make_runtime(scratch="cache")
    rt.compile(safejit.Source("int warm(void) { return 0; }\n", "warm"))
    settle()  # (the next compile takes a prepared work dir, its stage made ahead)
    real = HostBackend.compile
    planted = []

    def subverted(self, ctx):
        out = real(self, ctx)
        stage = Path(ctx.workdir) / "leaf"
        if (stage / "artifact.so").exists():
            (stage / "artifact.so").write_bytes(b"\x7fELF planted")
            planted.append(stage)
        return out

    monkeypatch.setattr(HostBackend, "compile", subverted)
    assert rt.compile(src).kernel("k")() == 1
    monkeypatch.undo()
    assert planted  # (the stage was within the compiler's reach, and written)
    again = make_runtime(scratch="cache").compile(src)
    assert again.artifact.tier == "disk" and again.kernel("k")() == 1
    assert_cache_sound(cache_dir)


def test_an_artifact_past_the_limit_is_refused_before_it_is_read(make_runtime, cache_dir, monkeypatch):
    """One directive (``.skip``) makes an artifact of any size: it was read whole into this
    process, at its close and again after the run, and its ELF parsed, before the limit
    refused it (a 1 GiB one: 2 GiB of memory, 9 s). Now it is refused by its size, unread."""
    from safejit.closure import hashing

    real, read = hashing._read_all, []

    def spy(fd: int, st: os.stat_result) -> bytes:
        read.append(st.st_size)
        return real(fd, st)

    monkeypatch.setattr(hashing, "_read_all", spy)
    rt = make_runtime(max_artifact_bytes=1 << 20)
    code = 'asm(".section .data\\nbig: .skip 8388608, 0x41\\n.previous");\nint f(void) { return 1; }\n'
    with pytest.raises(safejit.LimitExceededError, match="the limit is 1048576"):
        rt.compile(safejit.Source(code, "f"))
    assert read and max(read) < 1 << 20, read  # (the depfile and the like, never the artifact)
    settle()
    assert_nothing_published(cache_dir)
    assert rt.compile(safejit.Source("int f(void) { return 1; }\n", "f")).kernel("f")() == 1
