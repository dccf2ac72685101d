"""``compile``/``build``/``explain`` check their arguments as ``Config`` does: a bare
string for a sequence, a non-mapping ``defines``/``extras`` — each a ConfigError naming
the argument, before anything is resolved or compiled; an unknown keyword is Python's
TypeError naming it; and a valid request that is in the memory tier pays nothing for
the checks (an invalid one is never stored there)."""

from __future__ import annotations

import pytest

import safejit
from safejit import _arguments

ADD = safejit.Source("int add(int a, int b) { return a + b; }", "add")


@pytest.mark.parametrize(
    ("kwargs", "argument", "says"),
    [
        ({"flags": "-O3"}, "flags", "not the single str '-O3'; pass ('-O3',)"),
        ({"include_dirs": "/opt/mylib/include"}, "include_dirs", "not the single str '/opt/mylib/include'"),
        ({"name_expressions": "scale<float>"}, "name_expressions", "not the single str"),
        ({"flags": 3}, "flags", "must be a tuple or list of strings, got int"),
        ({"defines": [("N", "4")]}, "defines", "must be a mapping"),
        ({"defines": "N=4"}, "defines", "must be a mapping"),
        ({"defines": {"N": [4]}}, "defines", "['N'] must be str, int, float, bool or None, got list"),
        ({"extras": ("sm", 80)}, "extras", "must be a mapping"),
        ({"extras": {"sm": None}}, "extras", "must be str, int, float, bool, got NoneType"),
        ({"arch": 90}, "arch", "must be a str or None, got int"),
        ({"source": "int f(void) { return 0; }"}, "source", "must be a safejit.Source, got str"),
    ],
)
@pytest.mark.parametrize("call", ["compile", "build", "explain"])
def test_a_wrong_argument_is_a_config_error_naming_it(make_runtime, cache_dir, call, kwargs, argument, says):
    rt = make_runtime()
    with pytest.raises(safejit.ConfigError) as info:
        given = dict(kwargs)
        getattr(rt, call)(given.pop("source", ADD), **given)
    assert says in str(info.value) and info.value.argument == argument
    assert str(info.value).startswith(f"{call}(")
    assert rt.stats()["compiles"] == 0 and not any(cache_dir.iterdir())  # nothing resolved, nothing made


@pytest.mark.parametrize("call", ["compile", "build", "explain"])
def test_an_unknown_keyword_is_a_type_error_naming_it(make_runtime, cache_dir, call):
    rt = make_runtime()
    with pytest.raises(TypeError, match="unexpected keyword argument 'flag'"):
        getattr(rt, call)(ADD, flag=("-O3",))
    assert rt.stats()["compiles"] == 0 and not any(cache_dir.iterdir())


def test_a_memory_hit_with_an_unknown_keyword_still_raises(make_runtime):
    rt = make_runtime()
    rt.compile(ADD, flags=("-O2",))
    with pytest.raises(TypeError, match="'flag'"):
        rt.compile(ADD, flags=("-O2",), flag=("-O3",))
    assert rt.stats()["compiles"] == 1


def test_a_bare_string_never_reaches_the_memory_tier(make_runtime):
    """``tuple("-O2")`` is a request of its own, never stored: it is checked each time."""
    rt = make_runtime()
    for _ in range(2):
        with pytest.raises(safejit.ConfigError, match="flags"):
            rt.compile(ADD, flags="-O2")
    assert rt.stats()["memory_entries"] == 0


def test_lists_and_mappings_are_fine(make_runtime):
    rt = make_runtime()
    mod = rt.compile(ADD, flags=["-O2"], defines={"N": 4, "FAST": None}, include_dirs=[])
    assert mod.kernel("add")(1, 2) == 3
    assert rt.compile(ADD, flags=("-O2",), defines={"N": 4, "FAST": None}) is not None
    assert rt.stats()["compiles"] == 1


def test_the_defaults_are_valid():
    _arguments.check_arguments("compile", ADD)


@pytest.mark.parametrize("expression", ["", "scale<\0float>", 3])
def test_a_bad_name_expression_is_refused_before_any_toolchain_is_probed(
    make_runtime, cache_dir, monkeypatch, expression
):
    """An empty name expression, one holding NUL or one that is not a str says so before
    the compiler is asked anything (as the other arguments' checks do)."""
    from safejit.backends.host import HostBackend

    def probed(*args, **kwargs):
        raise AssertionError("the toolchain was probed")

    rt = make_runtime()
    monkeypatch.setattr(HostBackend, "toolchain", probed)
    with pytest.raises(safejit.ConfigError, match="name_expressions must be"):
        rt.build(ADD, name_expressions=(expression,))
    assert rt.stats()["compiles"] == 0 and not any(cache_dir.iterdir())


def test_an_int_too_large_to_write_is_a_typed_error_as_a_define_or_an_extra(make_runtime):
    rt = make_runtime(backend="fake", declared_extras=("e",))
    src = safejit.Source("#define V 1\n", "v")
    with pytest.raises(safejit.ConfigError, match="too large"):
        rt.compile(src, defines={"X": 10**5000}, extras={"e": 1})
    with pytest.raises(safejit.KeyDeclarationError, match="too large"):
        rt.compile(src, extras={"e": 10**5000})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("argument", ["defines", "extras"])
def test_a_float_that_is_no_number_is_refused_and_nothing_is_kept(make_runtime, cache_dir, value, argument):
    """A NaN, equal to no other, missed the memory tier on every call: each loaded the
    library again and added an entry for the same kernel (evicting the others); and "nan"
    or "inf" written into a define is a name in C, not a number."""
    rt = make_runtime(backend="fake", declared_extras=("e",))
    src = safejit.Source("#define V 1\n", "v")
    with pytest.raises(safejit.ConfigError, match="not a finite number"):
        rt.compile(src, **{argument: {"e" if argument == "extras" else "X": value}})
    assert rt.stats()["compiles"] == 0 and rt.stats()["memory_entries"] == 0 and not any(cache_dir.iterdir())


def test_a_closed_runtime_refuses_to_compile_or_build(make_runtime):
    """After close(), compile and build raise LoadError (they went on compiling and filled
    the closed runtime's memory tier again)."""
    rt = make_runtime(backend="fake")
    src = safejit.Source("#define V 1\n", "v")
    rt.compile(src)
    rt.close()
    for call in (
        lambda: rt.compile(src),
        lambda: rt.build(src),
        lambda: rt.compile(safejit.Source("#define W 2\n", "w")),
    ):
        with pytest.raises(safejit.LoadError, match="closed"):
            call()
    assert rt.stats()["memory_entries"] == 0


@pytest.mark.parametrize("argument", ["include_dirs", "flags", "name_expressions"])
def test_a_nested_list_names_its_argument(make_runtime, argument):
    """A list inside a sequence argument was 'the source and arguments must be hashable
    values', naming none of them."""
    rt = make_runtime(backend="fake")
    with pytest.raises(safejit.ConfigError, match=f"compile\\({argument}=") as caught:
        rt.compile(safejit.Source("#define A 1\n", "a"), **{argument: [["x"]]})
    assert caught.value.argument == argument
