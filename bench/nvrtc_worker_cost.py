"""Where a cold CuTe compile's time goes in safejit's NVRTC worker, against a bare
in-process nvrtcCompileProgram with the same options. Variants, each compiling a new
source every round, in a rotating order (paired by round):

  bare       nvrtcCompileProgram in this process
  safejit    Runtime.build (the worker as safejit starts it, and the parent's own work)
  worker     NvrtcWorker directly: recorder, Landlock, malloc tunables (as safejit's)
  norec      ... without the lookup recorder (no seccomp filter)
  nolandlock ... without Landlock (the recorder kept)
  malloc     ... with glibc's default malloc settings (no GLIBC_TUNABLES)
  plain      ... with none of it: no recorder, no Landlock, no address-space limit,
             default malloc, this process's environment (the process boundary alone)
  env        plain, in the worker's environment (LC_ALL=C, TZ, PATH)
  p+limit    plain, with the worker's address-space limit
  p+malloc   plain, with the worker's malloc tunables
  p+landlock plain, under Landlock
  p+landall  plain, under Landlock that lets it read everything (its cost without its denials)
  p+landrw   plain, under Landlock that lets it read and write everything (denies nothing at all)
  p+landtmp  plain, under the worker's Landlock plus writes under /tmp
  p+nnp      plain, with no_new_privs set (as Landlock and the recorder set it)
  p+r/NAME   plain, under Landlock that lets it read everything and use the right NAME
             (write, mk, rm, refer, trunc, ioctl) anywhere (which denial costs)
  p+w/DIR    plain, under Landlock that lets it read everything and do anything under DIR
  p+h/NAME   plain, under Landlock that handles only reading and the right NAME (none: reading
             only), lets it read everything and denies NAME everywhere (which denial costs)
  NAME#N     the variant NAME again, in a worker of its own (how far two alike differ)
  utf8       worker, with LC_ALL=C.UTF-8 for LC_ALL=C
  keep       worker, with the variables named by --keep taken from this process's environment
  pad        worker, its environment padded to the size of this process's (the stack starts
             where it would with the whole environment: alignment, not content)
  thp        worker, malloc asking for transparent huge pages (glibc.malloc.hugetlb=1)
  bare-c     bare, under LC_ALL=C (the environment variable and setlocale)
  bare-tz    bare, under TZ=UTC0
  specallow  worker, its seccomp filter installed with SECCOMP_FILTER_FLAG_SPEC_ALLOW
             (the kernel forces no speculation mitigation on the worker for it)

Per compile: wall seconds, CPU seconds (the worker's from /proc, plus this process's,
its reaped children included), minor page faults (the worker's and this process's); and whether a worker
was started again. Prints medians and the paired CPU ratio against bare.

    python bench/nvrtc_worker_cost.py [--rounds 7] [--only bare,plain,env,worker] [--keep NAME,...]

The cause of the worker's extra time, found on the H200 machine on 2026-12-02: the
peer was not compiling. In a process where NVRTC 13 can bring up the CUDA driver (a bare
process; a worker whose Landlock lets it write under /proc, /dev and HOME), the cubin of
a PTX it compiled before comes from the driver's ComputeCache (~/.nv/ComputeCache): ptxas
does not run (the program log lacks its ``-v`` lines), the cubin is the same bytes. The
rounds used to differ by a comment only, which leaves the PTX alike, so bare (and every
variant allowed to write) took its cubin from that cache while the worker, denied the
driver and the cache, ran ptxas: hence "Landlock costs 25 %", p+landall 1.22-1.31 against
p+landrw 0.86-0.98 (2026-12-01). With CUDA_CACHE_DISABLE=1 or a fresh CUDA_CACHE_PATH,
bare logs ptxas again. Each round's source now adds a ``__device__`` constant of its own
(a new PTX), and bare asserts that ptxas ran. Seen then (6 rounds; CPU per compile still
varies 3.4-6.6 s between processes there, so +-0.1): safejit 0.99, worker 1.08, norec
1.04, nolandlock 1.06, malloc 1.07, plain 1.07 -- the worker costs what a process of its
own costs. The worker keeps denying the driver and its cache: a compile has no business
with the GPU or with a cache that every process of the user writes and nothing verifies.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import locale
import os
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import safejit
from safejit.backends.cuda import nvrtc as nv
from safejit.backends.cuda.backend import CudaBackend
from safejit.sandbox import SYSTEM_PATH, lookups
from safejit.sandbox.statedir import state_dir

KERNEL = (Path(__file__).resolve().parent.parent / "tests" / "data" / "cute_sgemm.cu").read_text()
VARIANTS = ("bare", "safejit", "worker", "norec", "nolandlock", "malloc", "plain", "env", "specallow", "utf8")
VARIANTS += ("bare-c", "bare-tz", "thp", "keep", "pad", "p+limit", "p+malloc", "p+landlock", "p+landall", "p+nnp")
VARIANTS += ("p+landrw", "p+landtmp")
PLAIN_PLUS = ("p+limit", "p+malloc", "p+landlock", "p+landall", "p+nnp", "p+landrw", "p+landtmp")
DIRECT = ("worker", "norec", "nolandlock", "malloc", "plain", "env", "specallow", "utf8", "thp", "keep", "pad")
DIRECT += PLAIN_PLUS
KEEP: list[str] = []
UNRECORDED = ("norec", "plain", "env", *PLAIN_PLUS)
TICK = os.sysconf("SC_CLK_TCK")
NO_LANDLOCK = "import safejit.sandbox.landlock as L; L.restrict = lambda *a, **k: None; "
NO_LIMIT = "import resource; resource.setrlimit = lambda *a: None; "
LAND_ALL = "import safejit.sandbox.landlock as L; r = L.restrict; L.restrict = lambda p, *a, **k: r(['/'], *a, **k); "
_LAND = "import safejit.sandbox.landlock as L; r = L.restrict; L.restrict = "
LAND_RW = _LAND + "lambda p, w, **k: r(['/'], ['/'], **k); "
LAND_TMP = _LAND + "lambda p, w, **k: r(p, [*w, '/tmp'], **k); "
RIGHTS = {"write": 1 << 1, "rm": 0x30, "mk": 0x1FC0, "refer": 1 << 13, "trunc": 1 << 14, "ioctl": 1 << 15}
NNP = "import ctypes; ctypes.CDLL(None).prctl(38, 1, 0, 0, 0); "  # PR_SET_NO_NEW_PRIVS


def cutlass_include() -> str:
    import importlib.util

    spec = importlib.util.find_spec("cutlass_library")
    assert spec is not None and spec.origin is not None, "pip install nvidia-cutlass"
    return str((Path(spec.origin).parent / "source" / "include").resolve())


def proc_stat(pid: int) -> tuple[float, int, int, float]:
    """CPU seconds and minor faults of ``pid`` so far, the CPU it last ran on, and its
    system CPU seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK, int(fields[7]), int(fields[36]), int(fields[12]) / TICK


@contextlib.contextmanager
def environment(variant: str) -> Iterator[None]:
    """This process under the worker's locale (bare-c) or time zone (bare-tz)."""
    name, value = ("LC_ALL", "C") if variant == "bare-c" else ("TZ", "UTC0")
    old = os.environ.get(name)
    os.environ[name] = value
    if name == "TZ":
        time.tzset()
    else:
        locale.setlocale(locale.LC_ALL, "C")
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old
        if name == "TZ":
            time.tzset()
        else:
            locale.setlocale(locale.LC_ALL, "")


def build_spec_allow(cc: str | None) -> str | None:
    """lookups.c built with SECCOMP_FILTER_FLAG_SPEC_ALLOW (a variant to compare)."""
    here = Path(lookups.__file__).with_name("lookups.c").read_text()
    flag = "SECCOMP_FILTER_FLAG_TSYNC, &prog"
    if cc is None or flag not in here:
        return None
    work = Path(tempfile.mkdtemp())
    (work / "l.c").write_text(here.replace(flag, "SECCOMP_FILTER_FLAG_TSYNC | SECCOMP_FILTER_FLAG_SPEC_ALLOW, &prog"))
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(work / "l.so"), str(work / "l.c")], check=True)
    return str(work / "l.so")


def huge_kib(pid: int | str) -> int:
    """Anonymous memory of ``pid`` in transparent huge pages, KiB."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def nvrtc_mapped(pid: int | str) -> str:
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return ",".join(sorted({m.split()[-1] for m in maps if "libnvrtc.so" in m}))


def own_cpu() -> tuple[float, int, float]:
    """CPU seconds (reaped children included), minor faults and system CPU seconds of
    this process so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, me.ru_minflt, me.ru_stime + kids.ru_stime


def workers() -> set[int]:
    """This process's NVRTC workers."""
    me, found = str(os.getpid()), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1] == me and (
                    b"safejit.backends.cuda.worker" in Path(f"/proc/{entry}/cmdline").read_bytes()
                ):
                    found.add(int(entry))
    return found


@contextlib.contextmanager
def started_as(variant: str) -> Iterator[None]:
    """NvrtcWorker._start, for one variant's worker."""
    tunables, popen = nv._WORKER_MALLOC, subprocess.Popen
    variant = variant.partition("#")[0]

    def patched(argv: list[str], **kw: Any) -> Any:
        boot = {
            "nolandlock": NO_LANDLOCK, "plain": NO_LANDLOCK + NO_LIMIT, "env": NO_LANDLOCK + NO_LIMIT,
            "p+limit": NO_LANDLOCK, "p+malloc": NO_LANDLOCK + NO_LIMIT, "p+landlock": NO_LIMIT,
            "p+landall": LAND_ALL + NO_LIMIT, "p+nnp": NO_LANDLOCK + NO_LIMIT + NNP,
            "p+landrw": LAND_RW + NO_LIMIT, "p+landtmp": LAND_TMP + NO_LIMIT,
        }.get(variant, "")  # fmt: skip
        if variant.startswith("p+r/"):
            boot = f"{_LAND}lambda p, w, **k: r(['/'], [], **k); L.READ_EXECUTE |= {RIGHTS[variant[4:]]}; {NO_LIMIT}"
        if variant.startswith("p+h/"):
            mask = RIGHTS.get(variant[4:], 0)
            boot = f"{_LAND}lambda p, w, **k: r(['/'], [], **k); L.handled_access = lambda v: L.READ_EXECUTE | {mask}; "
            boot += NO_LIMIT
        if variant.startswith("p+w/"):
            boot = f"{_LAND}lambda p, w, **k: r(['/'], [{variant[3:]!r}], **k); {NO_LIMIT}"
        argv = [*argv[:3], argv[3].replace("from safejit.backends", boot + "from safejit.backends"), *argv[4:]]
        if variant in ("plain", *PLAIN_PLUS):
            kw["env"] = dict(os.environ) if variant != "p+malloc" else {**os.environ, "GLIBC_TUNABLES": tunables}
        if variant == "utf8":
            kw["env"] = {**kw["env"], "LC_ALL": "C.UTF-8"}
        if variant == "keep":
            kw["env"] = {**kw["env"], **{k: os.environ[k] for k in KEEP if k in os.environ}}
        if variant == "pad":
            size = sum(len(k) + len(v) + 2 for k, v in os.environ.items())
            have = sum(len(k) + len(v) + 2 for k, v in kw["env"].items())
            kw["env"] = {**kw["env"], "SAFEJIT_BENCH_PAD": "x" * max(size - have - 20, 0)}
        return popen(argv, **kw)

    try:
        if variant in ("malloc", "plain", "env", *PLAIN_PLUS):
            nv._WORKER_MALLOC = ""  # type: ignore[misc]
        if variant == "thp":
            nv._WORKER_MALLOC = tunables + ":glibc.malloc.hugetlb=1"  # type: ignore[misc]
        nv.subprocess.Popen = patched  # type: ignore[assignment,misc]
        yield
    finally:
        nv._WORKER_MALLOC = tunables  # type: ignore[misc]
        nv.subprocess.Popen = popen  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default=",".join(VARIANTS))
    parser.add_argument("--keep", default="", help="variables the keep variant takes from this environment")
    parser.add_argument("--pin", type=int, help="run this process and its workers on this one CPU")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    variants = args.only.split(",")
    global PLAIN_PLUS, DIRECT, UNRECORDED
    extra = tuple(v for v in variants if v.startswith(("p+r/", "p+w/", "p+h/")))
    PLAIN_PLUS, DIRECT, UNRECORDED = PLAIN_PLUS + extra, DIRECT + extra, UNRECORDED + extra
    again = [v for v in variants if v.partition("#")[2]]
    PLAIN_PLUS += tuple(v for v in again if v.partition("#")[0] in PLAIN_PLUS)
    DIRECT += tuple(v for v in again if v.partition("#")[0] in DIRECT)
    UNRECORDED += tuple(v for v in again if v.partition("#")[0] in UNRECORDED)
    KEEP.extend(k for k in args.keep.split(",") if k)
    from cuda.bindings import nvrtc

    inc = cutlass_include()
    search = [inc, *CudaBackend()._include_dir()]
    options = ["--gpu-architecture=sm_90", "-default-device", "--ptxas-options=-v", "-std=c++17"]
    options += [f"-I{d}" for d in search]
    bare_opts = [o.encode() for o in options]
    library = lookups.build(state_dir(), shutil.which("cc", path=SYSTEM_PATH))
    spec_allow = build_spec_allow(shutil.which("cc", path=SYSTEM_PATH)) if "specallow" in variants else None
    cmdline = Path("/proc/cmdline").read_text().split()
    shown = ("GLIBC_TUNABLES", "MALLOC_", "LD_", "LC_", "LANG", "TZ")
    print("environment:", sorted(os.environ), {k: v for k, v in os.environ.items() if k.startswith(shown)})
    print("cmdline:", [a for a in cmdline if a.startswith(("mitig", "spec", "ssb", "nospec", "retbleed", "spectre"))])
    print("kernel", os.uname().release, "| recorder", library)
    for name in ("spec_store_bypass", "spectre_v2"):
        with contextlib.suppress(OSError):
            print(name, Path(f"/sys/devices/system/cpu/vulnerabilities/{name}").read_text().strip())
    with contextlib.suppress(OSError):
        print("thp", Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip())

    def bare(code: str) -> None:
        _, prog = nvrtc.nvrtcCreateProgram(code.encode(), b"cute_sgemm.cu", 0, [], [])
        try:
            (err,) = nvrtc.nvrtcCompileProgram(prog, len(bare_opts), bare_opts)
            assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
            _, size = nvrtc.nvrtcGetCUBINSize(prog)
            nvrtc.nvrtcGetCUBIN(prog, b" " * size)
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            assert code == warm or b"Compiling entry function" in log, f"ptxas did not run: {log!r}"
        finally:
            nvrtc.nvrtcDestroyProgram(prog)

    warm = 'extern "C" __global__ void k() {}'
    bare(warm)
    direct: dict[str, nv.NvrtcWorker] = {}
    for v in variants:
        if v in DIRECT:
            with started_as(v):
                w = direct[v] = nv.NvrtcWorker(
                    "sm_90", False, search, None if v in UNRECORDED else spec_allow if v == "specallow" else library
                )
                w.compile_once(nv.NvrtcRequest(warm.encode(), "k", options[:1], [], record=v not in UNRECORDED))
            assert w._proc is not None
            status = Path(f"/proc/{w._proc.pid}/status").read_text().splitlines()
            spec = [s.split(":", 1)[1].strip() for s in status if s.startswith(("Seccomp:", "Speculation"))]
            print(f"{v:10s} recording={w.recording} {w.why!r} seccomp/ssb={spec} {nvrtc_mapped(w._proc.pid)}")
    print("this process", nvrtc_mapped("self"))
    rt = None
    if "safejit" in variants:
        cfg = safejit.Config(backend="cuda", cache_dirs=(tempfile.mkdtemp(),), source_roots=(inc,))
        rt = safejit.Runtime(config=cfg)
        rt.build(safejit.Source(warm, "k"), arch="sm_90")
    mine = {w._proc.pid for w in direct.values() if w._proc is not None}

    salt = random.SystemRandom().randrange(1 << 30)
    rows: dict[str, list[tuple[float, float, int, float]]] = {v: [] for v in variants}
    restarts = 0
    cpus: dict[str, int] = {}
    for i in range(args.rounds):
        order = variants[i % len(variants) :] + variants[: i % len(variants)]
        for v in order:
            # (a new PTX too: a comment alone would let bare NVRTC take the cubin from the
            # driver's ComputeCache, ptxas not run; see above)
            code = f"{KERNEL}\n__device__ int cute_bench_salt = {salt + i * len(variants) + variants.index(v)};\n"
            pids = sorted(workers() - mine) if v == "safejit" else []
            if v in direct:
                assert direct[v]._proc is not None
                pids = [direct[v]._proc.pid]
            before = [proc_stat(p) for p in pids]
            c0, t0 = own_cpu(), time.perf_counter()
            if v == "bare":
                bare(code)
            elif v in ("bare-c", "bare-tz"):
                with environment(v):
                    bare(code)
            elif v == "safejit":
                assert rt is not None
                art = rt.build(safejit.Source(code, "cute_sgemm"), include_dirs=(inc,), arch="sm_90",
                               flags=("-std=c++17",))  # fmt: skip
                assert art.source == "compiled", art
            else:
                req = nv.NvrtcRequest(code.encode(), "cute_sgemm", options, [], record=v not in UNRECORDED)
                assert direct[v].compile_once(req).ok
            wall = time.perf_counter() - t0
            after = [proc_stat(p) for p in pids if os.path.exists(f"/proc/{p}")]
            if len(after) != len(pids) or (v == "safejit" and set(pids) != workers() - mine):
                restarts += 1
            c1 = own_cpu()
            cpu = c1[0] - c0[0] + sum(a[0] - b[0] for a, b in zip(after, before, strict=False))
            faults = c1[1] - c0[1] + sum(a[1] - b[1] for a, b in zip(after, before, strict=False))
            system = c1[2] - c0[2] + sum(a[3] - b[3] for a, b in zip(after, before, strict=False))
            rows[v].append((wall, cpu, faults, system))
            cpus[v] = after[0][2] if after else proc_stat(os.getpid())[2]
        line = " ".join(
            f"{v}={rows[v][-1][0]:.2f}/{rows[v][-1][1]:.2f}/{rows[v][-1][3]:.2f}/{rows[v][-1][2]}@{cpus[v]}"
            for v in variants
        )
        print(i, line, flush=True)
    if rt is not None:
        rt.close()
    huge = {v: huge_kib(w._proc.pid) for v, w in direct.items() if w._proc is not None}
    print("AnonHugePages KiB:", {"this process": huge_kib("self"), **huge})
    for w in direct.values():
        w.close()
    out: dict[str, Any] = {"restarts": restarts}
    print(f"{'variant':10s} {'wall s':>7s} {'CPU s':>7s} {'sys s':>6s} {'faults':>7s} {'CPU/bare':>9s}  (medians)")
    for v in variants:
        wall, cpu = statistics.median(r[0] for r in rows[v]), statistics.median(r[1] for r in rows[v])
        faults, system = statistics.median(r[2] for r in rows[v]), statistics.median(r[3] for r in rows[v])
        pairs = zip(rows[v], rows.get("bare", rows[v]), strict=True)
        ratio = statistics.median(r[1] / b[1] for r, b in pairs)
        out[v] = {"wall_s": wall, "cpu_s": cpu, "sys_s": system, "faults": faults, "cpu_vs_bare": ratio}
        print(f"{v:10s} {wall:7.2f} {cpu:7.2f} {system:6.2f} {faults:7.0f} {ratio:9.3f}")
    print("(CPU/bare: the median of each round's ratio)")
    print("workers started again during a compile:", restarts)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
