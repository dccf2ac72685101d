"""Every parser of untrusted bytes (manifest, depfile, the ELF reader's every entry
point: symbol tables, sections, program headers, the dynamic table, relocations,
cubin info, Ascend meta sections, the load-time analysis, the DWARF reader of host
prototypes) either parses or raises
its typed error — never anything else, never a hang. Random bytes, and mutations
of real inputs (a shared object, a cubin, small ELF files of each class and byte
order)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import safejit
from safejit.backends import _elf, _load_time, _prototypes
from safejit.backends._dwarf import DwarfError
from safejit.backends._signatures import host_products
from safejit.backends.ascend.backend import ascend_kernel_names
from safejit.backends.cuda.cubin import cubin_frame_sizes, cubin_kernels
from safejit.backends.host import elf_exported_functions
from safejit.cache.leaf import BackendMeta, ManifestError, decode_manifest, signed_bytes
from safejit.closure.depfiles import _prerequisites, _split_words, parse_depfile, parse_single_rule
from safejit.errors import LoadError
from safejit.spec import LoadBaseline
from tests._elf_build import STB_GLOBAL, STT_FUNC, tiny_elf

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _Inputs(dict[str, bytes]):
    def __repr__(self) -> str:  # (hypothesis prints the arguments of each example)
        return f"<real inputs: {', '.join(f'{k} {len(v)} bytes' for k, v in self.items())}>"


@pytest.fixture(scope="module")
def real_inputs(tmp_path_factory) -> dict[str, bytes]:
    cache = tmp_path_factory.mktemp("fuzz-cache")
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache),)))
    art = rt.build(safejit.Source("#include <stdint.h>\nint add(int a, int b) { return a + b; }\n", "add"))
    rt.close()
    leaf = Path(art.path)
    inputs = _Inputs(manifest=(leaf / "manifest.json").read_bytes(), elf=(leaf / "artifact.so").read_bytes())
    symbols = [("f", STB_GLOBAL << 4 | STT_FUNC, 1), ("g", STB_GLOBAL << 4 | STT_FUNC, 1)]
    for c in (32, 64):
        for o in ("le", "be"):
            inputs[f"tiny{c}{o}"] = tiny_elf(is64=c == 64, little=o == "le", symbols=symbols)
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return inputs
    _, prog = nvrtc.nvrtcCreateProgram(b'extern "C" __global__ void k(float* x, int n) { x[n] = n; }', b"k", 0, [], [])
    nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90"])
    _, size = nvrtc.nvrtcGetCUBINSize(prog)
    inputs["cubin"] = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, inputs["cubin"])
    nvrtc.nvrtcDestroyProgram(prog)
    return inputs


#: What ``baseline_of`` reads from gcc 12's empty link on x86-64.
_BASELINE = LoadBaseline(
    elf_class=2,
    byte_order=1,
    machine=62,
    init=23,
    fini=9,
    init_array=1,
    fini_array=1,
    ctors=0,
    dtors=0,
    startup_refs=("_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__cxa_finalize", "__gmon_start__"),
)


def _mutate(data: bytes, flips: list[tuple[int, int]], cut: int) -> bytes:
    buf = bytearray(data[: max(1, len(data) - cut)])
    for pos, value in flips:
        buf[pos % len(buf)] = value
    return bytes(buf)


MUTATIONS = st.tuples(
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=12), st.integers(0, 4096)
)


def _manifest_ok(raw: bytes) -> None:
    try:
        decode_manifest(raw)
    except ManifestError:
        pass


def _elf_ok(raw: bytes) -> None:
    for fn in (elf_exported_functions, cubin_kernels, ascend_kernel_names, host_products):
        try:
            fn(raw)
        except LoadError:
            pass
    assert isinstance(cubin_frame_sizes(raw), dict)
    for reading in (
        _elf.dynsym_functions, _elf.section_names, _load_time.baseline_of, _load_time_ok, _walk, _prototypes_ok
    ):  # fmt: skip
        try:
            reading(raw)
        except _elf.ElfError:
            pass


def _prototypes_ok(raw: bytes) -> None:
    """The DWARF reader: prototypes or DwarfError, for the names the file exports and a few more."""
    try:
        names = set(_elf.dynsym_functions(raw)) | {"add", "f", "g"}
    except _elf.ElfError:
        names = {"add", "f", "g"}
    try:
        found = _prototypes.prototypes(raw, names)
    except DwarfError:
        return
    assert set(found) <= names
    for p in found.values():
        assert all(isinstance(code, str) and code for _, code, _ in p.params)


def _load_time_ok(raw: bytes) -> None:
    assert all(isinstance(r, str) and r for r in _load_time.load_time_code(raw, _BASELINE))


def _walk(raw: bytes) -> None:
    """Every reading the Elf object offers, each on its own."""
    elf = _elf.Elf(raw)
    for step in (elf.sections, elf.segments, elf.dynamic):
        try:
            step()
        except _elf.ElfError:
            pass
    for section in elf.sections():
        try:
            assert all(isinstance(v, bytes) for _, v in _elf.eiattr_records(elf.section_data(section)))
            if section.type in (_elf.SHT_SYMTAB, _elf.SHT_DYNSYM):
                elf.symbols(section)
        except _elf.ElfError:
            pass


@FUZZ
@given(st.binary(max_size=4096))
def test_manifest_parser_on_random_bytes(raw):
    _manifest_ok(raw)


@FUZZ
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=70),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=6),
        max_leaves=30,
    )
)
def test_manifest_parser_on_random_json(value):
    _manifest_ok(json.dumps(value).encode())


@FUZZ
@given(MUTATIONS)
def test_manifest_parser_on_mutated_manifests(real_inputs, mutation):
    _manifest_ok(_mutate(real_inputs["manifest"], *mutation))


@FUZZ
@given(st.text(max_size=2000))
def test_depfile_parser_on_random_text(text):
    assert all(isinstance(p, str) and p for p in parse_depfile(text))


@FUZZ
@given(st.text(max_size=2000))
def test_single_rule_parser_on_random_text(text):
    """The assembler's depfile parser: one clean rule, or ValueError — never a partial list."""
    try:
        listed = parse_single_rule(text)
    except ValueError:
        return
    assert not any(c < " " and c not in "\t" for c in text.replace("\\\n", "").replace("\n", ""))
    assert listed == parse_depfile(text)


def test_depfile_lines_end_at_newlines_only():
    # str.splitlines would also end a line at each of these; a name may hold them.
    for sep in "\f\v\x1c\x1d\x1e\x85\u2028":
        assert parse_depfile(f"out.o: /a/x{sep}y /b/c\n") == [f"/a/x{sep}y", "/b/c"]
    assert parse_depfile("out.o: /a /b\r\nother.o: /c\r\n") == ["/a", "/b", "/c"]
    assert parse_single_rule("t.o: /a \\\n /b\n") == ["/a", "/b"]
    for bad in ("t.o: /a\n/b\n", "t.o: /a\x1c/b\n", "t.o: /a\nu.o: /b\n", "/a /b\n", ""):
        with pytest.raises(ValueError):
            parse_single_rule(bad)


_DEP_CHARS = st.sampled_from(list("ab:. \t/-_x\\$#\n"))


@FUZZ
@given(st.lists(_DEP_CHARS, max_size=120).map("".join))
def test_depfile_fast_split_agrees_with_the_escaping_parser(line):
    """Lines with nothing escaped take a plain split; it must say what the full parser says."""
    words = _split_words(line)
    slow = next(([w for w, _ in words[i + 1 :] if w] for i, (_, colon) in enumerate(words) if colon), [])
    if "\\" not in line and "$" not in line and "\n" not in line:
        assert _prerequisites(line) == slow
    assert all(p for p in _prerequisites(line.split("\n")[0]))


@FUZZ
@given(st.binary(max_size=8192))
def test_elf_readers_on_random_bytes(raw):
    _elf_ok(raw)
    _elf_ok(b"\x7fELF\x02\x01\x01" + raw)


@FUZZ
@given(MUTATIONS, st.sampled_from(["elf", "tiny32le", "tiny32be", "tiny64le", "tiny64be", "cubin"]))
def test_elf_readers_on_mutated_elf_files(real_inputs, mutation, which):
    if which in real_inputs:
        _elf_ok(_mutate(real_inputs[which], *mutation))


#: Flips where the tables' offsets, sizes and counts are: the ELF header, the program
#: headers after it, and (as a fraction of the file) the section headers at its end.
HEADER_MUTATIONS = st.lists(st.tuples(st.integers(0, 0x1FF) | st.floats(0.9, 1.0), st.integers(0, 255)), max_size=8)


@FUZZ
@given(HEADER_MUTATIONS, st.sampled_from(["elf", "tiny32le", "tiny64be", "cubin"]))
def test_elf_readers_on_files_with_mutated_headers(real_inputs, flips, which):
    if which not in real_inputs:
        return
    buf = bytearray(real_inputs[which])
    for pos, value in flips:
        buf[(pos if isinstance(pos, int) else int(pos * (len(buf) - 1))) % len(buf)] = value
    _elf_ok(bytes(buf))


@FUZZ
@given(
    st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=12),
    st.sampled_from([".debug_info", ".debug_abbrev", ".debug_str", ".debug_line_str"]),
)
def test_dwarf_reader_on_mutated_debug_sections(real_inputs, flips, section):
    """Flips inside one debug section of a real artifact (whose DWARF describes ``add``):
    units, abbreviations, forms, references, strings."""
    buf = bytearray(real_inputs["elf"])
    found = _elf.Elf(bytes(buf)).section(section)
    assert found is not None and found.size
    for where, value in flips:
        buf[found.offset + int(where * (found.size - 1))] = value
    _prototypes_ok(bytes(buf))


def test_elf_with_an_absurd_section_header_offset_is_a_load_error():
    """Found by fuzz/fuzz_parsers.py: an e_shoff beyond ssize_t overflowed struct.unpack_from."""
    crash = bytes.fromhex("7f454c46020101") + bytes(33) + b"\xff" * 8 + bytes(10) + b"\x40\x00\x05\x00\x01\x00"
    _elf_ok(crash)


def test_a_leaf_written_before_host_signatures_decodes_and_its_signature_stands(real_inputs):
    """Without the field it decodes, and re-encodes to the bytes it was signed over."""
    data = json.loads(real_inputs["manifest"])
    assert data["meta"]["signatures"]["add"][1] == [["a", "i4", "int"], ["b", "i4", "int"]]
    del data["meta"]["signatures"]
    old = json.dumps(data, separators=(",", ":")).encode()
    decoded = decode_manifest(old)
    assert decoded.meta.signatures is msgspec.UNSET
    # (the meta as every leaf before the field encoded it: what its signature covers)
    assert b'"meta":{"params":{},"symbols":{}}' in signed_bytes(decoded)


@pytest.mark.parametrize("key", ["signature", "meta", "negatives", "toolchain", "created", "deps", "artifact"])
def test_a_manifest_without_a_field_is_a_manifest_error(real_inputs, key):
    # (found by the mutation fuzzer: a manifest without "signature" raised KeyError)
    data = json.loads(real_inputs["manifest"])
    del data[key]
    if key in ("meta", "signature"):  # optional: an unsigned leaf; one with no backend metadata
        decoded = decode_manifest(json.dumps(data).encode())
        assert decoded.signature is None if key == "signature" else decoded.meta == BackendMeta()
        return
    with pytest.raises(ManifestError):
        decode_manifest(json.dumps(data).encode())


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("created", 1e400),
        ("deps", [[["a"] * 3]] * 2),
        ("kernels", [[[[[[[[[[[[["deep"]]]]]]]]]]]]]),
        ("toolchain", {"compiler": 10**400}),
        ("timings", {"compile_s": float("nan")}),
        ("artifact", {"file": "../../etc/passwd", "size": 1, "digest": "0" * 64}),
        ("artifact", {"file": "artifact.so", "size": 2**70, "digest": "0" * 64}),
        ("artifact", {"file": "artifact.so", "size": -1, "digest": "0" * 64}),
        ("unknown", 1),
        ("meta", {"params": {"k": [[1, 2, 3]]}}),
        ("meta", {"signatures": {"add": [["i4; x", "int"], [], False]}}),
        ("meta", {"signatures": {"add": [["i4", "int"], [["a", "?", "int"]], False]}}),
        ("meta", {"signatures": {"add": [["i4", "int"], [["a", "i4", "int", "extra"]], False]}}),
        ("signature", "0" * 64),
    ],
)
def test_a_manifest_with_hostile_values_is_a_manifest_error(real_inputs, key, value):
    """Manifests in a shared cache are written by others: huge numbers, deep nesting,
    wrong types, unknown fields are refused by the schema, never let through."""
    data = json.loads(real_inputs["manifest"])
    data[key] = value
    raw = json.dumps(data).replace("NaN", "NaN").encode()
    with pytest.raises(ManifestError):
        decode_manifest(raw)


def test_a_deeply_nested_manifest_is_a_manifest_error():
    with pytest.raises(ManifestError):
        decode_manifest(b'{"meta":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
