"""The programs a host compiler driver runs (cc1, as, ld) are part of its toolchain:
their digests enter the build key, and a probe remembered from an earlier process
is reused only while each of them is still the same file — binutils upgraded on
its own changes no driver, and must not leave a silently stale cache."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import safejit
from safejit.backends import _toolchain as probe
from safejit.closure.hashing import hash_file
from safejit.spec import Toolchain

ONE = safejit.Source("int one(void) { return 1; }\n", "one")


def _toolchain(tmp_path: Path) -> tuple[Path, Path]:
    """A compiler driver (in a declared root) that runs its own assembler from ``bin/``."""
    root = tmp_path / "proj"
    bindir = root / "bin"
    bindir.mkdir(parents=True)
    assembler = bindir / "as"
    assembler.write_text('#!/bin/sh\nexec /usr/bin/as "$@"\n')
    assembler.chmod(0o755)
    driver = root / "cc-own-as"
    driver.write_text(f'#!/bin/sh\nexec /usr/bin/cc -B{bindir}/ "$@"\n')
    driver.chmod(0o755)
    return root, driver


def test_the_assembler_is_part_of_the_toolchain_digest(make_runtime, tmp_path):
    root, driver = _toolchain(tmp_path)
    module = make_runtime(source_roots=(str(root),), host_cc=str(driver)).compile(ONE)
    manifest = json.loads((Path(module.artifact.path) / "manifest.json").read_text())
    digests = manifest["toolchain"]["digest"].split(":")  # driver, cc1, as, ld, then what links read
    assert hash_file(str(root / "bin" / "as"))[0] in digests[:4]


def test_an_upgraded_assembler_is_a_miss_not_a_stale_hit(make_runtime, tmp_path):
    root, driver = _toolchain(tmp_path)
    config = {"source_roots": (str(root),), "host_cc": str(driver)}
    before = make_runtime(**config).compile(ONE)
    assert before.kernel("one")() == 1
    (root / "bin" / "as").write_text('#!/bin/sh\n# a newer assembler\nexec /usr/bin/as "$@"\n')
    rt = make_runtime(**config)  # a new backend: the probe remembered on disk is looked at again
    after = rt.compile(ONE)
    assert rt.stats()["compiles"] == 1 and rt.stats()["disk_hits"] == 0
    assert after.artifact.build_key != before.artifact.build_key
    assert after.kernel("one")() == 1
    again = make_runtime(**config)  # unchanged since: the remembered probe and the leaf stand
    assert again.compile(ONE).artifact.build_key == after.artifact.build_key
    assert again.stats()["disk_hits"] == 1


def test_an_assembler_switched_by_symlink_is_a_miss(make_runtime, tmp_path):
    # As /usr/bin/ld -> x86_64-linux-gnu-ld -> ld.bfd: the name stays, the file changes.
    root, driver = _toolchain(tmp_path)
    bindir = root / "bin"
    for version in ("v1", "v2"):
        (bindir / f"as-{version}").write_text(f'#!/bin/sh\n# {version}\nexec /usr/bin/as "$@"\n')
        (bindir / f"as-{version}").chmod(0o755)
    (bindir / "as").unlink()
    (bindir / "as").symlink_to("as-v1")
    config = {"source_roots": (str(root),), "host_cc": str(driver)}
    before = make_runtime(**config).compile(ONE)
    (bindir / "as").unlink()
    (bindir / "as").symlink_to("as-v2")  # as-v1 itself is untouched
    rt = make_runtime(**config)
    after = rt.compile(ONE)
    assert rt.stats()["compiles"] == 1 and after.artifact.build_key != before.artifact.build_key


def test_an_assembler_placed_ahead_in_the_drivers_dirs_is_a_miss(make_runtime, tmp_path):
    # The driver looks in its own dirs (here -B bin/) before PATH: a program that appears
    # there is what it runs from then on, though "as" still names /usr/bin/as on PATH.
    root, driver = _toolchain(tmp_path)
    (root / "bin" / "as").unlink()
    config = {"source_roots": (str(root),), "host_cc": str(driver)}
    before = make_runtime(**config).compile(ONE)
    assembler = root / "bin" / "as"
    assembler.write_text('#!/bin/sh\n# placed ahead\nexec /usr/bin/as "$@"\n')
    assembler.chmod(0o755)
    rt = make_runtime(**config)
    after = rt.compile(ONE)
    assert rt.stats()["compiles"] == 1 and after.artifact.build_key != before.artifact.build_key


def test_a_program_changed_after_it_was_hashed_is_a_changed_program(tmp_path, monkeypatch):
    # A probe hashes each program, then stores what it found: the stat it stores must be
    # the one taken as the bytes were read, or a program changed in between would be
    # trusted with the old digest by every later process.
    monkeypatch.setattr(probe, "is_racy", lambda snap, now_ns=None: False)
    program = tmp_path / "as"
    program.write_text("#!/bin/sh\n# v1\n")
    digests, tools = probe.hash_tools([(str(program), str(program))])
    program.write_text("#!/bin/sh\n# v2, changed while probing\n")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cache = probe.ProbeCache(str(state))
    tc = Toolchain(compiler="/usr/bin/cc", version="cc", digest=digests[0], roots=())
    cache.put(["ident"], tc, tools)
    assert cache.get(["ident"]) is None
    _, tools = probe.hash_tools([(str(program), str(program))])
    cache.put(["ident"], tc, tools)
    assert cache.get(["ident"]) == tc


def test_a_probe_of_programs_changed_a_moment_ago_is_not_remembered(tmp_path):
    # Their stat cannot vouch for them yet (a change within the same timestamp tick).
    program = tmp_path / "as"
    program.write_text("#!/bin/sh\n")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cache = probe.ProbeCache(str(state))
    _, tools = probe.hash_tools([(str(program), str(program))])
    cache.put(["ident"], Toolchain(compiler="/usr/bin/cc", version="cc", digest="d", roots=()), tools)
    assert cache.get(["ident"]) is None and not list(state.iterdir())


@pytest.mark.parametrize("name", ["ld", "asm"])
def test_kernels_named_like_a_tools_list_compile(make_runtime, name):
    # The assembler's and linker's lists live beside the kernel's own depfile (<name>.d).
    module = make_runtime().compile(safejit.Source("int five(void) { return 5; }\n", name))
    assert module.kernel("five")() == 5


def test_a_program_added_to_the_drivers_dirs_while_probing_is_noticed(tmp_path, monkeypatch):
    # The dirs are looked at before the probe looks for programs in them: one added in
    # between changes them, and the remembered probe is not used.
    monkeypatch.setattr(probe, "is_racy", lambda snap, now_ns=None: False)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    before = probe.dir_idents([str(bindir)])
    (bindir / "as").write_text("#!/bin/sh\n")  # placed ahead while the probe ran
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cache = probe.ProbeCache(str(state))
    tc = Toolchain(compiler="/usr/bin/cc", version="cc", digest="d", roots=())
    cache.put(["ident"], tc, (), before)
    assert cache.get(["ident"]) is None
    cache.put(["ident"], tc, (), probe.dir_idents([str(bindir)]))
    assert cache.get(["ident"]) == tc


@pytest.mark.parametrize("kind", ["missing", "not executable", "a directory"])
def test_a_configured_compiler_that_cannot_run_names_the_setting(make_runtime, tmp_path, cache_dir, kind):
    given = tmp_path / "cc"
    if kind == "not executable":
        given.write_text("#!/bin/sh\n")
        given.chmod(0o644)
    elif kind == "a directory":
        given.mkdir()
    rt = make_runtime(host_cc=str(given))
    with pytest.raises(safejit.ConfigError, match=r"Config\.host_cc \(SAFEJIT_HOST_CC\) is .*no executable file"):
        rt.compile(ONE)
    assert rt.stats()["compiles"] == 0
    assert not list(cache_dir.rglob("manifest.json"))  # nothing published


def test_no_compiler_on_the_fixed_path_says_which_setting_to_use(monkeypatch, make_runtime):
    from safejit.backends import host

    monkeypatch.setattr(host.shutil, "which", lambda *a, **k: None)
    with pytest.raises(safejit.ConfigError, match=r"caller's PATH is not searched.*SAFEJIT_HOST_CC"):
        make_runtime().compile(ONE)


def _wrapper_cc(tmp_path: Path):
    """A host compiler (a wrapper of the system's) and how to install version N of it."""
    import os
    import shutil

    real_cc = os.path.realpath(shutil.which("cc") or "/usr/bin/cc")
    cc = tmp_path / "bin" / "cc"
    cc.parent.mkdir()

    def install(version: int) -> None:
        new = cc.with_suffix(".new")
        new.write_text(f'#!/bin/sh\nexec {real_cc} -DCCVER={version} "$@"\n')
        new.chmod(0o755)
        os.replace(new, cc)

    return cc, install


def test_a_compiler_upgraded_under_a_running_process_is_used_and_keyed_as_such(make_runtime, tmp_path, monkeypatch):
    """A process kept the toolchain it probed first for good: after the compiler was
    replaced it built with the new one under the old one's key, and a process whose
    compiler is still the old one then loaded that binary from the shared cache. Past
    RECHECK_S it looks again (a stat of each program) and keys builds by what it runs."""
    monkeypatch.setattr(probe, "RECHECK_S", 0.0)
    cc, install = _wrapper_cc(tmp_path)
    src = safejit.Source("int ver(void) { return CCVER; }\n", "ver")
    install(1)
    running = make_runtime(host_cc=str(cc))
    assert running.compile(src).kernel("ver")() == 1
    install(2)
    upgraded = running.compile(safejit.Source("int ver(void) { return CCVER; } /* 2 */\n", "ver"))
    assert upgraded.kernel("ver")() == 2
    fresh = make_runtime(host_cc=str(cc)).compile(safejit.Source("int ver(void) { return CCVER; } /* 2 */\n", "ver"))
    assert upgraded.artifact.build_key == fresh.artifact.build_key and fresh.artifact.tier == "disk"
    install(1)  # (rolled back: a v1 process must not find the v2 build)
    old = make_runtime(host_cc=str(cc)).compile(safejit.Source("int ver(void) { return CCVER; } /* 2 */\n", "ver"))
    assert old.kernel("ver")() == 1 and old.artifact.tier == "compiled"


def test_a_build_across_a_compiler_upgrade_is_not_published_under_the_old_key(make_runtime, tmp_path, caplog):
    """Within RECHECK_S of its last look a process still keys builds by the toolchain it
    found: one built after the compiler was replaced was published under the old one's
    key, and a process on the old compiler loaded the new one's binary. A build whose
    toolchain changed since its probe is returned, not published."""
    import logging

    cc, install = _wrapper_cc(tmp_path)
    install(1)
    running = make_runtime(host_cc=str(cc))
    assert running.compile(safejit.Source("int ver(void) { return CCVER; }\n", "ver")).kernel("ver")() == 1
    install(2)
    later = safejit.Source("int ver(void) { return CCVER; } /* later */\n", "ver")
    with caplog.at_level(logging.WARNING):
        assert running.compile(later).kernel("ver")() == 2
    install(1)
    old = make_runtime(host_cc=str(cc)).compile(later)
    assert old.kernel("ver")() == 1 and old.artifact.tier == "compiled"


def test_a_build_across_a_compiler_replaced_and_put_back_is_not_published(make_runtime, tmp_path, monkeypatch):
    """The compiler replaced (v2) under a build keyed by v1, then put back (v1 again, a new
    file of the same bytes) and probed again while the build ran: that probe vouched, by
    value, for the toolchain the build was keyed by, and v2's binary went under v1's key.
    A probe first seen after the build began vouches for nothing."""
    import os
    import shutil
    import threading

    monkeypatch.setattr(probe, "RECHECK_S", 3600.0)  # (no look of its own in this test)
    real_cc = os.path.realpath(shutil.which("cc") or "/usr/bin/cc")
    cc = tmp_path / "bin" / "cc"
    cc.parent.mkdir()

    def running_v2() -> bool:  # (v2's sleep under way: the sandbox lets it write nothing to say so)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x001.37\x00":
                    return True
            except OSError:
                continue
        return False

    def install(version: int) -> None:
        new = cc.with_suffix(".new")
        slow = "sleep 1.37; " if version == 2 else ""
        new.write_text(f'#!/bin/sh\n{slow}exec {real_cc} -DCCVER={version} "$@"\n')
        new.chmod(0o755)
        os.replace(new, cc)

    install(1)
    rt = make_runtime(host_cc=str(cc))
    assert rt.compile(safejit.Source("int ver(void) { return CCVER; }\n", "ver")).kernel("ver")() == 1
    install(2)
    k = safejit.Source("int ver(void) { return CCVER; } /* k */\n", "ver")
    got: list[int] = []
    build = threading.Thread(target=lambda: got.append(rt.compile(k).kernel("ver")()))
    build.start()
    for _ in range(400):  # (until v2 runs the build)
        if running_v2():
            break
        time.sleep(0.01)
    install(1)  # (put back while the build runs, and probed again by another compile)
    rt._init()[0].backend._probed.forget("c")
    assert rt.compile(safejit.Source("int other(void) { return CCVER; }\n", "other")).kernel("other")() == 1
    build.join(60)
    assert got == [2]
    fresh = make_runtime(host_cc=str(cc)).compile(k)
    assert fresh.kernel("ver")() == 1 and fresh.artifact.tier == "compiled"


def test_a_memory_entry_built_before_the_compiler_was_replaced_is_stale(make_runtime, tmp_path):
    """A memory entry looked only at its files when revalidated: after the compiler was
    replaced under a running process it served the old compiler's build for good, while
    a new Runtime in the same process built with the new one."""
    cc, install = _wrapper_cc(tmp_path)
    src = safejit.Source("int ver(void) { return CCVER; }\n", "ver")
    install(1)
    rt = make_runtime(host_cc=str(cc), max_staleness_s=0.05)
    assert rt.compile(src).kernel("ver")() == 1
    assert rt.compile(src).artifact.tier == "memory"
    install(2)
    time.sleep(0.1)  # (past the entry's window: the next call revalidates it)
    again = rt.compile(src)
    assert again.kernel("ver")() == 2 and again.artifact.tier == "compiled"
    assert rt.stats()["stale"] == 1


def test_an_include_dir_the_compiler_skipped_made_later_is_a_new_toolchain(make_runtime, tmp_path):
    """A dir in the compiler's search list that is not there is skipped (``ignoring
    nonexistent directory``), and searched once made (a package installing
    ``/usr/local/include/<multiarch>``): a header there shadows the one a build read.
    The remembered probe stood, and every process and the running one served the old
    binary."""
    import os
    import shutil

    real_cc = os.path.realpath(shutil.which("cc") or "/usr/bin/cc")
    later = tmp_path / "later"
    cc = tmp_path / "bin" / "cc"
    cc.parent.mkdir()
    cc.write_text(f'#!/bin/sh\nexec {real_cc} -isystem {later} "$@"\n')
    cc.chmod(0o755)
    src = safejit.Source("#include <stdint.h>\nint v(void) {\n#ifdef LATER\nreturn 2;\n#endif\nreturn 1; }\n", "v")
    running = make_runtime(host_cc=str(cc), max_staleness_s=0.05)
    assert running.compile(src).kernel("v")() == 1
    later.mkdir()
    (later / "stdint.h").write_text("#define LATER 1\n#include_next <stdint.h>\n")
    time.sleep(0.1)
    fresh = make_runtime(host_cc=str(cc)).compile(src)  # (the probe remembered on disk, looked at again)
    assert fresh.kernel("v")() == 2 and fresh.artifact.tier == "compiled"
    assert running.compile(src).kernel("v")() == 2  # (its memory entry stale, its probe done again)
    assert running.stats()["stale"] == 1


def test_a_compiler_whose_programs_lie_outside_its_dir_is_probed_in_the_sandbox(make_runtime, tmp_path):
    """An install under /opt (gcc-toolset, spack, conda): cc1 lies beside neither the
    driver nor /usr. The probe could read only the driver's dir, so under Landlock the
    first compile failed ("cannot execute cc1"), and worked once an unconfined run had
    left its probe behind."""
    import os
    import shutil
    import subprocess

    real_cc = os.path.realpath(shutil.which("cc") or "/usr/bin/cc")
    libexec = subprocess.run([real_cc, "-print-prog-name=cc1"], capture_output=True, text=True, check=True)
    cc1 = Path(libexec.stdout.strip())
    if not cc1.is_absolute():
        pytest.skip("the compiler names no cc1 of its own")
    prefix = tmp_path / "opt"
    (prefix / "bin").mkdir(parents=True)
    mine = prefix / "libexec" / cc1.name
    mine.parent.mkdir()
    shutil.copy2(cc1, mine)
    driver = prefix / "bin" / "cc"
    driver.write_text(f'#!/bin/sh\nexec {real_cc} -B{mine.parent}/ "$@"\n')
    driver.chmod(0o755)
    rt = make_runtime(host_cc=str(driver))
    assert rt.compile(ONE).kernel("one")() == 1
