"""A real header-heavy kernel: a CuTe SGEMM (CUTLASS headers from the nvidia-cutlass
wheel, CCCL from the toolkit) through NVRTC and nvcc for sm_90, without a GPU.

One compile each way; the closure holds the CuTe headers it read; an edit of a deep
header rebuilds with another binary, a touch does not, a header made in an earlier
include dir (shadowing one that was read) rebuilds. Compiles cost seconds here: each
test shares its compiles between its assertions."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

import pytest

import safejit
from tests.conftest import settle

pytest.importorskip("cuda.bindings.nvrtc")
HAVE_NVCC = shutil.which("nvcc", path="/usr/local/cuda/bin:/usr/bin") is not None
KERNEL = (Path(__file__).resolve().parents[3] / "data" / "cute_sgemm.cu").read_text()
#: In cute/arch/mma.hpp, UniversalFMA::fma: the FMA every thread of the SGEMM runs.
FMA_CALL = "    fma(d, a, b, c);\n"
FMA_EDITED = "    fma(d, a, b, c);\n    d = d + D(1);\n"


def _cutlass_include() -> Path | None:
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        return None
    found = Path(spec.origin).parent / "source" / "include"
    return found if (found / "cute" / "tensor.hpp").is_file() else None


CUTLASS = _cutlass_include()
pytestmark = pytest.mark.skipif(CUTLASS is None, reason="no nvidia-cutlass headers")
COMPILERS = ["nvrtc", pytest.param("nvcc", marks=pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc"))]


@pytest.fixture
def cute_tree(tmp_path: Path) -> Path:
    """A source root with a copy of the CuTe and CUTLASS headers under ``include/`` and
    an empty ``early/``, searched first."""
    assert CUTLASS is not None
    root = tmp_path / "cutlass"
    for part in ("cute", "cutlass"):
        shutil.copytree(CUTLASS / part, root / "include" / part)
    (root / "early").mkdir()
    settle()  # (a compile right away must not see the copies as written during it)
    return root


def _manifest(art: safejit.Artifact) -> dict:
    return json.loads((Path(art.path) / "manifest.json").read_text())


@pytest.mark.parametrize("compiler", COMPILERS)
def test_cute_sgemm_closure_and_rebuilds(make_runtime, cute_tree, cache_dir, compiler):
    config = {"backend": "cuda", "cuda_compiler": compiler, "source_roots": (str(cute_tree),)}
    dirs = (str(cute_tree / "early"), str(cute_tree / "include"))
    src = safejit.Source(KERNEL, "cute_sgemm")

    def build(expect: str) -> safejit.Artifact:
        rt = make_runtime(**config)  # a fresh runtime: its memory tier knows nothing yet
        art = rt.build(src, include_dirs=dirs, arch="sm_90", flags=("-std=c++17",))
        assert art.source == expect
        assert rt.stats()["compiles"] == (expect == "compiled")
        return art

    first = build("compiled")
    assert first.kernels == ("cute_sgemm_nt",)
    manifest = _manifest(first)
    deps = {rel for anchor, rel, _ in manifest["deps"] if anchor == "s0"}
    assert {"include/cute/tensor.hpp", "include/cute/arch/mma.hpp", "include/cute/layout.hpp"} <= deps
    # The toolkit's headers too (CCCL's cuda/std, for NVRTC; nvcc takes the host's <cassert>).
    toolkit = "cuda/std/cassert" if compiler == "nvrtc" else "cuda_runtime.h"
    assert any(rel.endswith(toolkit) for anchor, rel, _ in manifest["deps"] if anchor.startswith("t"))
    # A header found in include/ was first looked for in early/: its absence is part of the leaf.
    assert ["s0", "early/cute/arch/mma.hpp"] in manifest["negatives"]
    if compiler == "nvrtc":
        assert manifest["argv"][0] == "nvrtc"  # one compile with the search path, lookups recorded

    mma = cute_tree / "include" / "cute" / "arch" / "mma.hpp"
    original = mma.read_bytes()
    mma.write_bytes(original)  # the same bytes, a new mtime and ctime
    os.utime(mma, ns=(time.time_ns(), time.time_ns()))
    settle()
    assert build("disk").deps_key == first.deps_key

    assert original.count(FMA_CALL.encode()) == 1, "cute/arch/mma.hpp changed upstream: update FMA_CALL"
    mma.write_bytes(original.replace(FMA_CALL.encode(), FMA_EDITED.encode()))
    settle()
    edited = build("compiled")
    assert edited.build_key == first.build_key and edited.deps_key != first.deps_key
    assert edited.digest != first.digest  # an extra add per FMA: another binary

    shadow = cute_tree / "early" / "cute" / "arch" / "mma.hpp"
    shadow.parent.mkdir(parents=True)
    shadow.write_bytes(original)  # found before the edited one from now on
    settle()
    shadowed = build("compiled")
    assert shadowed.deps_key not in (first.deps_key, edited.deps_key)
    assert ["s0", "early/cute/arch/mma.hpp"] in [d[:2] for d in _manifest(shadowed)["deps"]]
    assert shadowed.digest != edited.digest


def test_nvrtc_worker_honours_the_compile_timeout(make_runtime):
    assert CUTLASS is not None
    inc = str(CUTLASS)
    rt = make_runtime(backend="cuda", source_roots=(inc,), compile_timeout_s=1.0)
    rt.build(safejit.Source('extern "C" __global__ void k() {}', "k"), arch="sm_90")  # the worker is up
    started = time.monotonic()
    with pytest.raises(safejit.CompileTimeout):
        rt.build(safejit.Source(KERNEL, "cute_sgemm"), include_dirs=(inc,), arch="sm_90")
    assert time.monotonic() - started < 5  # (the compile itself takes seconds longer)


def test_the_dir_above_cccl_is_searched_when_the_runtime_headers_live_elsewhere(tmp_path, monkeypatch):
    """CUDA 13 keeps CCCL in ``include/cccl``; CUTLASS 4 includes ``<cccl/cuda/std/...>``.
    With the runtime's headers found in a pip wheel (a GPU machine's torch install), the
    toolkit's ``include`` still has to be searched, between them and CCCL, or NVRTC
    cannot open ``cccl/cuda/std/type_traits``."""
    from safejit.backends.cuda import backend as cuda_backend

    wheel, toolkit = tmp_path / "site" / "nvidia" / "cu13" / "include", tmp_path / "cuda-13.0" / "include"
    (toolkit / "cccl").mkdir(parents=True)
    wheel.mkdir(parents=True)
    found = {"cudart": str(wheel), "cccl": str(toolkit / "cccl")}
    monkeypatch.setattr(cuda_backend, "find_nvidia_header_directory", found.get)
    assert cuda_backend.CudaBackend()._include_dir() == [str(wheel), str(toolkit), str(toolkit / "cccl")]
    found["cudart"] = str(toolkit)  # one toolkit: each dir once, in nvcc's profile's order
    assert cuda_backend.CudaBackend()._include_dir() == [str(toolkit), str(toolkit / "cccl")]
