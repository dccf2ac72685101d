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

What no call can check: how many elements a pointer's buffer holds. A ``T *`` is an
address; nothing in the prototype ties a length parameter to it, so a length past the
array's end reads or writes past it, as a plain ctypes call would.

The return value is ``None`` (void), an ``int``, ``bool`` or ``float``, ``bytes`` for
a plain ``char``, an address ``int`` (or ``None``) for a pointer.

A parameter the prototype does not let a call check — a struct passed by value, a
function pointer, a reference, ``__int128``, a K&R definition's promoted parameter —
or ``...`` makes the kernel refuse every call unless ``argtypes=`` declares it; the
declaration is then what that position is passed as (unchecked beyond ctypes' own
conversion). A kernel the debug info does not describe is refused unless
``argtypes=`` and ``restype=`` declare it; it is then checked against that
declaration. A declaration given for a kernel the build describes must agree with it.

A kernel's first calls convert every argument through its slow converter, which
checks it; after ``WARM_CALLS`` calls the call is a function generated for the kernel
from fixed templates (no text of the build or the caller enters it): per argument an
exact-class test and a range test, the slow converters only for what those let
through. Both raise the same errors: the generated call falls back to the converters.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

from ._hostargs import (
    FLOAT_MAX,
    INT_RANGES,
    PROMOTED,
    SCALAR_CTYPES,
    TYPESTRS,
    NoArray,
    Param,
    Where,
    agrees,
    ctype_name,
    declared,
    numpy_fast_path,
    slow,
)
from .errors import ArgumentTypeError

__all__ = ["UNSET", "Prepared", "prepare"]

#: ``Module.kernel``'s ``restype`` default: the build's return type.
UNSET: Final[Any] = type("_Unset", (), {"__repr__": lambda self: "<the build's>"})()


class Prepared(NamedTuple):
    """A kernel's checked call (``call(kernel, *args)``: a ``__call__``) and its
    prototype as C text."""

    call: Callable[..., Any]
    text: str | None


#: A positional argument not given (the calls' defaults: a missing one is this).
_MISSING: Final = type("_Missing", (), {"__repr__": lambda self: "<missing>"})()


def _by_value(code: str, *, ret: bool = False) -> str:
    """A recorded type code as a call may pass it: a scalar no converter knows (``_Float16``,
    a pointee-only code, as a manifest may hold it) cannot be checked; it was taken for a
    pointer, and any address passed for it."""
    if code.startswith(("!", "p")) or code in SCALAR_CTYPES or (ret and code == "v"):
        return code
    return f"!a {code} passed by value"


def prepare(name: str, fn: Any, signature: Any, state: Any, argtypes: Sequence[Any] | None, restype: Any) -> Prepared:
    """The checked call of the kernel ``name`` (the ctypes function ``fn``; ``signature``:
    the build's, with ``.ret``, ``.params`` and ``.varargs``, or None; ``state.closed``:
    whether its module is closed)."""
    if signature is None:
        if argtypes is None or restype is UNSET:
            missing = "argtypes= and restype=" if argtypes is None else "restype="
            return _refusing(name, state, f"the build recorded no prototype for {name!r} (no debug info describes "
                             f"it); pass {missing} to call it")  # fmt: skip
        params = [Param(i, f"#{i + 1}", *declared(t)) for i, t in enumerate(argtypes)]
        ret_code, ret_spelling = declared(restype) if restype is not None else ("v", "void")
        return _build(name, fn, params, (ret_code, ret_spelling), state, list(argtypes), restype, text=None)
    (ret_code, ret_spelling), raw_params, varargs = signature.ret, signature.params, signature.varargs
    ret_code = _by_value(ret_code, ret=True)
    params = [Param(i, repr(p[0]) if p[0] else f"#{i + 1}", _by_value(p[1]), p[2]) for i, p in enumerate(raw_params)]
    text = _text(name, ret_spelling, params, varargs)
    given = list(argtypes) if argtypes is not None else None
    if given is not None and ((len(given) != len(params) and not varargs) or len(given) < len(params)):
        raise ArgumentTypeError(
            f"{text}: argtypes names {len(given)} parameters, the build {len(params)}", kernel=name, param=None
        )
    for p in params:
        if given is not None and not p.code.startswith("!") and not agrees(p.code, given[p.position]):
            raise ArgumentTypeError(
                f"{text}: argtypes[{p.position}] is {ctype_name(given[p.position])}, but {p.label} is {p.spelling}",
                kernel=name, param=p.label,
            )  # fmt: skip
    if restype is not UNSET and not ret_code.startswith("!") and not agrees(ret_code, restype, ret=True):
        raise ArgumentTypeError(
            f"{text}: restype is {ctype_name(restype)}, but the kernel returns {ret_spelling}",
            kernel=name, param="return",
        )  # fmt: skip
    unchecked = [p for p in params if p.code.startswith("!") and given is None]
    if unchecked or (varargs and given is None) or (ret_code.startswith("!") and restype is UNSET):
        why = (
            f"{unchecked[0].label} is {unchecked[0].spelling} ({unchecked[0].code[1:]})" if unchecked
            else "it takes a variable number of arguments" if varargs and given is None
            else f"it returns {ret_spelling} ({ret_code[1:]})"
        )  # fmt: skip
        fix = "restype=" if not unchecked and not (varargs and given is None) else "argtypes="
        return _refusing(name, state, f"{text}: a call cannot be checked: {why}; pass {fix} to declare how to "
                         "pass it")  # fmt: skip
    if given is not None and len(given) > len(params):  # the variadic part, as declared
        extra = [Param(i, f"#{i + 1}", *declared(t)) for i, t in enumerate(given) if i >= len(params)]
        promoted = next((p for p in extra if p.code in PROMOTED), None)
        if promoted is not None:  # (C passes these as int or double through ...)
            raise ArgumentTypeError(
                f"{text}: argtypes[{promoted.position}] is {promoted.spelling}, which ... passes as "
                f"{'c_double' if promoted.code == 'f4' else 'c_int'}: declare that",
                kernel=name, param=promoted.label,
            )  # fmt: skip
        params += extra
    ret = (ret_code, ret_spelling) if restype is UNSET or not ret_code.startswith("!") else declared(restype)
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
    where = Where(name, text or f"{name}({', '.join(p.spelling for p in params)})")
    ns: dict[str, Any] = {
        "state": state, "fn": fn, "ND": NoArray, "cfb": ctypes.c_char.from_buffer, "addressof": ctypes.addressof,
        "ArgumentError": ctypes.ArgumentError, "params": params,
    }  # fmt: skip
    argtypes, fast = [], {}
    for p in params:
        own = given[p.position] if given is not None and p.position < len(given) else None
        if p.code.startswith("!") or p.code == "?":
            argtypes.append(own)  # declared by the caller: ctypes converts it
            continue
        ns[f"s{p.position}"] = slow(where, p, ns)
        argtype, fast[p.position] = _fast(p, ns)
        argtypes.append(argtype)
    fn.argtypes = argtypes
    fn.restype = _restype(ret[0], restype)
    ns["closed"] = lambda: _closed(name)
    ns["arity"] = lambda given, extra: _arity(where, params, sum(v is not _MISSING for v in given) + len(extra))
    ns["failed"] = lambda exc: _ctypes_failed(where, params, exc)
    ns["M"] = _MISSING
    return Prepared(_first_calls(name, where, params, ns, fast), text)


#: Calls a kernel makes through its first, generic call before its own is generated:
#: generating one (``exec``) costs ~0.3 ms in a new process, ~300 generic calls.
WARM_CALLS = 64


def _first_calls(
    name: str, where: Where, params: list[Param], ns: dict[str, Any], fast: dict[int, str]
) -> Callable[..., Any]:
    """The call a kernel starts with: every argument through its slow converter (the
    checks the generated call makes, and the same errors); after ``WARM_CALLS`` calls
    it generates the kernel's own call and puts it in the kernel's class."""
    state, fn, count = ns["state"], ns["fn"], len(params)
    convert = [ns[f"s{p.position}"] if p.position in fast else None for p in params]
    calls = 0

    def call(self: Any, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > WARM_CALLS:
            numpy_fast_path(ns)
            exec(_source(params, fast), ns)  # noqa: S102 (fixed templates: the only values are indices and int bounds)
            type(self).__call__ = _named(ns["call"], name)  # each kernel has a class of its own
            return ns["call"](self, *args)
        if state.closed:
            raise _closed(name)
        if len(args) != count:
            raise _arity(where, params, len(args))
        values = [a if c is None else c(a) for c, a in zip(convert, args, strict=True)]
        try:
            return fn(*values)
        except ctypes.ArgumentError as exc:
            raise _ctypes_failed(where, params, exc)  # noqa: B904 (as the generated call raises it)

    return _named(call, name)


def _named(call: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``call`` named after its kernel: a keyword argument, which no kernel takes, is
    Python's own ``TypeError`` naming the kernel (``add() got an unexpected keyword
    argument 'x'``), not a helper of this module."""
    call.__name__ = call.__qualname__ = name
    return call


def _fast(p: Param, ns: dict[str, Any]) -> tuple[Any, str]:
    """The ctypes type of parameter ``p`` and the expression that converts its argument
    ``a<i>`` on the fast path: an exact class and a range test; the slow converter
    ``s<i>`` for anything else."""
    i, code = p.position, p.code
    if code in INT_RANGES:
        lo, hi = INT_RANGES[code]
        return SCALAR_CTYPES[code], f"a{i} if a{i}.__class__ is int and {lo} <= a{i} <= {hi} else s{i}(a{i})"
    if code == "f4":
        limit = repr(FLOAT_MAX)
        return ctypes.c_float, f"a{i} if a{i}.__class__ is float and -{limit} <= a{i} <= {limit} else s{i}(a{i})"
    if code in SCALAR_CTYPES:
        cls = "bool" if code == "b" else "float"
        return SCALAR_CTYPES[code], f"a{i} if a{i}.__class__ is {cls} else s{i}(a{i})"
    pointee = code.partition(":")[2]
    rest = f"None if a{i} is None else s{i}(a{i})"
    if pointee in TYPESTRS:  # an array of the pointee's dtype: its buffer (writable, C-contiguous)
        ns[f"D{i}"] = NoArray
        return ctypes.c_void_p, f"addressof(cfb(a{i})) if a{i}.__class__ is ND and a{i}.dtype is D{i} else {rest}"
    if pointee == "v":  # (an array of Python objects never: the kernel would write over them)
        return ctypes.c_void_p, f"addressof(cfb(a{i})) if a{i}.__class__ is ND and not a{i}.dtype.hasobject else {rest}"
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


def _restype(code: str, declared: Any) -> Any:
    if declared is not UNSET:
        return declared  # (it agrees with the build's, or the build's is not one a call can check)
    if code == "v":
        return None
    if code in ("ci1", "cu1"):
        return ctypes.c_char  # (a character: bytes, as ctypes and cffi give it)
    if code in SCALAR_CTYPES:
        return SCALAR_CTYPES[code]
    return ctypes.c_void_p  # a pointer: its address, or None


def _refusing(name: str, state: Any, why: str) -> Prepared:
    def call(self: Any, *args: Any) -> Any:
        if state.closed:
            raise _closed(name)
        raise ArgumentTypeError(why, kernel=name, param=None)

    return Prepared(_named(call, name), None)


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


def _arity(where: Where, params: list[Param], given: int) -> ArgumentTypeError:
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


def _ctypes_failed(where: Where, params: list[Param], exc: ctypes.ArgumentError) -> ArgumentTypeError:
    """A position the caller declared, which ctypes could not convert."""
    text = str(exc)  # "argument 2: TypeError: wrong type"
    number = text.removeprefix("argument ").partition(":")[0]
    p = params[int(number) - 1] if number.isdigit() and 0 < int(number) <= len(params) else None
    label = p.label if p is not None else number
    return ArgumentTypeError(f"{where.shown}: argument {label}: {text.partition(': ')[2]}", kernel=where.kernel,
                             param=label)  # fmt: skip
