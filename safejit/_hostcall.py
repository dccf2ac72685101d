"""Checked calls of host kernels: each argument is checked against the C prototype
the build recorded (``backends/_prototypes.py``) and converted, before the kernel runs.

What a parameter accepts (anything else raises :class:`~safejit.errors.ArgumentTypeError`,
or :class:`~safejit.errors.ArgumentValueError` for a right kind of value it cannot
pass, naming the parameter):

- an integer (``int8_t`` … ``uint64_t``, ``long``, ``size_t``, enums): an ``int`` (or
  anything with ``__index__``: NumPy integers) in the C type's range; a plain
  ``char`` also a 1-byte ``bytes``;
- ``float``/``double``/``long double``: a real number (``int``, ``float``, NumPy
  floats; a ``float`` beyond its range is refused, inf and nan are not);
- ``bool``/``_Bool``: ``True``/``False``, 0 or 1;
- ``T *``: a C-contiguous NumPy array (anything with ``__array_interface__``) whose
  dtype is ``T``'s (``double *`` ↔ float64, ``float *`` ↔ float32, ``int *`` ↔ int32,
  ``uint8_t *`` ↔ uint8, a plain ``char *`` int8 or uint8; ``void *`` any dtype; a
  struct pointer an itemsize of the struct's), writable unless ``T`` is const;
  ``None`` (NULL); a ctypes array, pointer, ``byref()`` or instance of ``T``; a
  ``ctypes.c_void_p`` (an explicit address, unchecked); ``bytes`` for a ``const``
  1-byte pointee, ``bytearray`` for any 1-byte one. Never a bare ``int``;
- every scalar also takes a ctypes instance of its own C type.

The return value is ``None`` (void), an ``int``, ``bool`` or ``float``, ``bytes`` for
a plain ``char``, an address ``int`` (or ``None``) for a pointer.

A parameter the prototype does not let a call check — a struct passed by value, a
function pointer, a reference, ``__int128``, a K&R definition's promoted parameter —
or ``...`` makes the kernel refuse every call unless ``argtypes=`` declares it; the
declaration is then what that position is passed as (unchecked beyond ctypes' own
conversion). A kernel the debug info does not describe is refused unless
``argtypes=`` and ``restype=`` declare it; it is then checked against that
declaration. A declaration given for a kernel the build describes must agree with it.

The call itself is a function generated once per kernel from fixed templates (no
text of the build or the caller enters it): per argument an exact-class test and a
range test, the slow converters only for what those let through.
"""

from __future__ import annotations

import ctypes
import math
import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

from .errors import ArgumentTypeError, ArgumentValueError

__all__ = ["UNSET", "Param", "Prepared", "prepare"]

#: ``Module.kernel``'s ``restype`` default: the build's return type.
UNSET: Final[Any] = type("_Unset", (), {"__repr__": lambda self: "<the build's>"})()

_ORDER: Final = "<" if sys.byteorder == "little" else ">"
_INT_RANGES: Final = {
    f"{k}{n}": ((-(1 << (8 * n - 1)), (1 << (8 * n - 1)) - 1) if k == "i" else (0, (1 << (8 * n)) - 1))
    for k in "iu"
    for n in (1, 2, 4, 8)
}
_INT_RANGES.update({"ci1": _INT_RANGES["i1"], "cu1": _INT_RANGES["u1"]})
_FLOAT_MAX: Final = 3.4028234663852886e38
_LONG_DOUBLE: Final = f"f{ctypes.sizeof(ctypes.c_longdouble)}"
_SCALAR_CTYPES: Final[dict[str, Any]] = {
    "i1": ctypes.c_int8, "u1": ctypes.c_uint8, "i2": ctypes.c_int16, "u2": ctypes.c_uint16,
    "i4": ctypes.c_int32, "u4": ctypes.c_uint32, "i8": ctypes.c_int64, "u8": ctypes.c_uint64,
    "ci1": ctypes.c_int8, "cu1": ctypes.c_uint8, "b": ctypes.c_bool, "f4": ctypes.c_float,
    "f8": ctypes.c_double, _LONG_DOUBLE: ctypes.c_longdouble,
}  # fmt: skip
#: NumPy's ``typestr`` of each pointee code (the first is the one the fast path knows).
_TYPESTRS: Final = {
    **{f"{k}{n}": (f"{'|' if n == 1 else _ORDER}{k}{n}",) for k in "iu" for n in (1, 2, 4, 8)},
    "ci1": ("|i1", "|u1", "|S1"), "cu1": ("|u1", "|i1", "|S1"), "b": ("|b1",),
    **{f"f{n}": (f"{_ORDER}f{n}",) for n in (2, 4, 8, int(_LONG_DOUBLE[1:]))},
}  # fmt: skip
#: The base of every ctypes type (not exported by ``ctypes``).
_CData: Final[type] = ctypes.c_int.__mro__[-2]
_DTYPE_NAMES: Final = {"i": "int", "u": "uint", "f": "float", "b": "bool", "S": "bytes"}


class Param(NamedTuple):
    position: int
    #: As messages name it: ``'x'``, or ``#2`` when the build recorded no name.
    label: str
    code: str
    spelling: str


class Prepared(NamedTuple):
    """A kernel's checked call (``call(kernel, *args)``: a ``__call__``) and its
    prototype as C text."""

    call: Callable[..., Any]
    text: str | None


class _Where(NamedTuple):
    """Which kernel a message is about, and its prototype as messages show it."""

    kernel: str
    shown: str


#: A positional argument not given (the calls' defaults: a missing one is this).
_MISSING: Final = type("_Missing", (), {"__repr__": lambda self: "<missing>"})()


class _NoArray:
    """Stands for ``numpy.ndarray`` until NumPy is imported (no array is one)."""


def prepare(name: str, fn: Any, signature: Any, state: Any, argtypes: Sequence[Any] | None, restype: Any) -> Prepared:
    """The checked call of the kernel ``name`` (the ctypes function ``fn``; ``signature``:
    the build's, with ``.ret``, ``.params`` and ``.varargs``, or None; ``state.closed``:
    whether its module is closed)."""
    if signature is None:
        if argtypes is None or restype is UNSET:
            missing = "argtypes= and restype=" if argtypes is None else "restype="
            return _refusing(name, state, f"the build recorded no prototype for {name!r} (no debug info describes "
                             f"it); pass {missing} to call it")  # fmt: skip
        params = [Param(i, f"#{i + 1}", *_declared(t)) for i, t in enumerate(argtypes)]
        ret_code, ret_spelling = _declared(restype) if restype is not None else ("v", "void")
        return _build(name, fn, params, (ret_code, ret_spelling), state, list(argtypes), restype, text=None)
    (ret_code, ret_spelling), raw_params, varargs = signature.ret, signature.params, signature.varargs
    params = [Param(i, repr(p[0]) if p[0] else f"#{i + 1}", p[1], p[2]) for i, p in enumerate(raw_params)]
    text = _text(name, ret_spelling, params, varargs)
    given = list(argtypes) if argtypes is not None else None
    if given is not None and ((len(given) != len(params) and not varargs) or len(given) < len(params)):
        raise ArgumentTypeError(
            f"{text}: argtypes names {len(given)} parameters, the build {len(params)}", kernel=name, param=None
        )
    for p in params:
        if given is not None and not p.code.startswith("!") and not _agrees(p.code, given[p.position]):
            raise ArgumentTypeError(
                f"{text}: argtypes[{p.position}] is {_ctype_name(given[p.position])}, but {p.label} is {p.spelling}",
                kernel=name, param=p.label,
            )  # fmt: skip
    if restype is not UNSET and not ret_code.startswith("!") and not _agrees(ret_code, restype, ret=True):
        raise ArgumentTypeError(
            f"{text}: restype is {_ctype_name(restype)}, but the kernel returns {ret_spelling}",
            kernel=name, param="return",
        )  # fmt: skip
    unchecked = [p for p in params if p.code.startswith("!") and given is None]
    if unchecked or (varargs and given is None) or (ret_code.startswith("!") and restype is UNSET):
        why = (
            f"{unchecked[0].label} is {unchecked[0].spelling} ({unchecked[0].code[1:]})" if unchecked
            else "it takes a variable number of arguments" if varargs and given is None
            else f"it returns {ret_spelling} ({ret_code[1:]})"
        )  # fmt: skip
        return _refusing(name, state, f"{text}: a call cannot be checked: {why}; pass argtypes= and restype= to "
                         "declare how to pass it")  # fmt: skip
    if given is not None and len(given) > len(params):  # the variadic part, as declared
        params += [Param(i, f"#{i + 1}", *_declared(t)) for i, t in enumerate(given) if i >= len(params)]
    ret = (ret_code, ret_spelling) if restype is UNSET or not ret_code.startswith("!") else _declared(restype)
    return _build(name, fn, params, ret, state, given, restype, text=text)


# -- building the call --------------------------------------------------------------------
def _build(
    name: str,
    fn: Any,
    params: list[Param],
    ret: tuple[str, str],
    state: Any,
    given: list[Any] | None,
    restype: Any,
    *,
    text: str | None,
) -> Prepared:
    where = _Where(name, text or f"{name}({', '.join(p.spelling for p in params)})")
    ns: dict[str, Any] = {
        "state": state, "fn": fn, "ND": _NoArray, "cfb": ctypes.c_char.from_buffer, "addressof": ctypes.addressof,
        "ArgumentError": ctypes.ArgumentError, "params": params,
    }  # fmt: skip
    argtypes, fast = [], {}
    for p in params:
        own = given[p.position] if given is not None and p.position < len(given) else None
        if p.code.startswith("!") or p.code == "?":
            argtypes.append(own)  # declared by the caller: ctypes converts it
            continue
        ns[f"s{p.position}"] = _slow(where, p, ns)
        argtype, fast[p.position] = _fast(p, ns)
        argtypes.append(argtype)
    _numpy_fast_path(ns)
    fn.argtypes = argtypes
    fn.restype = _restype(ret[0], restype)
    ns["closed"] = lambda: _closed(name)
    ns["arity"] = lambda given, extra: _arity(where, params, sum(v is not _MISSING for v in given) + len(extra))
    ns["failed"] = lambda exc: _ctypes_failed(where, params, exc)
    ns["M"] = _MISSING
    exec(_source(params, fast), ns)  # noqa: S102 (fixed templates: the only values are indices and int bounds)
    return Prepared(ns["call"], text)


def _fast(p: Param, ns: dict[str, Any]) -> tuple[Any, str]:
    """The ctypes type of parameter ``p`` and the expression that converts its argument
    ``a<i>`` on the fast path: an exact class and a range test; the slow converter
    ``s<i>`` for anything else."""
    i, code = p.position, p.code
    if code in _INT_RANGES:
        lo, hi = _INT_RANGES[code]
        return _SCALAR_CTYPES[code], f"a{i} if a{i}.__class__ is int and {lo} <= a{i} <= {hi} else s{i}(a{i})"
    if code == "f4":
        limit = repr(_FLOAT_MAX)
        return ctypes.c_float, f"a{i} if a{i}.__class__ is float and -{limit} <= a{i} <= {limit} else s{i}(a{i})"
    if code in _SCALAR_CTYPES:
        cls = "bool" if code == "b" else "float"
        return _SCALAR_CTYPES[code], f"a{i} if a{i}.__class__ is {cls} else s{i}(a{i})"
    pointee = code.partition(":")[2]
    rest = f"None if a{i} is None else s{i}(a{i})"
    if pointee in _TYPESTRS:  # an array of the pointee's dtype: its buffer (writable, C-contiguous)
        ns[f"D{i}"] = _NoArray
        return ctypes.c_void_p, f"addressof(cfb(a{i})) if a{i}.__class__ is ND and a{i}.dtype is D{i} else {rest}"
    if pointee == "v":
        return ctypes.c_void_p, f"addressof(cfb(a{i})) if a{i}.__class__ is ND else {rest}"
    return ctypes.c_void_p, rest


def _source(params: list[Param], fast: dict[int, str]) -> str:
    """The checked call: its arguments positional (a missing one is the sentinel ``M``),
    the fast path tried first; any failure there, and the slow converters (which raise
    the precise error) run outside its handler."""
    args = [f"a{p.position}" for p in params]
    out = [f"b{p.position}" if p.position in fast else f"a{p.position}" for p in params]
    src = [f"def call(self, {''.join(a + '=M, ' for a in args)}/, *extra):", "    if state.closed: raise closed()"]
    src.append(
        f"    if extra{f' or {args[-1]} is M' if args else ''}: raise arity(({''.join(a + ', ' for a in args)}), extra)"
    )
    call = ["try:", f"    return fn({', '.join(out)})", "except ArgumentError as exc:", "    raise failed(exc)"]
    if fast:
        src += [
            "    try:",
            *(f"        b{i} = {expr}" for i, expr in fast.items()),
            "    except Exception:",
            "        pass",
        ]
        src += ["    else:", *(f"        {line}" for line in call)]
        src += [f"    b{i} = s{i}(a{i})" for i in fast]
    src += [f"    {line}" for line in call]
    return "\n".join(src)


def _numpy_fast_path(ns: dict[str, Any]) -> None:
    """Point the fast path at NumPy's ndarray and dtypes, once NumPy is imported."""
    np = sys.modules.get("numpy")
    if np is None or ns["ND"] is not _NoArray:
        return
    ns["ND"] = np.ndarray
    for p in ns["params"]:
        if f"D{p.position}" in ns:
            ns[f"D{p.position}"] = np.dtype(_TYPESTRS[p.code.partition(":")[2]][0])


def _restype(code: str, declared: Any) -> Any:
    if declared is not UNSET:
        return declared  # (it agrees with the build's, or the build's is not one a call can check)
    if code == "v":
        return None
    if code in ("ci1", "cu1"):
        return ctypes.c_char  # (a character: bytes, as ctypes and cffi give it)
    if code in _SCALAR_CTYPES:
        return _SCALAR_CTYPES[code]
    return ctypes.c_void_p  # a pointer: its address, or None


def _refusing(name: str, state: Any, why: str) -> Prepared:
    def call(self: Any, *args: Any) -> Any:
        if state.closed:
            raise _closed(name)
        raise ArgumentTypeError(why, kernel=name, param=None)

    return Prepared(call, None)


def _text(name: str, ret: str, params: list[Param], varargs: bool) -> str:
    def one(p: Param) -> str:
        bare = p.label.strip("'") if p.label.startswith("'") else ""
        return p.spelling if not bare else f"{p.spelling}{bare}" if p.spelling.endswith("*") else f"{p.spelling} {bare}"

    parts = [one(p) for p in params] + (["..."] if varargs else [])
    lead = f"{ret}{name}" if ret.endswith("*") else f"{ret} {name}"
    return f"{lead}({', '.join(parts) or 'void'})"


# -- errors ----------------------------------------------------------------------------------
def _closed(name: str) -> Exception:
    from .errors import LoadError

    return LoadError(f"kernel {name}: its module is closed")


def _arity(where: _Where, params: list[Param], given: int) -> ArgumentTypeError:
    want = len(params)
    if given < want:
        missing = params[given]
        return ArgumentTypeError(
            f"{where.shown}: missing argument {missing.label} ({missing.spelling}): takes {want}, got {given}",
            kernel=where.kernel, param=missing.label,
        )  # fmt: skip
    return ArgumentTypeError(
        f"{where.shown}: takes {want} argument{'s' * (want != 1)}, got {given}", kernel=where.kernel, param=None
    )


def _ctypes_failed(where: _Where, params: list[Param], exc: ctypes.ArgumentError) -> ArgumentTypeError:
    """A position the caller declared, which ctypes could not convert."""
    text = str(exc)  # "argument 2: TypeError: wrong type"
    number = text.removeprefix("argument ").partition(":")[0]
    p = params[int(number) - 1] if number.isdigit() and 0 < int(number) <= len(params) else None
    label = p.label if p is not None else number
    return ArgumentTypeError(f"{where.shown}: argument {label}: {text.partition(': ')[2]}", kernel=where.kernel,
                             param=label)  # fmt: skip


def _bad(where: _Where, p: Param, what: str, value: Any, got: str = "") -> ArgumentTypeError:
    shown = repr(value) if isinstance(value, (int, float, str, bytes)) and len(repr(value)) < 40 else ""
    got = got or f"{type(value).__name__}{' ' + shown if shown else ''}"
    return ArgumentTypeError(
        f"{where.shown}: argument {p.label} ({p.spelling}): {what}, got {got}", kernel=where.kernel, param=p.label
    )


def _unusable(where: _Where, p: Param, detail: str) -> ArgumentValueError:
    return ArgumentValueError(
        f"{where.shown}: argument {p.label} ({p.spelling}): {detail}", kernel=where.kernel, param=p.label
    )


# -- slow converters -----------------------------------------------------------------------
def _slow(where: _Where, p: Param, ns: dict[str, Any]) -> Callable[[Any], Any]:
    code = p.code
    if code in _INT_RANGES:
        lo, hi = _INT_RANGES[code]
        return lambda v: _int(v, lo, hi, where, p)
    if code == "b":
        return lambda v: _bool(v, where, p)
    if code in _SCALAR_CTYPES:
        limit = _FLOAT_MAX if code == "f4" else None
        return lambda v: _float(v, limit, where, p)
    pointee, const = code.partition(":")[2], code.startswith("pc")
    return lambda v: _pointer(v, pointee, const, where, p, ns)


def _int(v: Any, lo: int, hi: int, where: _Where, p: Param) -> int:
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


def _bool(v: Any, where: _Where, p: Param) -> bool:
    if isinstance(v, ctypes.c_bool):
        return bool(v.value)
    if type(v).__name__ in ("bool_", "bool") or (hasattr(type(v), "__index__") and not isinstance(v, (str, bytes))):
        number = int(v) if type(v).__name__ in ("bool_", "bool") else operator.index(v)
        if number in (0, 1):
            return bool(number)
        raise _unusable(where, p, f"{number} is not a bool (True, False, 0 or 1)")
    raise _bad(where, p, "expected a bool", v)


def _float(v: Any, limit: float | None, where: _Where, p: Param) -> float:
    if isinstance(v, ctypes._SimpleCData) and _ctype_code(type(v)) in ("f4", "f8", _LONG_DOUBLE):
        v = v.value
    if isinstance(v, (str, bytes)) or not (hasattr(type(v), "__float__") or hasattr(type(v), "__index__")):
        raise _bad(where, p, "expected a real number", v)
    try:
        number = float(v)
    except (OverflowError, TypeError, ValueError) as exc:
        raise _unusable(where, p, f"{v!r:.40} is not a {p.spelling}: {exc}") from None
    if limit is not None and math.isfinite(number) and abs(number) > limit:
        raise _unusable(where, p, f"{number!r} is beyond the range of {p.spelling} (±{limit:.6g})")
    return number


def _pointer(v: Any, pointee: str, const: bool, where: _Where, p: Param, ns: dict[str, Any]) -> Any:
    if v is None:
        return None
    if hasattr(v, "__array_interface__") and not isinstance(v, _CData):
        _numpy_fast_path(ns)
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
        return _ctypes_pointer(v, pointee, where, p)
    hint = ""
    if isinstance(v, int):
        hint = " (a raw address: pass ctypes.c_void_p(address))"
    elif isinstance(v, (list, tuple)):
        hint = " (convert it first: numpy.asarray(...))"
    raise _bad(where, p, f"expected {_wanted(pointee)}{hint}", v)


def _array_address(v: Any, pointee: str, const: bool, where: _Where, p: Param) -> int:
    iface = v.__array_interface__
    typestr, shape, strides = iface.get("typestr", "?"), tuple(iface.get("shape", ())), iface.get("strides")
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


def _ctypes_pointer(v: Any, pointee: str, where: _Where, p: Param) -> Any:
    if isinstance(v, ctypes.c_void_p):
        return v  # an explicit address: the caller vouches for it
    if isinstance(v, ctypes.c_char_p) and pointee in ("ci1", "cu1", "v"):
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
    raise _bad(where, p, f"expected {_wanted(pointee)}", v, got=f"ctypes {_ctype_name(target)}")


# -- types ------------------------------------------------------------------------------------
def _dtype_fits(pointee: str, typestr: str, itemsize: int) -> bool:
    if pointee == "v":
        return True
    if pointee == "p":
        return typestr[1] in "iu" and itemsize == ctypes.sizeof(ctypes.c_void_p)
    if pointee.startswith("s"):
        size = int(pointee[1:])
        return size in (0, itemsize)
    return typestr in _TYPESTRS.get(pointee, ())


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
    names = " or ".join(_dtype_name(t) for t in _TYPESTRS.get(pointee, ()))
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


def _agrees(code: str, t: Any, *, ret: bool = False) -> bool:
    """Whether a declared ctypes type ``t`` agrees with the build's type ``code``."""
    if t is None:
        return ret and code == "v"
    own = _ctype_code(t)
    if code in _SCALAR_CTYPES:
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


def _declared(t: Any) -> tuple[str, str]:
    """``(code, spelling)`` of a position the caller declared with the ctypes type ``t``:
    checked as that type (a pointer's constness unknown: read-only arrays pass);
    ``?`` for a type only ctypes converts."""
    code = _ctype_code(t)
    if code in _SCALAR_CTYPES:
        return code, _ctype_name(t)
    if code == "c":
        return "ci1", "c_char"
    if t is ctypes.c_void_p:
        return "pc:v", "c_void_p"
    if t is ctypes.c_char_p:
        return "pc:ci1", "c_char_p"
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        inner = _ctype_code(t._type_)
        if inner in _TYPESTRS:
            return f"pc:{inner}", _ctype_name(t)
    return "?", _ctype_name(t)


def _ctype_name(t: Any) -> str:
    return "None" if t is None else getattr(t, "__name__", repr(t))
