"""nvcc's cicc reads what the host preprocessor's output names: a line a macro made
(``#define H # include "x"`` then ``H``) is no directive to cc1plus, which passes it on,
but cicc takes it for one and opens the file itself. Its lookups are recorded as the
preprocessors' are: a file under the roots it reads is in the closure (an edit
rebuilds), one outside is refused in the one generic error, whether it is there or not."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import safejit
from tests.conftest import settle
from tests.security._support import assert_nothing_published

pytest.importorskip("cuda.bindings.nvrtc")
NVCC = shutil.which("nvcc", path="/usr/local/cuda/bin:/usr/bin")
pytestmark = pytest.mark.skipif(NVCC is None, reason="no nvcc")


def _runtime(make_runtime, root: Path, **config) -> safejit.Runtime:
    rt = make_runtime(backend="cuda", cuda_compiler="nvcc", source_roots=(str(root),), **config)
    if not rt._init()[0].sandbox.preload_env():
        pytest.skip("no lookup recorder here")
    return rt


def _reading(path: str) -> str:
    kernel = 'extern "C" __global__ void k(char* o) { for (int i = 0; i < 8; i++) o[i] = mk[i]; }\n'
    return f'#define H # include "{path}"\nH\n' + kernel


def test_a_header_only_cicc_reads_is_in_the_closure(make_runtime, tmp_path, cache_dir):
    """It was in no list: the build was published without it, and a fresh Runtime served
    the cubin of the header as it was before an edit."""
    root = tmp_path / "root"
    (root / "inc").mkdir(parents=True)
    header = root / "inc" / "val.h"
    header.write_text('__attribute__((device)) const char mk[] = "MARK1";\n')
    settle()
    source = safejit.Source(_reading(str(header)), "k")
    first = _runtime(make_runtime, root).build(source, arch="sm_90")
    deps = json.loads((Path(first.path) / "manifest.json").read_text())["deps"]
    assert ["s0", "inc/val.h"] in [d[:2] for d in deps]
    header.write_text('__attribute__((device)) const char mk[] = "MARK2";\n')
    settle()
    second = _runtime(make_runtime, root).build(source, arch="sm_90")
    assert second.path != first.path
    cubin = (Path(second.path) / "artifact.cubin").read_bytes()
    assert re.search(rb"MARK\d", cubin).group(0) == b"MARK2"  # type: ignore[union-attr]


def test_a_file_outside_that_cicc_reads_is_refused_in_the_one_error(make_runtime, tmp_path, cache_dir):
    """Its lines were quoted by the error (/etc/ld.so.conf, line by line), one under a
    dir the sandbox keeps closed said "Permission denied" where an absent one did not,
    and a build that read one was published."""
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "closed").mkdir()
    (tmp_path / "closed" / "secret.h").write_text("SECRET 1234\n")
    rt = _runtime(make_runtime, root)
    said = set()
    for path in ("/etc/ld.so.conf", str(tmp_path / "closed" / "secret.h"), str(tmp_path / "absent.h")):
        with pytest.raises(safejit.UndeclaredDependencyError) as info:
            rt.build(safejit.Source(_reading(path), "k"), arch="sm_90")
        said.add((str(info.value), getattr(info.value, "log", "")))
        assert "ld.so.conf.d" not in str(info.value) and "SECRET" not in str(info.value)
    assert len(said) == 1, said
    assert_nothing_published(cache_dir)


def test_the_zone_file_is_read_by_no_compiler(make_runtime, tmp_path, cache_dir, monkeypatch):
    """cicc looked up /etc/localtime at every compile, so it was excused, for every
    preprocessor: a tenant's ``#include "/etc/localtime"`` was read and quoted by the error
    (``TZif2``); with ``TZ`` passed through, cicc looked up its zone file under
    /usr/share/zoneinfo, outside the roots, and every nvcc build was refused. Compilers run
    with TZ fixed: the zone file is refused like any other outside file, and a ``TZ``
    passed through changes nothing."""
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv("TZ", "Europe/Berlin")
    rt = _runtime(make_runtime, root, env_passthrough=("TZ",))
    header = '__attribute__((device)) const char mk[] = "MARK1";\n'
    (root / "val.h").write_text(header)
    settle()
    assert rt.build(safejit.Source(_reading(str(root / "val.h")), "k"), arch="sm_90")  # (TZ passed through)
    for source in (_reading("/etc/localtime"), '#include "/etc/localtime"\n' + _reading(str(root / "val.h"))):
        with pytest.raises(safejit.UndeclaredDependencyError) as info:
            rt.build(safejit.Source(source, "k"), arch="sm_90")
        assert "TZif" not in str(info.value) + str(getattr(info.value, "log", ""))
    host = make_runtime(source_roots=(str(root),))
    with pytest.raises(safejit.UndeclaredDependencyError) as info:
        host.compile(safejit.Source('#include "/etc/localtime"\nint f(void) { return 1; }\n', "f"))
    assert "TZif" not in str(info.value)
