"""The Ascend argument packer lays arguments out like a ctypes.Structure whose
fields are each aligned to max(alignof, 4), with the total rounded up to 8."""

from __future__ import annotations

import ctypes

from hypothesis import given
from hypothesis import strategies as st

from safejit.backends.ascend.launch import pack_arguments, slot_layout

TYPES = [
    ctypes.c_bool,
    ctypes.c_int8,
    ctypes.c_uint8,
    ctypes.c_int16,
    ctypes.c_uint16,
    ctypes.c_int32,
    ctypes.c_uint32,
    ctypes.c_int64,
    ctypes.c_uint64,
    ctypes.c_float,
    ctypes.c_double,
    ctypes.c_void_p,
]


def _reference(types):
    """A ctypes.Structure of one-field unions widened to at least 4-byte alignment."""
    fields = []
    for i, t in enumerate(types):
        slot = type(f"Slot{i}", (ctypes.Union,), {"_fields_": [("v", t), ("_align4", ctypes.c_uint32)]})
        fields.append((f"f{i}", slot))
    struct = type("Args", (ctypes.Structure,), {"_fields_": fields})
    offsets = [getattr(struct, f"f{i}").offset for i in range(len(types))]
    return struct, offsets, (ctypes.sizeof(struct) + 7) // 8 * 8


@given(st.lists(st.sampled_from(TYPES), min_size=0, max_size=24))
def test_offsets_and_total_match_the_ctypes_reference(types):
    offsets, total = slot_layout(types)
    _, ref_offsets, ref_total = _reference(types)
    assert offsets == ref_offsets
    assert total == ref_total and total % 8 == 0


def _value(t, draw):
    if t is ctypes.c_bool:
        return draw(st.booleans())
    if t in (ctypes.c_float, ctypes.c_double):
        return draw(st.floats(allow_nan=False, width=32 if t is ctypes.c_float else 64))
    bits = ctypes.sizeof(t) * 8
    signed = t in (ctypes.c_int8, ctypes.c_int16, ctypes.c_int32, ctypes.c_int64)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return draw(st.integers(lo, hi))


@given(st.data())
def test_packed_bytes_match_the_ctypes_reference(data):
    types = data.draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=16))
    values = [_value(t, data.draw) for t in types]
    struct, offsets, total = _reference(types)
    ref = struct()
    for i, (t, v) in enumerate(zip(types, values, strict=True)):
        getattr(ref, f"f{i}").v = v if t is not ctypes.c_void_p else ctypes.c_void_p(v).value
    expected = bytes(ref) + b"\0" * (total - ctypes.sizeof(struct))
    packed = pack_arguments(types, values)
    assert len(packed) == total
    for t, off in zip(types, offsets, strict=True):  # compare the value bytes (padding is unspecified in ctypes)
        n = ctypes.sizeof(t)
        assert packed[off : off + n] == expected[off : off + n]
