"""The Ascend backend with a STAND-IN toolkit: scripts named ``bisheng`` and
``ld.lld`` that build real ELF objects (with g++) and add ``.ascend.meta.<name>``
sections with objcopy, one for each ``// meta: NAME`` line in the source. No
CANN toolkit or Ascend hardware is involved; what runs here is everything up to
the device: toolkit discovery, compile, cache, closure, kernel names, sandbox,
confinement."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import safejit
from safejit.backends.ascend.backend import ascend_kernel_names, find_toolkit
from tests.conftest import assert_cache_sound, leaves, settle

pytestmark = pytest.mark.skipif(
    not (shutil.which("objcopy") and shutil.which("g++") and shutil.which("ld")),
    reason="needs binutils and g++ for the stand-in toolkit",
)

BISHENG = r"""#!/bin/sh
# STAND-IN for CANN's bisheng (tests only).
case "$*" in
  *--version*) echo "bisheng stand-in 0.1 (safejit tests)"; exit 0;;
  *"-E -v"*) exec /usr/bin/g++ -E -v -x c++ /dev/null -o /dev/null;;
esac
out=""; dep=""; src=""; args=""; prev=""
for a in "$@"; do
  case "$prev" in -o) out="$a";; -MF) dep="$a";; esac
  case "$a" in
    -o|-MF|-MD|-c|-O2|-x|cce|--cce-aicore-only|--cce-aicore-arch=*|--npu-arch=*) ;;
    *) if [ "$prev" != "-o" ] && [ "$prev" != "-MF" ] && [ "$prev" != "-x" ]; then args="$args $a"; fi;;
  esac
  prev="$a"; src="$a"
done
[ -n "$ARCH_LOG" ] && echo "$*" >> "$ARCH_LOG"
/usr/bin/g++ -c -x c++ -D__global__= -D__aicore__= -MD -MF "$dep" $args -o "$out" || exit $?
grep -o '// meta: [A-Za-z0-9_]*' "$src" | while read -r _ _ name; do
  printf '\001\000\004\000\001\000\000\000' > "$out.tlv"
  /usr/bin/objcopy --add-section ".ascend.meta.$name=$out.tlv" "$out" || exit 1
  rm -f "$out.tlv"
done
"""

LLD = r"""#!/bin/sh
# STAND-IN for CANN's ld.lld (tests only): -m aicorelinux -Ttext=0 --no-dependent-libraries IN -o OUT
case "$*" in *--version*) echo "LLD stand-in 0.1 (safejit tests)"; exit 0;; esac
[ "$1" = "-m" ] && [ "$2" = "aicorelinux" ] && [ "$3" = "-Ttext=0" ] && [ "$4" = "--no-dependent-libraries" ] ||
  { echo "unexpected argv: $*" >&2; exit 2; }
exec /usr/bin/ld -r "$5" -o "$7"
"""

ADD = """#include "tile.h"
// meta: add_custom
extern "C" __global__ __aicore__ void add_custom(float* x, float* y, float* z, int n) {
  for (int i = 0; i < n && i < TILE; ++i) z[i] = x[i] + y[i];
}
"""


@pytest.fixture(params=["Ascend", "Ascend Toolkit"])
def toolkit(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A stand-in toolkit; also under a directory whose name holds a space (the linker's
    path was cut at the first space: '/opt/Ascend' ran as the linker)."""
    home = tmp_path / request.param / "latest"
    bin_dir = home / "compiler" / "ccec_compiler" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("bisheng", BISHENG), ("ld.lld", LLD)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return home


@pytest.fixture
def ascend_project(tmp_path: Path) -> Path:
    root = tmp_path / "op"
    (root / "include").mkdir(parents=True)
    (root / "include" / "tile.h").write_text('#include "tile_size.h"\n#define TILE (TILE_SIZE * 2)\n')
    (root / "include" / "tile_size.h").write_text("#define TILE_SIZE 64\n")
    return root


def _rt(make_runtime, toolkit: Path, project: Path, **cfg) -> safejit.Runtime:
    return make_runtime(backend="ascend", ascend_home=str(toolkit), source_roots=(str(project),), **cfg)


def test_toolkit_discovery_prefers_config_then_environment(toolkit, monkeypatch, make_runtime):
    from safejit import _env

    assert find_toolkit([str(toolkit)])[1].endswith("ccec_compiler/bin/bisheng")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(toolkit))
    home, _, lld = find_toolkit(_env.ascend_home_candidates())
    assert home == str(toolkit.resolve()) and lld.endswith("ld.lld")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(toolkit.parent / "missing"))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    with pytest.raises(safejit.ConfigError, match="ascend_home"):
        find_toolkit(_env.ascend_home_candidates())
    monkeypatch.setenv("ASCEND_HOME_PATH", str(toolkit))
    env_rt = make_runtime(backend="ascend")  # Config.ascend_home unset: the environment decides
    assert env_rt.build(safejit.Source('// meta: k\nextern "C" void k() {}\n', "k"), arch="dav-c220").kernels == ("k",)
    env_rt.close()


def test_compile_cache_closure_and_rebuild_on_header_edit(make_runtime, toolkit, ascend_project, cache_dir):
    inc = (str(ascend_project / "include"),)
    src = safejit.Source(ADD, "add_custom")
    art = _rt(make_runtime, toolkit, ascend_project).build(src, include_dirs=inc, arch="dav-c220")
    assert art.kernels == ("add_custom",) and art.source == "compiled"
    manifest = json.loads((Path(art.path) / "manifest.json").read_text())
    assert {rel for _, rel, _ in manifest["deps"]} >= {"include/tile.h", "include/tile_size.h"}
    assert "bisheng stand-in" in manifest["toolchain"]["version"] and "LLD stand-in" in manifest["toolchain"]["version"]
    assert (Path(art.path) / "artifact.o").read_bytes()[:4] == b"\x7fELF"
    again = _rt(make_runtime, toolkit, ascend_project)
    assert again.build(src, include_dirs=inc, arch="dav-c220").source == "disk" and again.stats()["compiles"] == 0
    (ascend_project / "include" / "tile_size.h").write_text("#define TILE_SIZE 128\n")
    settle()
    edited = _rt(make_runtime, toolkit, ascend_project)
    rebuilt = edited.build(src, include_dirs=inc, arch="dav-c220")
    assert rebuilt.source == "compiled" and rebuilt.deps_key != art.deps_key and edited.stats()["compiles"] == 1
    assert len(leaves(cache_dir)) == 2
    assert_cache_sound(cache_dir)


@pytest.mark.parametrize(
    ("metas", "expected"),
    [
        (["add_custom"], ("add_custom",)),  # single
        (["matmul_mix_aic", "matmul_mix_aiv"], ("matmul",)),  # mixed: suffixes stripped, merged
        (["a", "b", "a_mix_aiv"], ("a", "b")),  # duplicate after stripping
    ],
)
def test_kernel_names_from_ascend_meta_sections(make_runtime, toolkit, ascend_project, metas, expected):
    code = "".join(f"// meta: {m}\n" for m in metas) + 'extern "C" __global__ __aicore__ void k() {}\n'
    art = _rt(make_runtime, toolkit, ascend_project).build(safejit.Source(code, "k"), arch="dav-c220-vec")
    assert art.kernels == expected
    assert ascend_kernel_names((Path(art.path) / "artifact.o").read_bytes()) == expected


def test_binary_without_kernels_is_refused_and_not_published(make_runtime, toolkit, ascend_project, cache_dir):
    with pytest.raises(safejit.CompileError, match=r"no \.ascend\.meta"):
        _rt(make_runtime, toolkit, ascend_project).build(
            safejit.Source('extern "C" void host_only() {}\n', "none"), arch="dav-c220"
        )
    assert leaves(cache_dir) == []


@pytest.mark.parametrize("arch", [None, "sm_90", "dav", "c220"])
def test_arch_is_required_and_validated(make_runtime, toolkit, ascend_project, arch):
    with pytest.raises(safejit.ConfigError, match="arch"):
        _rt(make_runtime, toolkit, ascend_project).build(safejit.Source(ADD, "add_custom"), arch=arch)


def test_npu_arch_spelling_for_numeric_architectures(make_runtime, toolkit, ascend_project, monkeypatch, tmp_path):
    art = _rt(make_runtime, toolkit, ascend_project).build(
        safejit.Source(ADD, "add_custom"), include_dirs=(str(ascend_project / "include"),), arch="dav-2201"
    )
    argv = json.loads((Path(art.path) / "manifest.json").read_text())["argv"]
    assert "--npu-arch=dav-2201" in argv and "aicorelinux" in argv and "-Ttext=0" in argv


def test_a_clang_based_bisheng_preprocesses_apart_where_the_lookups_are_recorded(
    make_runtime, toolkit, ascend_project, cache_dir
):
    """bisheng compiles only (-c): a clang from 10 on preprocesses in the driver's own
    process then, where the recorder does not run, and with source roots nothing is
    cached. It is given -fno-integrated-cc1 (here a stand-in that says it is clang 15)."""
    bisheng = toolkit / "compiler" / "ccec_compiler" / "bin" / "bisheng"
    text = BISHENG.replace("bisheng stand-in 0.1 (safejit tests)", "BiSheng stand-in, clang version 15.0.5 (tests)")
    bisheng.write_text(text.replace("-o|-MF|-MD|-c|", "-o|-MF|-MD|-c|-fno-integrated-cc1|"))
    art = _rt(make_runtime, toolkit, ascend_project).build(
        safejit.Source(ADD, "add_custom"), include_dirs=(str(ascend_project / "include"),), arch="dav-c220-vec"
    )
    assert "-fno-integrated-cc1" in json.loads((Path(art.path) / "manifest.json").read_text())["argv"]
    assert len(leaves(cache_dir)) == 1


def test_no_precompiled_header_and_no_library_a_source_names(make_runtime, toolkit, ascend_project):
    """bisheng (clang) takes ``X.h.pch`` for the first ``-include X.h`` (binary state no
    depfile names: a stale hit after it changed); a ``#pragma comment(lib, "<path>")``
    had ld.lld open any file and quote it in its errors. The guard goes first; the
    linker takes no library an object names."""
    art = _rt(make_runtime, toolkit, ascend_project).build(
        safejit.Source(ADD, "add_custom"), include_dirs=(str(ascend_project / "include"),), arch="dav-c220"
    )
    argv = json.loads((Path(art.path) / "manifest.json").read_text())["argv"]
    first = argv.index("-include")
    assert argv[first + 1] == "{GUARD}" and first < min(i for i, a in enumerate(argv) if a.startswith("-I"))
    link = argv[argv.index("--") + 1 :]
    assert "--no-dependent-libraries" in link


def test_include_outside_the_roots_is_refused(make_runtime, toolkit, ascend_project, cache_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "tile.h").write_text("#define TILE 1\n")
    with pytest.raises(safejit.PathConfinementError):
        _rt(make_runtime, toolkit, ascend_project).build(
            safejit.Source(ADD, "add_custom"), include_dirs=(str(outside),), arch="dav-c220"
        )
    src = safejit.Source(f'#include "{outside}/tile.h"\n// meta: k\nextern "C" void k() {{}}\n', "k")
    with pytest.raises((safejit.UndeclaredDependencyError, safejit.CompileError)):
        _rt(make_runtime, toolkit, ascend_project).build(src, arch="dav-c220")
    assert leaves(cache_dir) == []


def test_toolchain_runs_sandboxed_with_a_scrubbed_environment(
    make_runtime, toolkit, ascend_project, monkeypatch, tmp_path
):
    log = tmp_path / "arch.log"
    monkeypatch.setenv("ARCH_LOG", str(log))  # not in env_passthrough: the stand-in never sees it
    monkeypatch.setenv("CPATH", str(tmp_path))
    _rt(make_runtime, toolkit, ascend_project).build(
        safejit.Source(ADD, "add_custom"), include_dirs=(str(ascend_project / "include"),), arch="dav-c220"
    )
    assert not log.exists()


def test_flags_policy_applies(make_runtime, toolkit, ascend_project, cache_dir):
    for flags in (("-o", "/tmp/x"), ("-fplugin=x.so",), ("--sysroot=/",)):
        with pytest.raises(safejit.FlagPolicyError):
            _rt(make_runtime, toolkit, ascend_project).build(
                safejit.Source(ADD, "add_custom"), flags=flags, arch="dav-c220"
            )
    assert leaves(cache_dir) == []
