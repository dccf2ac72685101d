"""Machine-dependent flags (-march=native, -mtune=native, -mcpu=native) are built and
keyed as what they mean on this machine (DESIGN.md §4): the host backend asks gcc's
driver (``cc -###``) and puts the CPU, its instruction sets and cache sizes in their
place. A node whose CPU differs resolves them otherwise, so it never gets this one's
build from a shared cache; spelling the resolution out by hand keys the same."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import safejit
from safejit.backends import host
from safejit.backends._native import cc1_options, resolve_native
from safejit.policy.flags import check_flags
from tests.conftest import ADD_C, assert_cache_sound
from tests.security._support import assert_nothing_published, write_wrapper

ADD = safejit.Source(ADD_C, "add")
GCC_LISTING = (
    "Using built-in specs.\n"
    " /usr/lib/gcc/x86_64-linux-gnu/12/cc1 -quiet -imultiarch x86_64-linux-gnu /dev/null "
    '"-march=znver3" -mmmx -mno-fma4 --param "l1-cache-size=32" --param=l2-cache-size=1024 '
    '"-mtune=znver3" -quiet -dumpbase null -o /tmp/ccX.s\n'
    " as --64 -o /dev/null /tmp/ccX.s\n"
)


def _argv(art: safejit.Artifact) -> list[str]:
    return json.loads((Path(art.path) / "manifest.json").read_text())["argv"]


def _plain_run(argv, *, cwd, timeout=None, extra_read=(), watch=()):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    class Outcome:
        returncode = done.returncode
        log = done.stdout + done.stderr
        seconds = 0.0
        files: dict[str, bytes] = {}

    return Outcome()


def _resolution(flag: str) -> tuple[str, ...]:
    return resolve_native(_plain_run, "/usr/bin/cc", "c", [flag])


def test_the_cc1_line_gives_the_machine_options():
    assert cc1_options(GCC_LISTING) == [
        "-march=znver3",
        "-mmmx",
        "-mno-fma4",
        "--param=l1-cache-size=32",
        "--param=l2-cache-size=1024",
        "-mtune=znver3",
    ]
    assert cc1_options(' "/usr/bin/clang-16" "-cc1" "-target-cpu" "znver3"\n') is None


def test_march_native_is_built_as_what_it_means_here(make_runtime, cache_dir):
    rt = make_runtime()
    art = rt.build(ADD, flags=["-O2", "-march=native", "-mno-avx512f"])
    argv = _argv(art)
    assert not [a for a in argv if "native" in a]
    resolved = _resolution("-march=native")
    assert [a for a in resolved if a.startswith("-march=")]
    at = argv.index(resolved[0])
    # In the place of -march=native: what the tenant put after it still wins.
    assert argv[at : at + len(resolved) + 1] == [*resolved, "-mno-avx512f"]
    assert rt.compile(ADD, flags=["-O2", "-march=native", "-mno-avx512f"]).kernel("add")(2, 3) == 5
    assert_cache_sound(cache_dir)


def test_native_keys_like_its_resolution_spelled_out(make_runtime):
    native = make_runtime().build(ADD, flags=["-march=native"])
    by_hand = make_runtime()
    spelled = by_hand.build(ADD, flags=list(_resolution("-march=native")))
    assert spelled.build_key == native.build_key
    assert spelled.source == "disk" and by_hand.stats()["compiles"] == 0


@pytest.mark.parametrize("flag", ["-march=native", "-mtune=native", "-mcpu=native"])
def test_another_machines_resolution_keys_otherwise_and_is_never_served_here(
    make_runtime, cache_dir, monkeypatch, flag
):
    here = make_runtime().build(ADD, flags=[flag])
    # A second node, another CPU: the same flag means something else there.
    monkeypatch.setattr(host, "resolve_native", lambda *a, **k: ("-march=skylake", "-mtune=skylake"))
    there = make_runtime()
    art = there.build(ADD, flags=[flag])
    assert art.build_key != here.build_key
    assert there.stats()["compiles"] == 1 and there.stats()["disk_hits"] == 0
    assert "-march=skylake" in _argv(art)
    assert_cache_sound(cache_dir)


def test_native_flags_resolve_together_once_per_process(make_runtime, tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    log = tmp_path / "driver.log"
    cc = write_wrapper(root, 'exec /usr/bin/cc "$@"', name="cc-logged")
    cc.write_text(cc.read_text().replace("case", f'case "$*" in *"-###"*) echo "$*" >> {log};; esac\ncase', 1))
    rt = make_runtime(source_roots=(str(root),), host_cc=str(cc), sandbox="off")
    for name in ("one", "two"):
        rt.compile(
            safejit.Source(f"int {name}(void) {{ return 1; }}\n", name), flags=["-march=native", "-mtune=native"]
        )
    lines = log.read_text().splitlines()
    assert len(lines) == 2  # the driver's line without them and with them, once
    assert "-march=native -mtune=native" in lines[1]


def test_native_on_a_compiler_that_does_not_show_its_meaning_is_refused(make_runtime, tmp_path, cache_dir):
    """clang resolves -march=native into -cc1 target features, which have no driver
    spelling: such a compiler's native flags are refused, never passed on as they are."""
    root = tmp_path / "proj"
    root.mkdir()
    marker = tmp_path / "compiled"
    cc = write_wrapper(root, f'touch {marker}; exec /usr/bin/cc "$@"', name="cc-like-clang")
    clang_line = """ "/usr/bin/clang" "-cc1" "-target-cpu" "x86-64" """
    cc.write_text(
        cc.read_text().replace("case", f'case "$*" in *"-###"*) echo \'{clang_line}\' >&2; exit 0;; esac\ncase', 1)
    )
    rt = make_runtime(source_roots=(str(root),), host_cc=str(cc), sandbox="off")
    with pytest.raises(safejit.FlagPolicyError) as exc:
        rt.compile(ADD, flags=["-march=native"])
    assert exc.value.flag == "-march=native" and "-march=<cpu>" in str(exc.value)
    assert not marker.exists()
    assert_nothing_published(cache_dir)


def test_a_resolution_off_the_table_is_refused(make_runtime, cache_dir, monkeypatch):
    monkeypatch.setattr(host, "resolve_native", lambda *a, **k: ("-march=znver3", "-fplugin=/tmp/x.so"))
    with pytest.raises(safejit.FlagPolicyError, match="-fplugin"):
        make_runtime().compile(ADD, flags=["-march=native"])
    assert_nothing_published(cache_dir)


def test_the_policy_never_passes_native_on_unresolved():
    with pytest.raises(safejit.FlagPolicyError):
        check_flags(["-march=native"], lambda p, w: p, family="gcc")
    assert check_flags(["-O2", "-march=native", "-g"], lambda p, w: p, family="gcc", machine=lambda f: ("-mavx",)) == (
        "-O2",
        "-mavx",
        "-g",
    )
    for family in ("nvcc", "nvrtc", "bisheng"):
        with pytest.raises(safejit.FlagPolicyError):
            check_flags(["-march=native"], lambda p, w: p, family=family, machine=lambda f: ("-mavx",))
