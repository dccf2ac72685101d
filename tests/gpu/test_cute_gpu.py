"""The CuTe SGEMM (tests/data/cute_sgemm.cu, nvidia-cutlass headers) on a real GPU:
correct against a float64 product through NVRTC and nvcc; an edit of a deep CuTe
header changes what runs; 8 processes cold-starting it compile once."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

import safejit
from tests.conftest import assert_cache_sound, leaves, settle
from tests.gpu._together import run_together

KERNEL = (Path(__file__).parent.parent / "data" / "cute_sgemm.cu").read_text()
FMA_CALL = "    fma(d, a, b, c);\n"
FMA_PLUS_ONE = "    fma(d, a, b, c);\n    d = d + D(1);\n"  # every FMA adds one more: C gains alpha * K


def _cutlass_include() -> Path:
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        pytest.skip("no nvidia-cutlass headers")
    return Path(spec.origin).parent / "source" / "include"


@pytest.fixture
def cute_root(tmp_path: Path) -> Path:
    root = tmp_path / "cutlass"
    for part in ("cute", "cutlass"):
        shutil.copytree(_cutlass_include() / part, root / "include" / part)
    return root


def _sgemm(mod: safejit.Module, m: int, n: int, k: int, alpha: float, beta: float):
    """Run C = alpha * A B^T + beta * C (column-major) on random inputs; returns the
    result and the float64 reference (torch tensors)."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(1234)
    # Column-major M x K is row-major K x M: A[m, k] == at[k, m].
    at = torch.randn(k, m, device="cuda", generator=gen)
    bt = torch.randn(k, n, device="cuda", generator=gen)
    ct = torch.randn(n, m, device="cuda", generator=gen)
    ref = alpha * (bt.double().T @ at.double()) + beta * ct.double()
    mod.kernel("cute_sgemm_nt").launch((m // 128, n // 128), (256,), (m, n, k, alpha, at, m, bt, n, beta, ct, m))
    torch.cuda.synchronize()
    return ct, ref


@pytest.mark.parametrize("compiler", ["nvrtc", "nvcc"])
def test_cute_sgemm_matches_a_float64_product(make_runtime, cute_root, compiler):
    torch = pytest.importorskip("torch")
    rt = make_runtime(backend="cuda", cuda_compiler=compiler, source_roots=(str(cute_root),))
    mod = rt.compile(safejit.Source(KERNEL, "cute_sgemm"), include_dirs=(str(cute_root / "include"),))
    m, n, k = 512, 384, 256
    got, ref = _sgemm(mod, m, n, k, 1.5, -0.5)
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-3)
    # and against torch.matmul itself, in float32 without TF32
    torch.backends.cuda.matmul.allow_tf32 = False
    got2, _ = _sgemm(mod, m, n, k, 1.0, 0.0)
    gen = torch.Generator(device="cuda").manual_seed(1234)
    at = torch.randn(k, m, device="cuda", generator=gen)
    bt = torch.randn(k, n, device="cuda", generator=gen)
    torch.testing.assert_close(got2, torch.matmul(bt.T, at), rtol=1e-4, atol=1e-3)


def test_an_edit_of_a_deep_cute_header_changes_what_runs(make_runtime, cute_root, cache_dir):
    torch = pytest.importorskip("torch")
    inc = (str(cute_root / "include"),)
    src = safejit.Source(KERNEL, "cute_sgemm")
    m, n, k, alpha = 256, 256, 64, 2.0
    before, ref = _sgemm(make_runtime(backend="cuda", source_roots=(str(cute_root),)).compile(src, include_dirs=inc),
                         m, n, k, alpha, 0.0)  # fmt: skip
    torch.testing.assert_close(before.double(), ref, rtol=1e-4, atol=1e-3)
    mma = cute_root / "include" / "cute" / "arch" / "mma.hpp"
    text = mma.read_text()
    assert text.count(FMA_CALL) == 1
    mma.write_text(text.replace(FMA_CALL, FMA_PLUS_ONE))
    settle()
    rt = make_runtime(backend="cuda", source_roots=(str(cute_root),))  # a fresh process would do the same
    after, ref = _sgemm(rt.compile(src, include_dirs=inc), m, n, k, alpha, 0.0)
    assert rt.stats()["compiles"] == 1
    torch.testing.assert_close(after.double(), ref + alpha * k, rtol=1e-4, atol=1e-3)
    assert len(leaves(cache_dir)) == 2
    assert_cache_sound(cache_dir)


COLD_CHILD = r"""
import json, os, sys, time
import torch, safejit
go, root, cache, code = sys.argv[1:5]
while not os.path.exists(go):
    time.sleep(0.001)
rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(cache,), source_roots=(root,)))
k = rt.compile(safejit.Source(code, "cute_sgemm"), include_dirs=(root + "/include",)).kernel("cute_sgemm_nt")
a = torch.ones(8, 128, device="cuda"); b = torch.ones(8, 128, device="cuda"); c = torch.zeros(128, 128, device="cuda")
k.launch((1, 1), (256,), (128, 128, 8, 1.0, a, 128, b, 128, 0.0, c, 128)); torch.cuda.synchronize()
print(json.dumps({"ok": bool((c == 8.0).all()), "compiles": rt.stats()["compiles"]}))
"""


def test_eight_processes_cold_start_the_cute_sgemm_and_compile_once(cute_root, cache_dir, tmp_path):
    pytest.importorskip("torch")
    reports = run_together(COLD_CHILD, tmp_path / "go", str(cute_root), str(cache_dir), KERNEL)
    assert all(r["ok"] for r in reports)
    assert sum(r["compiles"] for r in reports) == 1
    assert len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)
