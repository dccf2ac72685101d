"""build_key covers every BuildSpec field except those NOT_IN_KEY names (with a reason)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from safejit.keys import build_key, digest_bytes
from safejit.spec import NOT_IN_KEY, TOOLCHAIN_NOT_IN_KEY, BuildSpec, Toolchain

from .strategies import FIELD_STRATEGIES, TOOLCHAIN_FIELD_STRATEGIES, build_specs, different_value

ALL_FIELDS = tuple(f.name for f in dataclasses.fields(BuildSpec))
KEYED_FIELDS = tuple(name for name in ALL_FIELDS if name not in NOT_IN_KEY)
UNKEYED_FIELDS = tuple(name for name in ALL_FIELDS if name in NOT_IN_KEY)
TOOLCHAIN_FIELDS = tuple(f.name for f in dataclasses.fields(Toolchain) if f.name not in TOOLCHAIN_NOT_IN_KEY)
#: The exclusions this suite has reviewed. Excluding a field from the key is a
#: cache-correctness decision: a new entry must come with a test of its reason.
REVIEWED_EXCLUSIONS = {"code"}


def test_every_field_is_either_keyed_or_excluded_with_a_strategy() -> None:
    # No field is silently skipped: the parametrized tests below run over
    # exactly the dataclass fields, and every field has a strategy to mutate it.
    assert set(KEYED_FIELDS) | set(UNKEYED_FIELDS) == set(ALL_FIELDS)
    assert not set(KEYED_FIELDS) & set(UNKEYED_FIELDS)
    assert set(FIELD_STRATEGIES) == set(ALL_FIELDS), "a BuildSpec field has no strategy in strategies.py"
    assert set(TOOLCHAIN_FIELD_STRATEGIES) == {f.name for f in dataclasses.fields(Toolchain)}, (
        "a Toolchain field has no strategy"
    )
    assert set(TOOLCHAIN_NOT_IN_KEY) == {"prefix", "spelled_dirs"}, (
        "TOOLCHAIN_NOT_IN_KEY changed: review it and test its reason"
    )
    assert KEYED_FIELDS, "build_key would hash nothing"


def test_not_in_key_names_real_fields_with_reasons() -> None:
    for name, reason in NOT_IN_KEY.items():
        assert name in ALL_FIELDS, f"NOT_IN_KEY names {name!r}, which is not a BuildSpec field"
        assert isinstance(reason, str)
        assert reason.strip(), f"NOT_IN_KEY[{name!r}] gives no reason"
    assert set(NOT_IN_KEY) == REVIEWED_EXCLUSIONS, "NOT_IN_KEY changed: review the exclusion and test its reason here"


@given(spec=build_specs(), data=st.data())
def test_mutating_any_keyed_field_changes_the_key(spec: BuildSpec, data: st.DataObject) -> None:
    # Every keyed field, one at a time, against the same spec: a field the key
    # forgot would leave the key unchanged for that field's mutation.
    key = build_key(spec)
    for field in KEYED_FIELDS:
        value = data.draw(different_value(spec, field), label=f"new {field}")
        mutated = dataclasses.replace(spec, **{field: value})
        assert getattr(mutated, field) != getattr(spec, field)
        assert build_key(mutated) != key, f"changing BuildSpec.{field} did not change build_key"


@given(spec=build_specs(), data=st.data())
def test_mutating_any_toolchain_field_changes_the_key(spec: BuildSpec, data: st.DataObject) -> None:
    # The toolchain is keyed as a whole value: each of its own fields counts.
    key = build_key(spec)
    for field in TOOLCHAIN_FIELDS:
        value = data.draw(different_value(spec.toolchain, field), label=f"new toolchain.{field}")
        toolchain = dataclasses.replace(spec.toolchain, **{field: value})
        assert build_key(dataclasses.replace(spec, toolchain=toolchain)) != key, (
            f"changing Toolchain.{field} did not change build_key"
        )


@pytest.mark.parametrize("field", UNKEYED_FIELDS)
@given(data=st.data())
def test_mutating_an_unkeyed_field_alone_keeps_the_key(field: str, data: st.DataObject) -> None:
    spec = data.draw(build_specs(), label="spec")
    value = data.draw(different_value(spec, field), label=f"new {field}")
    mutated = dataclasses.replace(spec, **{field: value})
    assert build_key(mutated) == build_key(spec)


@given(spec=build_specs(), data=st.data())
def test_code_is_represented_by_source_digest(spec: BuildSpec, data: st.DataObject) -> None:
    # The reason NOT_IN_KEY gives for "code": a coherent change of the code
    # (code and its digest together) changes the key; the code alone does not.
    assert "code" in NOT_IN_KEY
    new_code = data.draw(different_value(spec, "code"), label="new code")
    code_only = dataclasses.replace(spec, code=new_code)
    coherent = dataclasses.replace(spec, code=new_code, source_digest=digest_bytes(new_code))
    assert build_key(code_only) == build_key(spec)
    assert build_key(coherent) != build_key(spec)


@given(spec=build_specs())
def test_key_is_a_256_bit_hex_digest_of_the_value(spec: BuildSpec) -> None:
    key = build_key(spec)
    assert len(key) == 64
    assert set(key) <= set("0123456789abcdef")
    assert build_key(dataclasses.replace(spec)) == key


@given(spec=build_specs(), prefix=st.sampled_from(["/opt/a", "/opt/b/c", "/srv/toolchains/x"]))
def test_the_same_toolchain_installed_elsewhere_keys_the_same(spec: BuildSpec, prefix: str) -> None:
    """TOOLCHAIN_NOT_IN_KEY's reason: a toolchain moved (with every path under its install
    prefix) to another prefix keys the same — nodes share entries (DESIGN.md §4) — while
    the binaries' digests still tell toolchains apart."""
    home = "/usr/local/tc"

    def moved(to: str) -> BuildSpec:
        def at(path: str) -> str:
            return to + path[len(home) :] if path.startswith(home) else path

        tc = dataclasses.replace(
            spec.toolchain,
            compiler=at(f"{home}/bin/cc"),
            prefix=to,
            roots=tuple(at(f"{home}{r}") for r in spec.toolchain.roots),
            search_dirs=tuple(at(f"{home}{r}") for r in spec.toolchain.search_dirs),
        )
        return dataclasses.replace(spec, toolchain=tc, argv=(at(f"{home}/bin/cc"), *spec.argv[1:]))

    assert build_key(moved(home)) == build_key(moved(prefix))
    other = dataclasses.replace(moved(prefix), toolchain=dataclasses.replace(moved(prefix).toolchain, digest="0" * 64))
    assert build_key(other) != build_key(moved(home))


@given(spec=build_specs(), skipped=st.lists(st.sampled_from(["/usr/local/include/x", "/include", "/opt/i"])))
def test_the_dirs_a_compiler_skips_do_not_enter_the_key(spec: BuildSpec, skipped: list[str]) -> None:
    """TOOLCHAIN_NOT_IN_KEY's reason: which dirs a compiler skips as not there is a fact of
    the probe (redone when one appears), not of what it builds: entries stay shared."""
    tc = dataclasses.replace(spec.toolchain, spelled_dirs=tuple(skipped))
    assert build_key(dataclasses.replace(spec, toolchain=tc)) == build_key(spec)
