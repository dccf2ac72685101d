"""Equal specs give equal keys in any process, whatever its hash seed; deps_key ignores order."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import tempfile

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from safejit.keys import KEY_SCHEMA, build_key, deps_encoding, deps_key, digest_bytes
from safejit.spec import BuildSpec

from .strategies import build_specs, dep_tuples

STABLE_DEPS_KEY = "cd89c7d1a39e4f54495420f9906a63edfb3e0ac191f85c4f72021616b90ec72e"  # KEY_SCHEMA 4

SEEDS = ("0", "12345")

_CHILD = """
import json, pickle, sys
from safejit.keys import build_key
from safejit.spec import BuildSpec, LoadBaseline, Toolchain
with open(sys.argv[1], "rb") as fh:
    pickled, reprs = pickle.load(fh)
rebuilt = [eval(r, {"BuildSpec": BuildSpec, "Toolchain": Toolchain, "LoadBaseline": LoadBaseline}) for r in reprs]
print(json.dumps({
    "str_hash": hash("safejit.build_key"),
    "from_pickle": [build_key(s) for s in pickled],
    "from_repr": [build_key(s) for s in rebuilt],
    "repr_equal": [a == b for a, b in zip(pickled, rebuilt)],
}))
"""


def _keys_in_child(path: str, seed: str) -> dict:
    # A minimal environment: the seed under test and the import path of this
    # interpreter, nothing inherited that could make the child differ.
    env = {"PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, path], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _collect_specs() -> list[BuildSpec]:
    """Specs drawn by hypothesis (the profile's max_examples of them), gathered
    so that all of them go to one child process per seed."""
    specs: list[BuildSpec] = []

    @given(spec=build_specs())
    def collect(spec: BuildSpec) -> None:
        specs.append(spec)

    collect()
    return specs


def test_keys_agree_across_processes_and_hash_seeds() -> None:
    specs = _collect_specs()
    assert len(specs) >= 10
    here = [build_key(s) for s in specs]
    with tempfile.TemporaryDirectory(prefix="safejit-keys-") as tmp:
        path = os.path.join(tmp, "specs.pickle")
        with open(path, "wb") as fh:
            pickle.dump((specs, [repr(s) for s in specs]), fh)
        results = {seed: _keys_in_child(path, seed) for seed in SEEDS}

    # The children really ran under different string-hash seeds.
    assert results[SEEDS[0]]["str_hash"] != results[SEEDS[1]]["str_hash"]
    for seed, got in results.items():
        for i, spec in enumerate(specs):
            assert got["repr_equal"][i], f"repr did not round-trip {spec!r}"
            assert got["from_pickle"][i] == here[i], f"PYTHONHASHSEED={seed} keyed the pickled {spec!r} differently"
            assert got["from_repr"][i] == here[i], f"PYTHONHASHSEED={seed} keyed {spec!r} rebuilt from repr differently"

    # Equal keys only for equal keyed content: distinct specs do not collide.
    by_key: dict[str, BuildSpec] = {}
    for spec, key in zip(specs, here, strict=True):
        other = by_key.setdefault(key, spec)
        # (what is not in the key: the code, by its digest; the dirs the compiler skips)
        unkeyed = dataclasses.replace(other.toolchain, spelled_dirs=spec.toolchain.spelled_dirs)
        assert dataclasses.replace(other, code=spec.code, toolchain=unkeyed) == spec, "two specs share a build key"


@given(
    deps=st.lists(dep_tuples, unique=True, max_size=8),
    negatives=st.lists(st.tuples(st.sampled_from(["s0", "s1"]), st.sampled_from(["a.h", "b/c.h", "d.h"])), unique=True),
    data=st.data(),
)
def test_deps_key_is_independent_of_input_order(
    deps: list[tuple[str, str, str]], negatives: list[tuple[str, str]], data: st.DataObject
) -> None:
    key = deps_key(deps, negatives)
    shuffled = data.draw(st.permutations(deps), label="deps order")
    shuffled_neg = data.draw(st.permutations(negatives), label="negatives order")
    assert deps_key(shuffled, shuffled_neg) == key
    assert deps_key(tuple(reversed(deps)), iter(negatives)) == key
    if deps:
        # Order does not matter, but content does: dropping a dependency changes the key.
        assert deps_key(shuffled[1:], negatives) != key


_any_text = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=10)


@given(
    deps=st.lists(st.tuples(_any_text, _any_text, _any_text), max_size=6),
    negatives=st.lists(st.tuples(_any_text, _any_text), max_size=4),
    data=st.data(),
)
def test_deps_key_is_the_canonical_encoding_of_the_sorted_closure(
    deps: list[tuple[str, str, str]], negatives: list[tuple[str, str]], data: st.DataObject
) -> None:
    # The hashed bytes decode back to exactly the sorted rows (so no two closures
    # encode alike: ("ab", "c") and ("a", "bc") stay apart), in any order given.
    encoded = deps_encoding(deps, negatives)
    assert msgspec.msgpack.decode(encoded, type=tuple[str, int, list[tuple[str, str, str]], list[tuple[str, str]]]) == (
        "safejit.deps_key",
        KEY_SCHEMA,
        sorted(deps),
        sorted(negatives),
    )
    want = digest_bytes(encoded)
    assert deps_key(deps, negatives) == want
    assert deps_key(data.draw(st.permutations(deps)), data.draw(st.permutations(negatives))) == want


def test_deps_key_is_stable() -> None:
    # Leaf names are shared between nodes and versions: a change of the encoding (say,
    # a MessagePack library choosing other widths) must come with a new KEY_SCHEMA.
    rows = [("{root:a}", "x" * 40, "d" * 64), ("{root:a}", "é/ü.h", "0" * 64)] + [
        ("{t}", f"h{i}.h", "1" * 64) for i in range(300)
    ]
    assert deps_key(rows, [("{root:a}", "y.h")]) == STABLE_DEPS_KEY
