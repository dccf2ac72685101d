"""The public surface: names, errors, config and the environment table."""

from __future__ import annotations

import pickle

import pytest

import safejit
from safejit import _env, errors


def test_all_is_pinned():
    assert sorted(safejit.__all__) == sorted(
        [
            "ArgumentTypeError",
            "ArgumentValueError",
            "Artifact",
            "CacheError",
            "CompileError",
            "CompileTimeout",
            "Config",
            "ConfigError",
            "Explanation",
            "FlagPolicyError",
            "Kernel",
            "KernelHandle",
            "KernelNotFoundError",
            "KeyDeclarationError",
            "LimitExceededError",
            "LoadError",
            "LoadTimeCodeError",
            "Module",
            "PathConfinementError",
            "PolicyError",
            "Runtime",
            "SafejitError",
            "SandboxUnavailableError",
            "Source",
            "UndeclaredDependencyError",
            "__version__",
            "faults",
        ]
    )
    for name in safejit.__all__:
        assert hasattr(safejit, name)


def test_dir_shows_the_public_names_not_the_packages_own_imports():
    shown = set(dir(safejit))
    assert set(safejit.__all__) <= shown and not shown & {"Any", "TYPE_CHECKING", "annotations", "importlib"}
    more = {n for n in shown - set(safejit.__all__) if not n.startswith("__")}
    assert all(getattr(safejit, n).__name__ == f"safejit.{n}" for n in more), more  # (its submodules imported so far)


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (errors.ConfigError, ValueError),
        (errors.KeyDeclarationError, ValueError),
        (errors.CompileError, RuntimeError),
        (errors.CompileTimeout, TimeoutError),
        (errors.PathConfinementError, PermissionError),
        (errors.FlagPolicyError, PermissionError),
        (errors.UndeclaredDependencyError, PermissionError),
        (errors.LoadTimeCodeError, PermissionError),
        (errors.CacheError, OSError),
        (errors.KernelNotFoundError, LookupError),
        (errors.ArgumentTypeError, TypeError),
        (errors.ArgumentValueError, ValueError),
    ],
)
def test_errors_inherit_root_and_builtin_and_pickle(error, builtin):
    assert issubclass(error, safejit.SafejitError) and issubclass(error, builtin)
    exc = error("boom", log="compiler said no", path="/x")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is error and str(back) == "boom"
    assert back.log == "compiler said no" and back.path == "/x"


def test_a_compile_error_always_has_its_log_and_argv():
    """``.log`` and ``.argv`` are there whichever path raised it (some have no output
    or no command): a handler that prints ``exc.log`` never meets an AttributeError."""
    bare = safejit.CompileError("could not write the defines header")
    assert bare.log == "" and bare.argv is None
    ran = safejit.CompileError("failed", log="out", argv=("cc", "-c"))
    assert ran.log == "out" and ran.argv == ["cc", "-c"]
    late = safejit.CompileTimeout("ran past 1s", timeout=1.0)
    assert late.log == "" and late.argv is None and late.timeout == 1.0
    back = pickle.loads(pickle.dumps(ran))
    assert back.log == "out" and back.argv == ["cc", "-c"]


def test_compile_error_carries_the_log(make_runtime):
    rt = make_runtime()
    with pytest.raises(safejit.CompileError) as info:
        rt.compile(safejit.Source("int f(void) { return undefined_name; }", "f"))
    assert "undefined_name" in info.value.log
    assert rt.stats()["errors"] == 1


def test_config_from_env_reads_the_table(monkeypatch, tmp_path):
    monkeypatch.setenv("SAFEJIT_CACHE_DIRS", f"{tmp_path}/a:{tmp_path}/b")
    monkeypatch.setenv("SAFEJIT_MAX_STALENESS_S", "0.5")
    monkeypatch.setenv("SAFEJIT_TENANT", "team-a")
    monkeypatch.setenv("SAFEJIT_MEMORY_MAX_ENTRIES", "7")
    cfg = safejit.Config.from_env()
    assert cfg.cache_dirs == (f"{tmp_path}/a", f"{tmp_path}/b")
    assert (cfg.max_staleness_s, cfg.tenant, cfg.memory_max_entries) == (0.5, "team-a", 7)


def test_bad_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("SAFEJIT_MAX_STALENESS_S", "soon")
    with pytest.raises(safejit.ConfigError, match="SAFEJIT_MAX_STALENESS_S"):
        safejit.Config.from_env()


def test_default_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert safejit.Config().resolved_cache_dirs() == (str(tmp_path / "safejit"),)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _env.default_cache_dir() == tmp_path / "home" / ".cache" / "safejit"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"backend": "fpga"},
        {"tenant": "Team A"},
        {"tenant": "../x"},
        {"max_staleness_s": -1},
        {"memory_max_entries": 0},
        {"cache_dirs": "/tmp/x"},
        {"declared_extras": ("not an ident",)},
        {"sandbox": "maybe"},
        {"require_signed": True},
        {"compile_timeout_s": float("nan")},
    ],
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(safejit.ConfigError):
        safejit.Config(**kwargs)


def test_config_range_errors_say_the_range():
    with pytest.raises(safejit.ConfigError, match=r"max_staleness_s must be 0 or more, got -1"):
        safejit.Config(max_staleness_s=-1)
    with pytest.raises(safejit.ConfigError, match=r"memory_max_entries must be positive, got 0"):
        safejit.Config(memory_max_entries=0)
    assert safejit.Config(max_staleness_s=0).max_staleness_s == 0  # (0: every hit re-stats)


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "x" * 129, "a b"])
def test_source_name_is_validated(name):
    with pytest.raises(safejit.ConfigError):
        safejit.Source("int f(void){return 0;}", name)


def test_runtime_is_lazy(tmp_path):
    cache = tmp_path / "never"
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache),)))
    assert not cache.exists()
    assert rt.stats()["compiles"] == 0
    rt.close()
    assert not cache.exists()


def test_cxx_source_and_numpy_arrays(make_runtime):
    np = pytest.importorskip("numpy")
    import ctypes

    code = (
        'extern "C" double total(const double* x, long n) {\n'
        "  double s = 0; for (long i = 0; i < n; ++i) s += x[i]; return s;\n}\n"
    )
    rt = make_runtime()
    mod = rt.compile(safejit.Source(code, "total", filename="total.cpp"))
    k = mod.kernel("total", argtypes=(ctypes.c_void_p, ctypes.c_long), restype=ctypes.c_double)
    x = np.arange(10, dtype=np.float64)
    assert k(x, 10) == 45.0
    assert mod.kernels == ("total",)


def test_unknown_kernel_and_closed_module(make_runtime):
    rt = make_runtime()
    mod = rt.compile(safejit.Source("int add(int a, int b) { return a + b; }", "add"))
    with pytest.raises(safejit.KernelNotFoundError):
        mod.kernel("sub")
    k = mod["add"]
    rt.close()
    with pytest.raises(safejit.LoadError):
        k(1, 2)
    rt.close()  # twice is fine


def test_a_closed_module_is_no_hit_for_the_next_compile(make_runtime):
    """A module its caller closed stayed in the memory tier: every later compile of the
    source returned it, and each of its kernels raised LoadError (a long-running process
    that unloads a kernel could never load it again)."""
    rt = make_runtime()
    src = safejit.Source("int add(int a, int b) { return a + b; }", "add")
    mod = rt.compile(src)
    assert rt.compile(src).artifact.tier == "memory"
    mod.close()
    again = rt.compile(src)
    assert not again.closed and again.artifact.tier == "disk"
    assert again.kernel("add")(2, 3) == 5 and mod.closed
    assert rt.compile(src).kernel("add")(1, 1) == 2 and rt.stats()["disk_hits"] == 1
    again.close()
    assert rt.compile(src).kernel("add")(4, 4) == 8 and rt.stats()["disk_hits"] == 2


def test_extras_must_match_declared_extras(make_runtime):
    rt = make_runtime(declared_extras=("sm_count",))
    src = safejit.Source("int f(void) { return 1; }", "f")
    with pytest.raises(safejit.KeyDeclarationError):
        rt.compile(src)
    with pytest.raises(safejit.KeyDeclarationError):
        rt.compile(src, extras={"sm_count": 1, "other": 2})
    a = rt.build(src, extras={"sm_count": 132}).build_key
    b = rt.build(src, extras={"sm_count": 108}).build_key
    assert a != b


def test_build_returns_artifact_without_loading(make_runtime, cache_dir):
    rt = make_runtime()
    art = rt.build(safejit.Source("int add(int a, int b) { return a + b; }", "add"))
    assert art.kernels == ("add",) and art.size > 0 and len(art.digest) == 64
    assert art.path.startswith(str(cache_dir)) and art.path.endswith(art.deps_key)
    assert rt.stats()["memory_entries"] == 0


def test_the_unrelated_pypi_pyacl_is_never_a_dependency():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    every = list(project["dependencies"]) + [d for extra in project["optional-dependencies"].values() for d in extra]
    assert not [d for d in every if d.lower().replace("_", "-").startswith("pyacl")]


def test_the_public_surface_is_typed_for_a_user_of_it(tmp_path):
    """A user's code type-checks against what the library declares: mypy --strict
    on a program that compiles, calls, launches and reads stats sees no Any where a
    public method returns (Module.kernel gives a KernelHandle; reveal_type says so)."""
    import subprocess
    import sys

    user = tmp_path / "user.py"
    user.write_text(
        "import safejit\n"
        "def run(rt: safejit.Runtime) -> int:\n"
        '    mod = rt.compile(safejit.Source("int add(int a, int b) { return a + b; }", "add"))\n'
        '    add = mod.kernel("add")\n'
        "    reveal_type(mod)\n"
        "    reveal_type(add)\n"
        "    reveal_type(add.launch)\n"
        '    reveal_type(rt.stats()["compiles"])\n'
        "    value: int = add(2, 3)\n"
        "    return value\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path / "c"), str(user)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    revealed = [line.split("Revealed type is ", 1)[1] for line in out.stdout.splitlines() if "Revealed type" in line]
    assert revealed[:3] == ['"safejit.kernel.Module"', '"safejit.kernel.KernelHandle"', '"def (*Any, **Any) -> Any"']
    assert "Any" not in revealed[3], revealed[3]
    assert "error:" not in out.stdout.replace("note:", ""), out.stdout


@pytest.mark.parametrize(
    "call",
    [
        lambda: safejit.Config(signing_key=5),
        lambda: safejit.Config(verify_keys={"k": 5}),
        lambda: safejit.Runtime(config={"backend": "host"}),
        lambda: safejit.Source("int f(void) { return 1; }", "f", filename=5),
        lambda: safejit.Source("int f(void) { return 1; }", "f", origin=5),
        lambda: safejit.Runtime(config=safejit.Config(backend="fake")).source(5),
        lambda: safejit.Runtime(5),
    ],
    ids=["signing_key", "verify_keys", "runtime_config", "filename", "origin", "source_path", "backend"],
)
def test_a_public_argument_of_the_wrong_type_is_a_typed_error(call):
    """Each raised a raw TypeError or AttributeError from deep inside (or was taken)."""
    with pytest.raises(safejit.ConfigError):
        call()


def test_a_config_passed_first_to_runtime_says_to_pass_it_as_config(tmp_path):
    """``Runtime(Config(...))``, as a newcomer writes it, took the Config for the backend's
    name: "Config.backend must be one of (...), got Config(backend='host', ...)"."""
    with pytest.raises(safejit.ConfigError, match=r"pass a Config as Runtime\(config=\.\.\.\)"):
        safejit.Runtime(safejit.Config(cache_dirs=(str(tmp_path),)))


def test_kernel_argtypes_that_are_no_sequence_is_an_argument_type_error(make_runtime):
    mod = make_runtime().compile(safejit.Source("int add(int a, int b) { return a + b; }\n", "add"))
    with pytest.raises(safejit.ArgumentTypeError, match="argtypes"):
        mod.kernel("add", argtypes=5)
