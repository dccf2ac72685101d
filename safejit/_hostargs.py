"""What a host kernel's checked call accepts for each C type: the type tables, the
slow converters (for what the fast path of ``_hostcall.py`` lets through: they convert
it or raise the precise error, naming the parameter), and how a declared ctypes type
agrees with the build's. Which value each C type takes is in ``_hostcall.py``'s
docstring."""

from __future__ import annotations

import ctypes
import math
import operator
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple

from .errors import ArgumentTypeError, ArgumentValueError

__all__ = [
    "FLOAT_MAX",
    "INT_RANGES",
    "PROMOTED",
    "SCALAR_CTYPES",
    "TYPESTRS",
    "NoArray",
    "Param",
    "Where",
    "agrees",
    "ctype_name",
    "declared",
    "numpy_fast_path",
    "slow",
]

_ORDER: Final = "<" if sys.byteorder == "little" else ">"
INT_RANGES: Final = {
    f"{k}{n}": ((-(1 << (8 * n - 1)), (1 << (8 * n - 1)) - 1) if k == "i" else (0, (1 << (8 * n)) - 1))
    for k in "iu"
    for n in (1, 2, 4, 8)
}
INT_RANGES.update({"ci1": INT_RANGES["i1"], "cu1": INT_RANGES["u1"]})
FLOAT_MAX: Final = 3.4028234663852886e38
_LD_SIZE: Final = ctypes.sizeof(ctypes.c_longdouble)
_LONG_DOUBLE: Final = f"f{_LD_SIZE}"
SCALAR_CTYPES: Final[dict[str, Any]] = {
    "i1": ctypes.c_int8, "u1": ctypes.c_uint8, "i2": ctypes.c_int16, "u2": ctypes.c_uint16,
    "i4": ctypes.c_int32, "u4": ctypes.c_uint32, "i8": ctypes.c_int64, "u8": ctypes.c_uint64,
    "ci1": ctypes.c_int8, "cu1": ctypes.c_uint8, "b": ctypes.c_bool, "f4": ctypes.c_float,
    "f8": ctypes.c_double, _LONG_DOUBLE: ctypes.c_longdouble,
}  # fmt: skip
#: NumPy's ``typestr`` of each pointee code (the first is the one the fast path knows).
TYPESTRS: Final = {
    **{f"{k}{n}": (f"{'|' if n == 1 else _ORDER}{k}{n}",) for k in "iu" for n in (1, 2, 4, 8)},
    "ci1": ("|i1", "|u1", "|S1"), "cu1": ("|u1", "|i1", "|S1"), "b": ("|b1",),
    **{f"f{n}": (f"{_ORDER}f{n}",) for n in (2, 4, 8, int(_LONG_DOUBLE[1:]))},
}  # fmt: skip
#: The base of every ctypes type (not exported by ``ctypes``).
_CData: Final[type] = ctypes.c_int.__mro__[-2]
#: What C promotes through ``...`` (to int or double): no variadic argument is one.
PROMOTED: Final = frozenset({"f4", "b", "i1", "u1", "ci1", "cu1", "i2", "u2"})
_DTYPE_NAMES: Final = {"i": "int", "u": "uint", "f": "float", "b": "bool", "S": "bytes"}


class Param(NamedTuple):
    position: int
    #: As messages name it: ``'x'``, or ``#2`` when the build recorded no name.
    label: str
    code: str
    spelling: str


class Where(NamedTuple):
    """Which kernel a message is about, and its prototype as messages show it."""

    kernel: str
    shown: str


class NoArray:
    """Stands for ``numpy.ndarray`` until NumPy is imported (no array is one)."""


def numpy_fast_path(ns: dict[str, Any]) -> None:
    """Point the fast path at NumPy's ndarray and dtypes, once NumPy is imported."""
    np = sys.modules.get("numpy")
    if np is None or ns["ND"] is not NoArray:
        return
    ns["ND"] = np.ndarray
    for p in ns["params"]:
        if f"D{p.position}" in ns:
            ns[f"D{p.position}"] = np.dtype(TYPESTRS[p.code.partition(":")[2]][0])


def _bad(where: Where, p: Param, what: str, value: Any, got: str = "") -> ArgumentTypeError:
    shown = repr(value) if isinstance(value, (int, float, str, bytes)) and len(repr(value)) < 40 else ""
    got = got or f"{type(value).__name__}{' ' + shown if shown else ''}"
    return ArgumentTypeError(
        f"{where.shown}: argument {p.label} ({p.spelling}): {what}, got {got}", kernel=where.kernel, param=p.label
    )


def _unusable(where: Where, p: Param, detail: str) -> ArgumentValueError:
    return ArgumentValueError(
        f"{where.shown}: argument {p.label} ({p.spelling}): {detail}", kernel=where.kernel, param=p.label
    )


# -- slow converters -----------------------------------------------------------------------
def slow(where: Where, p: Param, ns: dict[str, Any]) -> Callable[[Any], Any]:
    code = p.code
    if code in INT_RANGES:
        lo, hi = INT_RANGES[code]
        return lambda v: _int(v, lo, hi, where, p)
    if code == "b":
        return lambda v: _bool(v, where, p)
    if code in SCALAR_CTYPES:
        limit = FLOAT_MAX if code == "f4" else None
        return lambda v: _float(v, limit, where, p)
    pointee, const = code.partition(":")[2], code.startswith("pc")
    return lambda v: _pointer(v, pointee, const, where, p, ns)


def _int(v: Any, lo: int, hi: int, where: Where, p: Param) -> int:
    if isinstance(v, ctypes._SimpleCData) and _ctype_code(type(v)) in (p.code, "c"):
        v = v.value
    if isinstance(v, bytes) and p.code in ("ci1", "cu1") and len(v) == 1:
        v = int.from_bytes(v, "little", signed=lo < 0)
    elif isinstance(v, (str, bytes, float)) or not hasattr(type(v), "__index__"):
        raise _bad(where, p, "expected an int", v)
    number = operator.index(v)
    if not lo <= number <= hi:
        raise _unusable(where, p, f"{number} does not fit: {p.spelling} holds {lo} to {hi}")
    return number


def _bool(v: Any, where: Where, p: Param) -> bool:
    if isinstance(v, ctypes.c_bool):
        return bool(v.value)
    if type(v).__name__ in ("bool_", "bool") or (hasattr(type(v), "__index__") and not isinstance(v, (str, bytes))):
        number = int(v) if type(v).__name__ in ("bool_", "bool") else operator.index(v)
        if number in (0, 1):
            return bool(number)
        raise _unusable(where, p, f"{number} is not a bool (True, False, 0 or 1)")
    raise _bad(where, p, "expected a bool", v)


def _float(v: Any, limit: float | None, where: Where, p: Param) -> Any:
    if p.code == _LONG_DOUBLE:  # (a long double's own bits, not a double's 53 of them)
        if isinstance(v, ctypes.c_longdouble):
            return v
        dtype = getattr(v, "dtype", None)  # (NumPy's longdouble: type char 'g', as wide as C's)
        if (
            dtype is not None
            and getattr(dtype, "char", "") == "g"
            and getattr(v, "ndim", None) == 0
            and dtype.itemsize == _LD_SIZE
        ):
            return ctypes.c_longdouble.from_buffer_copy(v.tobytes())
    if isinstance(v, ctypes._SimpleCData) and _ctype_code(type(v)) in ("f4", "f8", _LONG_DOUBLE):
        v = v.value
    if isinstance(v, (str, bytes)) or not (hasattr(type(v), "__float__") or hasattr(type(v), "__index__")):
        raise _bad(where, p, "expected a real number", v)
    if getattr(getattr(v, "dtype", None), "kind", "") == "c":  # (NumPy's complex has __float__: its real part)
        raise _bad(where, p, "expected a real number", v)
    try:
        number = float(v)
    except (OverflowError, TypeError, ValueError) as exc:
        raise _unusable(where, p, f"{v!r:.40} is not a {p.spelling}: {exc}") from None
    if limit is not None and math.isfinite(number) and abs(number) > limit:
        raise _unusable(where, p, f"{number!r} is beyond the range of {p.spelling} (±{limit:.6g})")
    return number


def _pointer(v: Any, pointee: str, const: bool, where: Where, p: Param, ns: dict[str, Any]) -> Any:
    if v is None:
        return None
    if hasattr(v, "__array_interface__") and not isinstance(v, _CData):
        numpy_fast_path(ns)
        return _array_address(v, pointee, const, where, p)
    if isinstance(v, (bytes, bytearray)):
        if pointee not in ("ci1", "cu1", "i1", "u1", "v"):
            raise _bad(where, p, f"expected {_wanted(pointee)}", v)
        if isinstance(v, bytes):
            if not const:
                raise _unusable(where, p, f"bytes are read-only, and {p.spelling} is not const (the kernel may write)")
            return v
        return ctypes.addressof(ctypes.c_char.from_buffer(v)) if v else None
    if isinstance(v, _CData) or type(v).__name__ == "CArgObject":  # (ctypes.byref(x) is no _CData)
        return _ctypes_pointer(v, pointee, const, where, p)
    hint = ""
    if isinstance(v, int):
        hint = " (a raw address: pass ctypes.c_void_p(address))"
    elif isinstance(v, (list, tuple)):
        hint = " (convert it first: numpy.asarray(...))"
    raise _bad(where, p, f"expected {_wanted(pointee)}{hint}", v)


def _array_address(v: Any, pointee: str, const: bool, where: Where, p: Param) -> int:
    iface = v.__array_interface__
    typestr, shape, strides = iface.get("typestr", "?"), tuple(iface.get("shape", ())), iface.get("strides")
    if _holds_objects(v, iface, typestr):
        raise _bad(where, p, f"expected {_wanted(pointee)}", v, got="an array of Python objects (dtype object)")
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 0
    if not _dtype_fits(pointee, typestr, itemsize):
        raise _bad(where, p, f"expected {_wanted(pointee)}", v, got=f"an array of {_dtype_name(typestr)}")
    if strides is not None and not _c_contiguous(shape, strides, itemsize):
        raise _unusable(where, p, "the array is not C-contiguous (a strided view such as x[::2]); "
                            "pass numpy.ascontiguousarray(x)")  # fmt: skip
    address, readonly = iface["data"]
    if readonly and not const:
        raise _unusable(where, p, f"the array is read-only, and {p.spelling} is not const (the kernel may write it)")
    return int(address)


def _holds_objects(v: Any, iface: Mapping[str, Any], typestr: str) -> bool:
    """Whether the array holds Python objects (pointers the kernel would overwrite), as a
    whole or in a field of a structured dtype (nested ones too)."""
    dtype = getattr(v, "dtype", None)
    if dtype is not None and hasattr(dtype, "hasobject"):
        return bool(dtype.hasobject)
    return typestr[1:2] == "O" or _descr_holds_objects(iface.get("descr") or ())


def _descr_holds_objects(descr: Any) -> bool:
    for field in descr:
        kind = field[1] if len(field) > 1 else ""
        if isinstance(kind, list) and _descr_holds_objects(kind):
            return True
        if isinstance(kind, str) and kind[1:2] == "O":
            return True
    return False


def _held(v: Any) -> Iterator[Any]:
    """What a ctypes object keeps alive (``_objects``): the buffers and objects it was made
    of, through casts (each once: a cast's ``_objects`` hold it again)."""
    todo: list[Any] = [getattr(v, "_objects", None)]
    visited: set[int] = set()
    while todo:
        held = todo.pop()
        if id(held) in visited:
            continue
        visited.add(id(held))
        yield held
        if isinstance(held, dict):
            todo.extend(held.values())
        elif isinstance(held, _CData):
            todo.append(getattr(held, "_objects", None))


def _object_buffer(view: memoryview) -> bool:
    dtype = getattr(getattr(view, "obj", None), "dtype", None)
    if dtype is not None and hasattr(dtype, "hasobject"):
        return bool(dtype.hasobject)
    return "O" in re.sub(r":[^:]*:", "", view.format)  # (a structured format names its fields)


def _views_objects(v: Any) -> bool:
    """Whether a ctypes object is a view of an array of Python objects (``from_buffer`` of
    one keeps the buffer it views among its ``_objects``)."""
    return any(isinstance(held, memoryview) and _object_buffer(held) for held in _held(v))


def _writable(v: Any) -> bool:
    """Whether a c_char_p is NULL or points into memory known to be writable (a ctypes
    buffer it was made of, a writable memoryview): one of bytes, or of a bare address, is not."""
    if ctypes.cast(v, ctypes.c_void_p).value is None:
        return True
    return any(
        (isinstance(held, ctypes.Array) and not isinstance(held, bytes))
        or (isinstance(held, memoryview) and not held.readonly)
        for held in _held(v)
    )


def _ctypes_pointer(v: Any, pointee: str, const: bool, where: Where, p: Param) -> Any:
    if isinstance(v, ctypes.c_void_p):
        return v  # an explicit address: the caller vouches for it
    if _views_objects(v):
        raise _bad(where, p, f"expected {_wanted(pointee)}", v, got="a view of an array of Python objects")
    if isinstance(v, ctypes.c_char_p) and pointee in ("ci1", "cu1", "v"):
        if not const and not _writable(v):  # (bytes, or a bare address: read-only as far as anyone knows)
            raise _unusable(
                where,
                p,
                f"a c_char_p's bytes are read-only, and {p.spelling} is not const "
                "(pass a ctypes buffer, or ctypes.c_void_p(address) to vouch for one)",
            )
        return v
    target = type(v)
    if isinstance(v, (ctypes.Array, ctypes._Pointer)):
        target = v._type_
    elif type(v).__name__ == "CArgObject":  # ctypes.byref(x)
        target = type(v._obj)
    if _points_to(pointee, target):
        if isinstance(v, (ctypes.Array, ctypes._Pointer)) or type(v).__name__ == "CArgObject":
            return v
        return ctypes.byref(v)
    raise _bad(where, p, f"expected {_wanted(pointee)}", v, got=f"ctypes {ctype_name(target)}")


# -- types ------------------------------------------------------------------------------------
def _dtype_fits(pointee: str, typestr: str, itemsize: int) -> bool:
    if pointee == "v":
        return True
    if pointee == "p":
        return typestr[1] in "iu" and itemsize == ctypes.sizeof(ctypes.c_void_p)
    if pointee.startswith("s"):
        size = int(pointee[1:])
        return size in (0, itemsize)
    return typestr in TYPESTRS.get(pointee, ())


def _c_contiguous(shape: tuple[int, ...], strides: Sequence[int], itemsize: int) -> bool:
    if any(n == 0 for n in shape):
        return True
    expect = itemsize
    for n, stride in zip(reversed(shape), reversed(tuple(strides)), strict=True):
        if n != 1 and stride != expect:
            return False
        expect *= n
    return True


def _dtype_name(typestr: str) -> str:
    kind, size = typestr[1:2], typestr[2:]
    if kind == "S":
        return f"dtype bytes{size}"
    bits = int(size) * 8 if size.isdigit() else 0
    return f"dtype {_DTYPE_NAMES.get(kind, typestr)}{bits if kind != 'b' else ''}"


def _wanted(pointee: str) -> str:
    if pointee == "v":
        return "an array (any dtype), a ctypes pointer or None"
    if pointee == "p":
        return "an array of pointers (uint64), a ctypes pointer array or None"
    if pointee.startswith("s"):
        size = int(pointee[1:])
        return f"an array of {size}-byte items, a ctypes structure or pointer, or None" if size else (
            "an array, a ctypes structure or pointer, or None")  # fmt: skip
    names = " or ".join(_dtype_name(t) for t in TYPESTRS.get(pointee, ()))
    return f"a C-contiguous NumPy array of {names}, a ctypes array or pointer of it, or None"


def _ctype_code(t: Any) -> str | None:
    """The code of a ctypes type (``p`` any pointer type), or None."""
    letter = getattr(t, "_type_", None)
    if not isinstance(letter, str):
        return "p" if isinstance(t, type) and issubclass(t, ctypes._Pointer) else None
    size = ctypes.sizeof(t)
    if letter in "bhilq":
        return f"i{size}"
    if letter in "BHILQ":
        return f"u{size}"
    return {"c": "c", "?": "b", "f": "f4", "d": "f8", "g": f"f{size}", "P": "p", "z": "p", "Z": "p"}.get(letter)


def _points_to(pointee: str, target: Any) -> bool:
    """Whether a ctypes object of type ``target`` may stand where ``pointee`` is pointed to."""
    if pointee == "v":
        return True
    if pointee.startswith("s"):
        size = int(pointee[1:])
        return issubclass(target, (ctypes.Structure, ctypes.Union, ctypes.Array)) and size in (0, ctypes.sizeof(target))
    code = _ctype_code(target)
    if pointee == "p":
        return code == "p"
    return code == pointee or (code == "c" and pointee in ("ci1", "cu1")) or (
        pointee in ("ci1", "cu1") and code in ("i1", "u1"))  # fmt: skip


def agrees(code: str, t: Any, *, ret: bool = False) -> bool:
    """Whether a declared ctypes type ``t`` agrees with the build's type ``code``."""
    if t is None:
        return ret and code == "v"
    own = _ctype_code(t)
    if code in SCALAR_CTYPES:
        char = code in ("ci1", "cu1")
        return own == code or (char and own in ("c", "i1", "u1"))
    if not code.startswith("p"):
        return False
    pointee = code.partition(":")[2]
    if t is ctypes.c_void_p:
        return True
    if t is ctypes.c_char_p:
        return pointee in ("ci1", "cu1")
    dtype = getattr(t, "_dtype_", None)  # numpy.ctypeslib.ndpointer(...)
    if dtype is not None:
        return pointee == "v" or _dtype_fits(pointee, dtype.str, dtype.itemsize)
    return isinstance(t, type) and issubclass(t, ctypes._Pointer) and _points_to(pointee, t._type_)


def declared(t: Any) -> tuple[str, str]:
    """``(code, spelling)`` of a position the caller declared with the ctypes type ``t``:
    checked as that type (a pointer's constness unknown: read-only arrays pass);
    ``?`` for a type only ctypes converts."""
    code = _ctype_code(t)
    if code in SCALAR_CTYPES:
        return code, ctype_name(t)
    if code == "c":
        return "ci1", "c_char"
    if t is ctypes.c_void_p:
        return "pc:v", "c_void_p"
    if t is ctypes.c_char_p:
        return "pc:ci1", "c_char_p"
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        inner = _ctype_code(t._type_)
        if inner in TYPESTRS:
            return f"pc:{inner}", ctype_name(t)
    return "?", ctype_name(t)


def ctype_name(t: Any) -> str:
    return "None" if t is None else getattr(t, "__name__", repr(t))
