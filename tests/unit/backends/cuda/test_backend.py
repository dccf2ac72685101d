"""The CUDA backend without a GPU: NVRTC and nvcc to cubins, the header closure,
rebuilds, the environment, diagnostics, argument packing."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import safejit
from safejit.backends.cuda.args import encode_argument
from safejit.backends.cuda.backend import SpillWarning
from safejit.backends.cuda.cubin import cubin_kernels
from safejit.backends.cuda.launch import CudaKernel, has_cuda_device, stream_handle
from safejit.sandbox.landlock import abi as landlock_abi
from tests.conftest import assert_cache_sound, leaves, settle

pytest.importorskip("cuda.bindings.nvrtc")
HAVE_NVCC = shutil.which("nvcc", path="/usr/local/cuda/bin:/usr/bin") is not None

SAXPY = """#include "scale.h"
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] * SCALE + y[i];
}
template <typename T> __global__ void scale(T* x, T a, int n) { int i = threadIdx.x; if (i < n) x[i] *= a; }
"""


@pytest.fixture
def cuda_project(tmp_path: Path) -> Path:
    root = tmp_path / "cuproj"
    (root / "include").mkdir(parents=True)
    (root / "include" / "scale.h").write_text('#include "detail.h"\n#define SCALE (DETAIL * 1.0f)\n')
    (root / "include" / "detail.h").write_text("#define DETAIL 2\n")
    return root


def _rt(make_runtime, root: Path, compiler: str, **cfg) -> safejit.Runtime:
    return make_runtime(backend="cuda", cuda_compiler=compiler, source_roots=(str(root),), **cfg)


COMPILERS = ["nvrtc", pytest.param("nvcc", marks=pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc"))]


@pytest.mark.parametrize("compiler", COMPILERS)
def test_cubin_with_a_user_header_is_cached_and_rebuilt_exactly_when_the_header_changes(
    make_runtime, cuda_project, cache_dir, compiler
):
    inc = (str(cuda_project / "include"),)
    src = safejit.Source(SAXPY, "saxpy")
    art = _rt(make_runtime, cuda_project, compiler).build(src, include_dirs=inc, arch="sm_90")
    cubin = (Path(art.path) / "artifact.cubin").read_bytes()
    assert cubin[:4] == b"\x7fELF" and "saxpy" in art.kernels
    assert cubin_kernels(cubin)["saxpy"] == [(0, 4), (8, 8), (16, 8), (24, 4)]
    again = _rt(make_runtime, cuda_project, compiler)
    assert again.build(src, include_dirs=inc, arch="sm_90").source == "disk" and again.stats()["compiles"] == 0
    (cuda_project / "include" / "detail.h").write_text("#define DETAIL 3\n")  # transitive header
    settle()
    changed = _rt(make_runtime, cuda_project, compiler)
    rebuilt = changed.build(src, include_dirs=inc, arch="sm_90")
    assert rebuilt.source == "compiled" and rebuilt.build_key == art.build_key and rebuilt.deps_key != art.deps_key
    explanation = changed.explain(src, include_dirs=inc, arch="sm_90")
    assert explanation.result == "hit"
    assert len(leaves(cache_dir)) == 2
    assert_cache_sound(cache_dir)


def test_nvrtc_closure_names_every_handed_over_header(make_runtime, cuda_project):
    rt = _rt(make_runtime, cuda_project, "nvrtc")
    art = rt.build(safejit.Source(SAXPY, "saxpy"), include_dirs=(str(cuda_project / "include"),), arch="sm_90")
    import json

    deps = json.loads((Path(art.path) / "manifest.json").read_text())["deps"]
    assert sorted(rel for _, rel, _ in deps) == ["include/detail.h", "include/scale.h"]


@pytest.mark.parametrize("worker", [True, False])
def test_the_compiler_run_span_says_what_nvrtc_ran_within(make_runtime, cuda_project, spans, worker):
    """``safejit.sandbox`` on an NVRTC compile names what NVRTC ran within: its worker
    (confined by Landlock where the kernel offers it, as the worker's hello says), or this
    very process; never the exec sandbox's walls, which NVRTC's compile is not in."""
    rt = _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=worker)
    rt.build(safejit.Source(SAXPY, "saxpy"), include_dirs=(str(cuda_project / "include"),), arch="sm_90")
    runs = [s for s in spans.get_finished_spans() if s.name == "safejit.compiler.run"]
    abi = landlock_abi()
    expected = ("nvrtc-worker+" + (f"landlock-v{abi}+" if abi else "") + "rlimits") if worker else "in-process"
    assert runs and all(run.attributes["safejit.sandbox"] == expected for run in runs)  # (a header just made: twice)


def test_nvrtc_template_kernels_through_name_expressions(make_runtime, cuda_project):
    rt = _rt(make_runtime, cuda_project, "nvrtc")
    mod = rt.compile(
        safejit.Source(SAXPY, "saxpy"),
        include_dirs=(str(cuda_project / "include"),),
        arch="sm_90",
        name_expressions=("scale<float>", "scale<int>"),
    )
    import json

    meta = json.loads((Path(mod.artifact.path) / "manifest.json").read_text())["meta"]
    assert meta["symbols"] == {"scale<float>": "_Z5scaleIfEvPT_S0_i", "scale<int>": "_Z5scaleIiEvPT_S0_i"}
    assert set(mod.kernels) == {"saxpy", "_Z5scaleIfEvPT_S0_i", "_Z5scaleIiEvPT_S0_i"}
    assert meta["params"]["_Z5scaleIfEvPT_S0_i"] == [[0, 8], [8, 4], [12, 4]]


@pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc")
@pytest.mark.parametrize("variable", ["NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "CPATH", "NVCC_CCBIN"])
def test_nvcc_environment_flags_in_the_callers_environment_change_nothing(
    make_runtime, cuda_project, monkeypatch, variable
):
    inc = (str(cuda_project / "include"),)
    src = safejit.Source(SAXPY, "saxpy")
    clean = _rt(make_runtime, cuda_project, "nvcc").build(src, include_dirs=inc, arch="sm_90")
    monkeypatch.setenv(variable, "-DSCALE=99 --dryrun" if "FLAGS" in variable else "/nonexistent")
    dirty_rt = _rt(make_runtime, cuda_project, "nvcc", cache_dirs=(str(cuda_project.parent / "other-cache"),))
    dirty = dirty_rt.build(src, include_dirs=inc, arch="sm_90")
    assert dirty.source == "compiled"
    assert (dirty.build_key, dirty.digest) == (clean.build_key, clean.digest)


@pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc")
def test_name_expressions_with_nvcc_are_a_config_error_and_nothing_is_cached(make_runtime, cuda_project, cache_dir):
    rt = _rt(make_runtime, cuda_project, "nvcc")
    with pytest.raises(safejit.ConfigError, match="name_expressions are NVRTC's"):
        rt.build(safejit.Source(SAXPY, "saxpy"), arch="sm_90", name_expressions=("scale<float>",))
    assert leaves(cache_dir) == []


def test_missing_gpu_without_arch_is_a_clear_config_error(make_runtime, cuda_project):
    if has_cuda_device():
        pytest.skip("a GPU is present")
    rt = _rt(make_runtime, cuda_project, "nvrtc")
    with pytest.raises(safejit.ConfigError, match="pass arch="):
        rt.compile(safejit.Source('extern "C" __global__ void k() {}', "k"))


def test_loading_without_a_driver_fails_fast_and_typed(make_runtime, cuda_project):
    if has_cuda_device():
        pytest.skip("a GPU is present")
    rt = _rt(make_runtime, cuda_project, "nvrtc")
    mod = rt.compile(safejit.Source('extern "C" __global__ void k() {}', "k"), arch="sm_90")
    for _ in range(2):  # the second attempt must not hang either
        with pytest.raises(safejit.LoadError, match="CUDA driver"):
            mod.kernel("k")


@pytest.mark.parametrize("arch", ["90", "sm90", "compute_90", "sm_9"])
def test_bad_arch_is_refused(make_runtime, cuda_project, arch):
    with pytest.raises(safejit.ConfigError, match="arch"):
        _rt(make_runtime, cuda_project, "nvrtc").build(
            safejit.Source('extern "C" __global__ void k() {}', "k"), arch=arch
        )


LOCAL_MEMORY = """extern "C" __global__ void lmem(float* o, int i) {
  float a[256];
  for (int j = 0; j < 256; ++j) a[j] = o[j] * j;
  o[0] = a[i];
}"""


def test_local_memory_is_a_warning_or_an_error(make_runtime, cuda_project, cache_dir):
    src = safejit.Source(LOCAL_MEMORY, "lmem")
    with pytest.warns(SpillWarning, match="stack frame"):
        _rt(make_runtime, cuda_project, "nvrtc").build(src, arch="sm_90")
    strict = _rt(
        make_runtime, cuda_project, "nvrtc", cuda_spills="error", cache_dirs=(str(cache_dir.parent / "strict"),)
    )
    with pytest.raises(safejit.CompileError, match=r"spill|stack frame"):
        strict.build(src, arch="sm_90")
    assert leaves(cache_dir.parent / "strict") == []


@pytest.mark.parametrize(
    "flags", [("--ptxas-options=-v", "--ptxas-options=-O3"), ("-lineinfo", "--use_fast_math"), ("-maxrregcount=32",)]
)
def test_cuda_flags_allowed(make_runtime, cuda_project, flags):
    _rt(make_runtime, cuda_project, "nvrtc").build(
        safejit.Source('extern "C" __global__ void k() {}', "k"), arch="sm_90", flags=flags
    )


@pytest.mark.parametrize(
    "flags",
    [
        ("-Xcompiler=-fplugin=x.so",),
        ("--ptxas-options=--output-file=/tmp/x",),
        ("-ccbin", "/usr/bin/gcc"),
        ("--compiler-bindir=/tmp",),
        ("-o", "/tmp/x"),
    ],
)
def test_cuda_flags_refused(make_runtime, cuda_project, cache_dir, flags):
    with pytest.raises((safejit.FlagPolicyError, safejit.ConfigError)):
        _rt(make_runtime, cuda_project, "nvrtc").build(
            safejit.Source('extern "C" __global__ void k() {}', "k"), arch="sm_90", flags=flags
        )
    assert leaves(cache_dir) == []


COMPUTED = '#define HEADER "scale.h"\n#include HEADER\nextern "C" __global__ void k(float* y) { y[0] = SCALE; }\n'


def test_computed_include_needs_the_isolated_worker(make_runtime, cuda_project, cache_dir):
    inc = (str(cuda_project / "include"),)
    with pytest.raises(safejit.PathConfinementError, match="nvrtc_worker"):
        _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=False).build(
            safejit.Source(COMPUTED, "k"), include_dirs=inc, arch="sm_90"
        )
    assert leaves(cache_dir) == []
    art = _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=True).build(
        safejit.Source(COMPUTED, "k"), include_dirs=inc, arch="sm_90"
    )
    assert art.kernels == ("k",)


@pytest.mark.parametrize("confined", [True, False])
def test_a_computed_include_in_memory_needs_a_worker_landlock_confines(
    make_runtime, cuda_project, cache_dir, monkeypatch, confined
):
    """With NVRTC's lookups not recorded (no C compiler here), headers are handed over in
    memory, and a computed #include is NVRTC reading the filesystem itself: safe in a
    worker that can read nothing, which only Landlock makes it. The worker was taken for
    one whether Landlock confined it or not: an outside file was read, compiled in, and
    echoed in the log."""
    from safejit.backends.cuda import backend as cuda_backend
    from safejit.backends.cuda import nvrtc

    monkeypatch.setattr(cuda_backend.lookup_recorder, "build", lambda *a, **k: None)  # (headers in memory)
    if not confined:
        monkeypatch.setattr(nvrtc, "landlock_abi", lambda: 0)  # (a kernel without Landlock)
    rt = _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=True)
    inc = (str(cuda_project / "include"),)
    if confined:
        assert rt.build(safejit.Source(COMPUTED, "k"), include_dirs=inc, arch="sm_90").kernels == ("k",)
        return
    with pytest.raises(safejit.PathConfinementError, match="computed"):
        rt.build(safejit.Source(COMPUTED, "k"), include_dirs=inc, arch="sm_90")
    assert leaves(cache_dir) == []


@pytest.mark.parametrize(
    "directive",
    ['#/**/include "{p}"', '#inc\\\nlude "{p}"', '%:include "{p}"', '#if __has_include("{p}")\n#endif',
     '#define P "{p}"\n#if __has_include(P)\n#endif', "int a = 1'0 + '/*';\n#include \"{p}\"\n// */",
     'const char* r = R"("/*)";\n%:include "{p}"\n// */',
     'const char* r = u8R"x(/*)x";\n#if __has_include("{p}")\n#endif'],
    ids=["comment", "splice", "digraph", "has-include", "has-include-macro", "digit-separator", "raw-string",
         "raw-string-probe"],
)  # fmt: skip
@pytest.mark.parametrize("there", [True, False])
def test_in_process_nvrtc_reads_directives_as_the_preprocessor_does(
    make_runtime, cuda_project, tmp_path, cache_dir, directive, there
):
    """In process NVRTC reads the filesystem itself: an include of an outside file hidden
    from a line pattern (a comment, a splice, the digraph) was compiled in, and echoed in
    the error log; a probe told whether a file exists. Each is refused, one way whether
    the file is there or not."""
    outside = tmp_path / "outside" / "secret.h"
    outside.parent.mkdir()
    if there:
        outside.write_text("#define SECRET 0x5ec2e7\n")
    code = directive.replace("{p}", str(outside)) + '\nextern "C" __global__ void k() {}\n'
    with pytest.raises(safejit.PathConfinementError) as info:
        _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=False).build(safejit.Source(code, "k"), arch="sm_90")
    assert "5ec2e7" not in str(info.value) and "exist" not in str(info.value)
    assert leaves(cache_dir) == []


def test_a_name_expression_cannot_start_a_directive(make_runtime, cuda_project, cache_dir):
    """NVRTC pastes each name expression into a program: a line break in one made an
    ``#include`` of any file (echoed in the log, in process)."""
    src = safejit.Source("template <int N> __global__ void s() {}\n", "s")
    with pytest.raises(safejit.ConfigError, match="one line"):
        _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=False).build(
            src, arch="sm_90", name_expressions=('s<1>\n#include "/etc/hostname"\n',)
        )
    assert leaves(cache_dir) == []


@pytest.mark.parametrize("worker", [False, True])
@pytest.mark.parametrize("include", ['"/etc/hostname"', '"../../../../../../etc/hostname"'])
def test_nvrtc_include_outside_the_roots_is_refused(make_runtime, cuda_project, cache_dir, worker, include):
    src = safejit.Source(f'#include {include}\nextern "C" __global__ void k() {{}}\n', "k")
    with pytest.raises(safejit.PathConfinementError):
        _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=worker).build(
            src, include_dirs=(str(cuda_project / "include"),), arch="sm_90"
        )
    assert leaves(cache_dir) == []


# -- argument packing (no GPU needed) ------------------------------------------
def _kernel(params, argtypes=None) -> CudaKernel:
    return CudaKernel("k", None, params, argtypes)


def _packed(kernel: CudaKernel, args) -> list[bytes]:
    address = kernel.pack(args)
    ptrs = (ctypes.c_void_p * kernel.num_params).from_address(address)
    return [ctypes.string_at(p, size) for p, (_, size) in zip(ptrs, kernel._params, strict=True)]


def test_python_numbers_take_exactly_the_parameter_width():
    k = _kernel([(0, 4), (8, 8), (16, 4), (20, 8), (28, 2), (30, 1)])
    got = _packed(k, [1.5, 1.5, -7, -7, 3, 1])
    import struct

    assert got == [
        struct.pack("<f", 1.5),
        struct.pack("<d", 1.5),
        struct.pack("<i", -7),
        struct.pack("<q", -7),
        struct.pack("<h", 3),
        b"\x01",
    ]


class _Tensor:
    def data_ptr(self) -> int:
        return 0xDEADBEEF00


class _CupyLike:
    __cuda_array_interface__ = {"data": (0x1234500, False), "shape": (4,), "typestr": "<f4", "version": 3}


def test_pointers_numpy_and_ctypes_arguments():
    np = pytest.importorskip("numpy")
    k = _kernel([(0, 8), (8, 8), (16, 4), (20, 4), (24, 8)])
    got = _packed(k, [_Tensor(), _CupyLike(), np.float32(2.5), ctypes.c_int(9), np.uint64(7)])
    import struct

    assert got == [
        struct.pack("<Q", 0xDEADBEEF00),
        struct.pack("<Q", 0x1234500),
        struct.pack("<f", 2.5),
        struct.pack("<i", 9),
        struct.pack("<Q", 7),
    ]


@pytest.mark.parametrize(
    ("params", "args"),
    [
        ([(0, 4)], [2**40]),  # an int too wide for 4 bytes
        ([(0, 4)], [_Tensor()]),  # a pointer into a 4-byte slot
        ([(0, 8)], [ctypes.c_float(1.0)]),  # ctypes width mismatch
        ([(0, 4), (4, 4)], [1]),  # wrong count
        ([(0, 16)], [1.0]),  # no 16-byte float
        ([(0, 4)], ["1"]),  # not a number
    ],
)
def test_width_mismatches_are_errors_never_silent(params, args):
    with pytest.raises(safejit.ConfigError):
        _kernel(params).pack(args)


def test_declared_argtypes_win():
    k = _kernel([(0, 4), (4, 4)], argtypes=[ctypes.c_uint32, ctypes.c_float])
    import struct

    assert _packed(k, [3, 2]) == [struct.pack("<I", 3), struct.pack("<f", 2.0)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(min_value=-(2**64), max_value=2**64),
            st.floats(width=32),
            st.booleans(),
            st.sampled_from([_Tensor(), _CupyLike(), ctypes.c_int(5), ctypes.c_double(0.5)]),
        ),
        min_size=3,
        max_size=3,
    ),
    st.lists(st.sampled_from([1, 2, 4, 8]), min_size=3, max_size=3),
)
def test_planned_packing_says_what_the_general_encoder_says(args, sizes):
    """Calls after the first take a per-type-tuple plan; bytes and errors must not change."""
    params, offset = [], 0
    for size in sizes:
        offset = (offset + size - 1) // size * size
        params.append((offset, size))
        offset += size
    k = _kernel(params)
    try:
        expected = [encode_argument(a, size, None, "k", i) for i, (a, size) in enumerate(zip(args, sizes, strict=True))]
    except (safejit.ConfigError, OverflowError) as exc:
        for _ in range(2):  # the plan is made by the first call and used by the second
            with pytest.raises(type(exc)):
                _packed(k, args)
        return
    assert _packed(k, args) == expected
    assert _packed(k, args) == expected


def test_packed_buffers_are_reused():
    k = _kernel([(0, 8)])
    assert k.pack([1]) == k.pack([2])


class _Proto:
    def __cuda_stream__(self):
        return (0, 4242)


class _Attr:
    cuda_stream = 77


def test_stream_handles():
    assert stream_handle(None) == 0
    assert stream_handle(123) == 123
    assert stream_handle(_Proto()) == 4242
    assert stream_handle(_Attr()) == 77
    with pytest.raises(safejit.ConfigError):
        stream_handle("default")


class _ProtoAndPtr:
    def __init__(self, handle: int, ptr: int) -> None:
        self.handle_value, self.ptr = handle, ptr

    def __cuda_stream__(self):
        return (0, self.handle_value)


def test_stream_types_remember_how_to_read_their_handle():
    """After the first of a type, a stream is read the way that type showed; the protocol
    stays the authority for types not known to keep the same handle in an attribute."""
    assert stream_handle(_ProtoAndPtr(5, 5)) == 5
    assert stream_handle(_ProtoAndPtr(6, 7)) == 6  # its ptr is something else: never read instead
    assert stream_handle(_Proto()) == 4242 and stream_handle(_Proto()) == 4242
    assert stream_handle(_Attr()) == 77 and stream_handle(_Attr()) == 77


def _minor_faults(pid: int) -> int:
    # /proc/<pid>/stat: the comm field may hold spaces; minflt is the 8th field after it.
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[7])


def test_the_nvrtc_worker_keeps_its_heap_between_compiles():
    """NVRTC allocates and frees megabytes per compile; the worker must not hand them back
    to the kernel only to fault them in again, zeroed, on the next compile."""
    from safejit.backends.cuda.nvrtc import NvrtcRequest, NvrtcWorker

    worker = NvrtcWorker("sm_90", require_landlock=False)
    code = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= %d.0f; }\n'
    try:
        for i in range(3):  # start, then settle into a steady heap
            assert worker.compile_once(NvrtcRequest((code % i).encode(), "k", ["--gpu-architecture=sm_90"], [])).ok
        assert worker._proc is not None
        before = _minor_faults(worker._proc.pid)
        for i in range(3, 6):
            assert worker.compile_once(NvrtcRequest((code % i).encode(), "k", ["--gpu-architecture=sm_90"], [])).ok
        faults = _minor_faults(worker._proc.pid) - before
    finally:
        worker.close()
    assert faults < 3 * 200, f"{faults} page faults in three compiles"


def test_the_nvrtc_worker_leaves_no_working_directory_behind():
    """The worker works in an empty directory of its own, removed as soon as it is in it:
    killed (a compile past its timeout) or ended, it leaves nothing in the temporary dir."""
    import glob
    import tempfile

    from safejit.backends.cuda.nvrtc import NvrtcRequest, NvrtcWorker

    pattern = os.path.join(tempfile.gettempdir(), "safejit-nvrtc-*")
    before = set(glob.glob(pattern))
    worker = NvrtcWorker("sm_90", require_landlock=False)
    try:
        assert worker.compile_once(NvrtcRequest(b'extern "C" __global__ void k() {}\n', "k", [], [])).ok
        assert worker._proc is not None
        assert os.readlink(f"/proc/{worker._proc.pid}/cwd").endswith(" (deleted)")
        assert set(glob.glob(pattern)) == before
    finally:
        worker.close()  # (SIGKILL to its process group)
    assert set(glob.glob(pattern)) == before


@pytest.mark.skipif(landlock_abi() == 0, reason="this kernel offers no Landlock")
def test_the_nvrtc_worker_restricts_itself_whole_when_landlock_is_required(tmp_path):
    """The worker loads NVRTC and compiles once before Landlock restricts it; Landlock binds
    one thread, so a required restriction is refused if NVRTC has started any other by then.
    NVRTC starts none: the worker comes up confined, and reads nothing outside its roots.
    Where the CUDA driver is installed, NVRTC's first compile loaded it, and the driver
    started a thread (the worker died while starting): the worker is confined before that
    compile now, and the driver, outside what it may read, is never loaded there."""
    from safejit.backends.cuda.nvrtc import NvrtcRequest, NvrtcWorker, nvrtc_compile_once

    outside = tmp_path / "outside.h"
    outside.write_text("#define OUTSIDE 1\n")
    worker = NvrtcWorker("sm_90", require_landlock=True)
    code = f'#include "{outside}"\nextern "C" __global__ void k(int* x) {{ *x = OUTSIDE; }}\n'
    try:
        plain = NvrtcRequest(b'extern "C" __global__ void k() {}\n', "k", ["--gpu-architecture=sm_90"], [])
        assert worker.compile_once(plain).ok
        assert worker.landlock == landlock_abi() and worker.walls == f"nvrtc-worker+landlock-v{landlock_abi()}+rlimits"
        reads = NvrtcRequest(code.encode(), "k", ["--gpu-architecture=sm_90"], [])
        assert nvrtc_compile_once(reads).ok  # (the control: unconfined, this process reads it)
        denied = worker.compile_once(reads)
        assert not denied.ok and "open source file" in denied.log, denied.log
    finally:
        worker.close()


@pytest.mark.parametrize("worker", [True, False])
def test_nvrtc_header_swapped_for_a_fifo_is_an_error_not_a_hang(make_runtime, cuda_project, cache_dir, worker):
    """Headers are read in this process to be handed to NVRTC: a FIFO must not block it
    (the resolver passes over it; reading it, were it swapped in later, fails at once)."""
    detail = cuda_project / "include" / "detail.h"
    detail.unlink()
    os.mkfifo(detail)
    rt = _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=worker)
    with pytest.raises(safejit.CompileError) as info:
        rt.compile(safejit.Source(SAXPY, "saxpy"), include_dirs=(str(cuda_project / "include"),), arch="sm_90")
    assert "detail.h" in str(info.value)
    assert leaves(cache_dir) == []


def _toolkit(tmp_path: Path) -> tuple[Path, Path]:
    """A toolkit prefix whose nvcc (a copy) runs this prefix's profile, cicc and ptxas
    (scripts that run the real ones) and reads the real one's headers; and that real prefix."""
    real = Path(os.path.realpath(shutil.which("nvcc", path="/usr/local/cuda/bin:/usr/bin") or "")).parent.parent
    fake = tmp_path / "cuda"
    for d in ("bin", "nvvm/bin", "nvvm/libdevice"):
        (fake / d).mkdir(parents=True)
    shutil.copy2(real / "bin" / "nvcc", fake / "bin" / "nvcc")
    shutil.copy2(real / "bin" / "nvcc.profile", fake / "bin" / "nvcc.profile")
    for part in ("bin/ptxas", "nvvm/bin/cicc"):
        (fake / part).write_text(f'#!/bin/sh\nexec {real / part} "$@"\n')
        (fake / part).chmod(0o755)
    for bc in (real / "nvvm" / "libdevice").glob("*.bc"):
        shutil.copy2(bc, fake / "nvvm" / "libdevice" / bc.name)
    (fake / "targets").symlink_to(real / "targets")
    return fake, real


@pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc")
@pytest.mark.parametrize("part", ["bin/ptxas", "nvvm/bin/cicc", "bin/nvcc.profile", "nvvm/libdevice"])
def test_an_upgraded_part_of_nvcc_is_a_miss_not_a_stale_hit(make_runtime, cuda_project, tmp_path, part):
    # nvcc itself unchanged: what it runs (cicc, ptxas), reads (its profile, libdevice)
    # changes the cubin all the same.
    fake, real = _toolkit(tmp_path)
    config = {
        "backend": "cuda",
        "cuda_compiler": "nvcc",
        "nvcc": str(fake / "bin" / "nvcc"),
        "source_roots": (str(cuda_project), str(real)),
    }
    inc = (str(cuda_project / "include"),)
    src = safejit.Source(SAXPY, "saxpy")
    before = make_runtime(**config).build(src, include_dirs=inc, arch="sm_90")
    changed = fake / part
    if part == "nvvm/libdevice":
        shutil.copy2(changed / "libdevice.10.bc", changed / "libdevice.11.bc")  # a newer one beside it
    else:
        changed.write_text(changed.read_text() + ("\nPTXAS_FLAGS +=\n" if part.endswith("profile") else "# newer\n"))
    rt = make_runtime(**config)  # a new backend: the probe remembered on disk is looked at again
    after = rt.build(src, include_dirs=inc, arch="sm_90")
    assert rt.stats()["compiles"] == 1 and rt.stats()["disk_hits"] == 0
    assert after.build_key != before.build_key
    again = make_runtime(**config)  # unchanged since: the remembered probe and the leaf stand
    assert again.build(src, include_dirs=inc, arch="sm_90").build_key == after.build_key
    assert again.stats()["disk_hits"] == 1 and again.stats()["compiles"] == 0


def test_nvrtcs_builtin_headers_library_is_part_of_its_toolchain(make_runtime, cuda_project):
    # NVRTC's built-in headers are a library of their own beside it (loaded at run time):
    # a newer one under an unchanged libnvrtc changes what a source compiles to.
    from cuda.pathfinder import load_nvidia_dynamic_lib

    from safejit.closure.hashing import hash_file

    lib = os.path.realpath(load_nvidia_dynamic_lib("nvrtc").abs_path)
    builtins = sorted(p for p in Path(lib).parent.glob("libnvrtc-builtins.so*"))
    assert builtins, "no libnvrtc-builtins beside libnvrtc"
    art = _rt(make_runtime, cuda_project, "nvrtc").build(
        safejit.Source(SAXPY, "saxpy"), include_dirs=(str(cuda_project / "include"),), arch="sm_90"
    )
    manifest = json.loads((Path(art.path) / "manifest.json").read_text())
    assert manifest["toolchain"]["digest"].split(":") == [hash_file(p)[0] for p in (lib, *map(str, builtins))]


HIT_WITHOUT_NVRTC = r"""
import json, sys
import safejit, safejit.backends.cuda.backend
cache, root = sys.argv[1:3]
maps = lambda: "libnvrtc.so" in open("/proc/self/maps").read()
loaded_at_import = maps()
rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(cache,), source_roots=(root,)))
rt.build(safejit.Source(sys.argv[3], "saxpy"), include_dirs=(root + "/include",), arch="sm_90")
from cuda.pathfinder import load_nvidia_dynamic_lib
from safejit.backends.cuda.nvrtc import library_path
import os
found, loaded_by_hit = library_path(), maps()
print(json.dumps({"hits": rt.stats()["disk_hits"], "at_import": loaded_at_import, "by_hit": loaded_by_hit,
                  "same": found == os.path.realpath(load_nvidia_dynamic_lib("nvrtc").abs_path)}))
"""


def test_a_fresh_processs_hit_does_not_load_nvrtc(make_runtime, cuda_project, cache_dir):
    # NVRTC's library is found where cuda.pathfinder would load it from, without loading
    # it (~12 ms): a process that only hits the cache never maps it.
    import subprocess
    import sys

    _rt(make_runtime, cuda_project, "nvrtc").build(
        safejit.Source(SAXPY, "saxpy"), include_dirs=(str(cuda_project / "include"),), arch="sm_90"
    )
    out = subprocess.run(
        [sys.executable, "-c", HIT_WITHOUT_NVRTC, str(cache_dir), str(cuda_project), SAXPY],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout)
    assert report == {"hits": 1, "at_import": False, "by_hit": False, "same": True}, out.stderr[-2000:]


def test_nvrtcs_library_is_the_one_pathfinder_loads_whichever_way_it_is_found(monkeypatch):
    # Found without loading where pathfinder's finder is known; else (another layout, or
    # none) loaded through the public API: the same file either way.
    from cuda.pathfinder import load_nvidia_dynamic_lib

    from safejit.backends.cuda import nvrtc

    want = os.path.realpath(load_nvidia_dynamic_lib("nvrtc").abs_path)
    assert nvrtc.library_path() == want
    monkeypatch.setattr(nvrtc, "_finder", None)
    assert nvrtc.library_path() == want
    broken = (None, None, None, None, None)  # (a finder whose parts fail: the public load)
    monkeypatch.setattr(nvrtc, "_finder", broken)
    assert nvrtc.library_path() == want


# -- NVRTC's search path: recorded in the worker, headers in memory in process -------------
NVRTC_MODES = [pytest.param(True, id="worker-recorded"), pytest.param(False, id="in-process-in-memory")]
ANGLED = '#include <scale.h>\nextern "C" __global__ void k(float* y) { y[0] = SCALE; }\n'


@pytest.mark.parametrize("worker", NVRTC_MODES)
def test_nvrtc_angled_include_of_a_header_under_include_dirs_compiles(make_runtime, cuda_project, worker):
    rt = _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=worker)
    art = rt.build(safejit.Source(ANGLED, "k"), include_dirs=(str(cuda_project / "include"),), arch="sm_90")
    deps = json.loads((Path(art.path) / "manifest.json").read_text())["deps"]
    assert {rel for _, rel, _ in deps} >= {"include/scale.h", "include/detail.h"}


@pytest.mark.parametrize("worker", NVRTC_MODES)
def test_nvrtc_missing_header_names_it_and_the_dirs_searched(make_runtime, cuda_project, cache_dir, worker):
    src = safejit.Source('#include <nowhere/none.h>\nextern "C" __global__ void k() {}\n', "k")
    inc = cuda_project / "include"
    with pytest.raises(safejit.CompileError) as exc:
        _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=worker).build(src, include_dirs=(str(inc),), arch="sm_90")
    assert "nowhere/none.h" in str(exc.value) and f"\n  {inc}\n" in str(exc.value)
    assert leaves(cache_dir) == []


@pytest.mark.parametrize("worker", NVRTC_MODES)
def test_nvrtc_diagnostics_name_the_source_as_the_user_knows_it(make_runtime, cuda_project, worker):
    """NVRTC is given the source under a directory that does not exist: its errors named
    that (``/nonexistent-safejit-nvrtc/k.cu(2): error``), where gcc and nvcc name the file."""
    (cuda_project / "bad.cu").write_text('extern "C" __global__ void k() {\n  int x = 1\n}\n')
    rt = _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=worker)
    for src, shown in (
        (rt.source(cuda_project / "bad.cu"), str(cuda_project / "bad.cu")),
        (safejit.Source((cuda_project / "bad.cu").read_text(), "k"), "k.cu"),
    ):
        with pytest.raises(safejit.CompileError) as exc:
            rt.build(src, arch="sm_90")
        for text in (str(exc.value), exc.value.log):
            assert "nonexistent" not in text and f"{shown}(3): error" in text, text


@pytest.mark.parametrize("worker", NVRTC_MODES)
def test_nvrtc_closure_over_max_deps_is_a_limit_error(make_runtime, cuda_project, cache_dir, worker):
    rt = _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=worker, max_deps=1)
    with pytest.raises(safejit.LimitExceededError):
        rt.build(safejit.Source(ANGLED, "k"), include_dirs=(str(cuda_project / "include"),), arch="sm_90")
    assert leaves(cache_dir) == []


@pytest.mark.parametrize("worker", NVRTC_MODES)
def test_nvrtc_header_made_in_an_earlier_include_dir_rebuilds(make_runtime, cuda_project, worker):
    early = cuda_project / "early"
    early.mkdir()
    dirs = (str(early), str(cuda_project / "include"))
    src = safejit.Source('#include <detail.h>\nextern "C" __global__ void k(int* y) { y[0] = DETAIL; }\n', "k")
    first = _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=worker).build(src, include_dirs=dirs, arch="sm_90")
    (early / "detail.h").write_text("#define DETAIL 5\n")  # found before include/detail.h from now on
    settle()
    rt = _rt(make_runtime, cuda_project, "nvrtc", nvrtc_worker=worker)
    again = rt.build(src, include_dirs=dirs, arch="sm_90")
    assert again.source == "compiled" and again.digest != first.digest
    deps = json.loads((Path(again.path) / "manifest.json").read_text())["deps"]
    assert ["s0", "early/detail.h"] in [d[:2] for d in deps]


def test_nvrtc_recorded_header_made_where_nvrtc_never_looked_rebuilds_nothing(make_runtime, cuda_project):
    # scale.h includes "detail.h", found next to it before any include dir is searched:
    # a detail.h in an earlier include dir changes nothing, and NVRTC never looked there.
    early = cuda_project / "early"
    early.mkdir()
    dirs = (str(early), str(cuda_project / "include"))
    first = _rt(make_runtime, cuda_project, "nvrtc").build(safejit.Source(ANGLED, "k"), include_dirs=dirs, arch="sm_90")
    (early / "detail.h").write_text("#define DETAIL 5\n")
    settle()
    rt = _rt(make_runtime, cuda_project, "nvrtc")
    assert rt.build(safejit.Source(ANGLED, "k"), include_dirs=dirs, arch="sm_90").deps_key == first.deps_key
    assert rt.stats()["compiles"] == 0


def test_nvrtc_without_a_lookup_recorder_hands_headers_over_in_memory(make_runtime, cuda_project, monkeypatch):
    from safejit.backends.cuda.backend import NVRTC_IN_MEMORY
    from safejit.sandbox import lookups

    inc = (str(cuda_project / "include"),)
    recorded = _rt(make_runtime, cuda_project, "nvrtc").build(
        safejit.Source(ANGLED, "k"), include_dirs=inc, arch="sm_90"
    )
    monkeypatch.setattr(lookups, "build", lambda state, cc: None)  # (no C compiler, no seccomp)
    rt = _rt(make_runtime, cuda_project, "nvrtc")
    in_memory = rt.build(safejit.Source(ANGLED, "k"), include_dirs=inc, arch="sm_90")
    assert json.loads((Path(in_memory.path) / "manifest.json").read_text())["argv"][0] == NVRTC_IN_MEMORY
    assert in_memory.build_key != recorded.build_key  # how NVRTC found its headers is part of the key


def test_a_header_swapped_for_a_link_after_it_was_confined_is_not_read(tmp_path, monkeypatch):
    """In process, the header confined is the header read: a directory on its way swapped
    for a symlink out of the roots in between (a race a tenant can run) reads nothing."""
    from safejit.backends.cuda import nvrtc

    (tmp_path / "outside.h").write_text("#define SECRET 1\n")
    inc = tmp_path / "root" / "inc"
    inc.mkdir(parents=True)
    (inc / "k.h").symlink_to(tmp_path / "outside.h")  # (what the race leaves at the moment of the read)
    monkeypatch.setattr(nvrtc, "_resolve", lambda *a: str(inc / "k.h"))  # (as confined, before the swap)
    given = nvrtc._HandedOver("k", [str(inc)], lambda p: p, isolated=False, max_headers=10)
    with pytest.raises(safejit.PathConfinementError, match="changed while it was read"):
        given.hand_over(None, '"', "k.h")
    assert given.headers == {}


def test_an_nvrtc_library_replaced_under_a_running_process_is_probed_again(tmp_path, monkeypatch):
    """NVRTC was probed once per process, and a build's toolchain never looked at again:
    the worker loads the library anew (at each start), so after a wheel upgrade its builds
    went under the old probe's key. It is looked at again as nvcc is, and a build whose
    library changed since its probe is not published."""
    import os
    import shutil
    import time
    import types

    from safejit.backends import _toolchain
    from safejit.backends.cuda import backend as cuda_backend
    from safejit.backends.cuda.nvrtc import library_path

    monkeypatch.setattr(_toolchain, "RECHECK_S", 0.0)
    be = cuda_backend.CudaBackend(compiler="nvrtc", state_dir=str(tmp_path), worker=True)
    source = safejit.Source('extern "C" __global__ void k() {}', "k")
    tc = be.toolchain(source, None)
    since = time.monotonic()
    new = tmp_path / "lib" / "libnvrtc.so.13"
    new.parent.mkdir()
    shutil.copy(library_path(), new)
    with open(new, "ab") as fh:
        fh.write(b"v2")  # (another build of the library)
    for builtins in os.listdir(os.path.dirname(library_path())):
        if builtins.startswith("libnvrtc-builtins"):
            shutil.copy(os.path.join(os.path.dirname(library_path()), builtins), new.parent / builtins)
    monkeypatch.setattr(cuda_backend, "library_path", lambda: str(new))
    assert not be.toolchain_unchanged(types.SimpleNamespace(toolchain=tc, language="cuda"), since)
    assert be.toolchain(source, None) != tc


@pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc")
@pytest.mark.parametrize("flag", ["-isystem", "-include"])
def test_nvcc_takes_path_flags_other_than_dash_i(make_runtime, cuda_project, flag):
    """nvcc takes -isystem and -include only with the path as the next argument: the
    policy's joined form ("-isystem/x") was "nvcc fatal: Unknown option"."""
    inc = cuda_project / "include"
    value = str(inc / "scale.h") if flag == "-include" else str(inc)
    code = ("" if flag == "-include" else "#include <scale.h>\n") + (
        'extern "C" __global__ void k(float* p) { *p = SCALE; }\n'
    )
    art = _rt(make_runtime, cuda_project, "nvcc").build(safejit.Source(code, "k"), arch="sm_90", flags=(flag, value))
    assert art.kernels == ("k",)
    deps = json.loads((Path(art.path) / "manifest.json").read_text())["deps"]
    assert {Path(d[1]).name for d in deps} >= {"scale.h", "detail.h"}


def test_a_source_root_replaced_at_its_path_is_read_by_the_next_compile(make_runtime, tmp_path):
    """NVRTC's worker is confined (Landlock) to the roots' directories as they were when
    it started; a root replaced at the same path (a package reinstalled, a tree
    re-extracted) left it refusing every later compile of that Runtime ("may not read
    ... permission denied"). The worker starts again when a root is another directory."""
    root = tmp_path / "pkg"
    (root / "include").mkdir(parents=True)
    (root / "include" / "scale.h").write_text("#define SCALE 1.0f\n")
    rt = make_runtime(backend="cuda", cuda_compiler="nvrtc", source_roots=(str(root),))
    inc = (str(root / "include"),)
    first = rt.build(safejit.Source(ANGLED, "k"), include_dirs=inc, arch="sm_90")
    root.rename(tmp_path / "pkg.old")
    (root / "include").mkdir(parents=True)
    (root / "include" / "scale.h").write_text("#define SCALE 2.0f\n")
    second = rt.build(safejit.Source(ANGLED, "k"), include_dirs=inc, arch="sm_90")
    assert second.deps_key != first.deps_key


@pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc")
def test_a_toolkit_header_with_a_dotdot_include_is_cached(make_runtime, cuda_project, cache_dir):
    """CUDA's targets/<arch>/include is a link into the toolkit, and cooperative_groups'
    headers include "../cooperative_groups.h": every such nvcc build counted as a ``..``
    after a link and was never published. The toolchain's own links are not the
    tenant's to re-point."""
    code = '#include <cooperative_groups/reduce.h>\nextern "C" __global__ void k(int* y) { y[0] = 1; }\n'
    rt = _rt(make_runtime, cuda_project, "nvcc")
    rt.build(safejit.Source(code, "cg"), arch="sm_90")
    assert len(leaves(cache_dir)) == 1
