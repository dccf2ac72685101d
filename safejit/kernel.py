"""Module and Kernel handles, and the Artifact record of a cached build.

A :class:`Module` owns a loaded library; it is released by :meth:`Module.close`
or, once unreferenced, by ``weakref.finalize`` — both safe to call twice.
Kernels keep their module alive. A host kernel's calls are checked against the
prototype its build recorded (``_hostcall.py`` says what each C type accepts)::

    add = mod.kernel("add")
    add.signature          # 'int add(int a, int b)'
    add(2, 3)              # 5;  add(2) and add("a", "b") raise ArgumentTypeError
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from . import _forksafe, _hostcall
from ._hostcall import UNSET
from .backends.base import LoadedLibrary
from .errors import ArgumentTypeError, KernelNotFoundError, LoadError

__all__ = ["Artifact", "Kernel", "KernelHandle", "Module"]


class KernelHandle(Protocol):
    """What :meth:`Module.kernel` returns, whatever the backend: a host
    :class:`Kernel`, called directly (``k(*args)``, its value the C function's, as
    ctypes gives it); a CUDA kernel (``k.launch(grid, block, args, ...)``) or an Ascend
    one (``k.launch(num_blocks, args, ...)``), which raise ``LoadError`` when called."""

    @property
    def name(self) -> str: ...

    def __call__(self, *args: Any) -> Any: ...

    @property
    def launch(self) -> Callable[..., Any]: ...


@dataclass(frozen=True, slots=True)
class Artifact:
    """A built, verified cache entry."""

    build_key: str
    deps_key: str
    #: The leaf directory (empty when the cache was bypassed).
    path: str
    digest: str
    size: int
    kernels: tuple[str, ...]
    #: Where the call that returned it found it: ``memory`` / ``disk`` / ``remote`` /
    #: ``compiled`` / ``bypass`` (a :class:`~safejit.outcomes.Tier`).
    tier: str = "compiled"

    @property
    def source(self) -> str:
        """The same as :attr:`tier` (its first name)."""
        return self.tier


class _Loaded:
    """What views of one loaded module share: the library, its kernels, closed-ness."""

    __slots__ = ("__weakref__", "closed", "finalizer", "kernels", "library", "lock", "on_close")

    def __init__(self, library: LoadedLibrary) -> None:
        self.library = library
        self.closed = False
        self.lock = _forksafe.Lock()
        self.kernels: dict[str, KernelHandle] = {}
        self.finalizer = weakref.finalize(self, library.close)
        #: Run once when it is closed: what keeps it for later calls lets it go.
        self.on_close: list[Callable[[], None]] = []


class Module:
    """A loaded artifact. ``mod.kernel(name)`` or ``mod[name]`` gives a :class:`Kernel`."""

    def __init__(
        self, library: LoadedLibrary, artifact: Artifact, backend: str, *, _shared: _Loaded | None = None
    ) -> None:
        self.artifact = artifact
        self.backend = backend
        self._state = _shared if _shared is not None else _Loaded(library)
        self._library = self._state.library
        self._kernels = self._state.kernels

    def found_in(self, tier: str) -> Module:
        """This module as a call that found it in ``tier`` returns it: the same loaded
        library and kernels, its ``artifact.tier`` saying where."""
        if tier == self.artifact.tier:
            return self
        return Module(self._library, replace(self.artifact, tier=tier), self.backend, _shared=self._state)

    @property
    def _closed(self) -> bool:
        return self._state.closed

    @property
    def closed(self) -> bool:
        return self._state.closed

    @property
    def kernels(self) -> tuple[str, ...]:
        return self.artifact.kernels

    def kernel(self, name: str, *, argtypes: Sequence[Any] | None = None, restype: Any = UNSET) -> KernelHandle:
        """The kernel called ``name``: a :class:`Kernel` (host, called directly) or a
        backend kernel with ``launch(grid, block, args, ...)`` (CUDA).

        Host: calls are checked against the prototype the build recorded. ``argtypes``
        and ``restype`` (ctypes types; ``restype=None``: void) declare what it does not
        describe — a parameter no call can check (a struct by value, a function
        pointer), ``...``, or a kernel without debug info; given for what the build
        describes, they must agree with it (else :class:`ArgumentTypeError`)."""
        plain = argtypes is None and restype is UNSET
        if plain and not self._closed:
            found = self._kernels.get(name)
            if found is not None:
                return found  # re-getting a kernel is a dict lookup
        if self._closed:
            raise LoadError(f"module {self.artifact.build_key[:12]} is closed")
        if argtypes is not None and (isinstance(argtypes, (str, bytes)) or not isinstance(argtypes, Sequence)):
            raise ArgumentTypeError(f"{name}: argtypes must be a sequence of ctypes types, got {argtypes!r:.80}")
        kernel = self._make_kernel(name, argtypes, restype)
        if plain and len(self._kernels) < 1024:
            self._kernels[name] = kernel
        return kernel

    def _make_kernel(self, name: str, argtypes: Sequence[Any] | None, restype: Any) -> KernelHandle:
        if self.backend != "host":
            device: KernelHandle = self._library.function(name, argtypes=argtypes)
            return device
        kernels = self.artifact.kernels
        # (only a function this library defines and exports: dlsym on its handle would also
        # find one of its dependencies' — libc's ``system`` of a module exporting none)
        if name not in kernels:
            raise KernelNotFoundError(
                f"no kernel {name!r}; this module has {list(kernels)}{_hint(name, kernels)}",
                name=name,
                kernels=list(kernels),
            )
        try:
            fn = self._library.function(name)
        except (AttributeError, KeyError) as exc:
            raise KernelNotFoundError(f"no kernel {name!r}{_hint(name, self.artifact.kernels)}", name=name) from exc
        signature = getattr(self._library, "signature", None)
        prepared = _hostcall.prepare(name, fn, signature(name) if signature else None, self._state, argtypes, restype)
        # Its own class, whose __call__ is the checked call itself: one Python frame per call.
        own: type[Kernel] = type(
            "Kernel", (Kernel,), {"__slots__": (), "__call__": prepared.call, "__module__": __name__}
        )
        return own(name, fn, self, prepared)

    def __getitem__(self, name: str) -> KernelHandle:
        return self.kernel(name)

    def close(self) -> None:
        """Close the module: its kernels raise LoadError from now on, and its library is
        unloaded once nothing holds it (a call under way ends first). A module is shared:
        every ``compile()`` of the same request by the same Runtime returns it while it is in
        memory (a hit costs no new object), so this closes it for each of them; the next
        ``compile()`` after this returns loads it afresh."""
        state = self._state
        with state.lock:
            state.closed = True
            state.kernels.clear()
            hooks, state.on_close = state.on_close, []
        for hook in hooks:
            hook()
        state.finalizer()

    def _when_closed(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` when this module is closed (now, if it is already)."""
        state = self._state
        with state.lock:
            if not state.closed:
                state.on_close.append(hook)
                return
        hook()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "loaded"
        return f"<safejit.Module {self.backend} {self.artifact.build_key[:12]} {state} kernels={list(self.kernels)}>"


class Kernel:
    """A callable host kernel: ``k(*args)``, each argument checked against the C
    prototype its build recorded (:attr:`signature`) and converted: Python numbers,
    C-contiguous NumPy arrays of the pointee's dtype for pointers, ``None`` for NULL,
    ctypes values. A wrong argument raises :class:`~safejit.ArgumentTypeError` or
    :class:`~safejit.ArgumentValueError` naming the parameter; nothing is called."""

    __slots__ = ("__weakref__", "_call", "_fn", "_module", "name", "signature")

    def __init__(self, name: str, fn: Any, module: Module, prepared: _hostcall.Prepared) -> None:
        self.name = name
        self._fn = fn
        self._module = module
        self._call = prepared.call
        #: The C prototype the build recorded (``'int add(int a, int b)'``); None when
        #: the build describes none (calls then take ``argtypes=``/``restype=``).
        self.signature = prepared.text

    def __call__(self, *args: Any) -> Any:
        return self._call(self, *args)  # (each kernel's own class calls it directly)

    def launch(self, grid: object = None, block: object = None, args: Sequence[Any] = (), **_: object) -> Any:
        """Uniform launch entry point; on the host it is a plain call."""
        return self(*args)

    @property
    def module(self) -> Module:
        return self._module

    def __repr__(self) -> str:
        return f"<safejit.Kernel {self.signature or self.name} of {self._module!r}>"


def _hint(name: str, kernels: Sequence[str]) -> str:
    """What a host kernel not found most likely means: a C++ name mangled (its function
    not ``extern "C"``), or a build that exports no function at all."""
    if not kernels:
        return (
            " (the build exports no function: are they static, or hidden by -fvisibility=hidden "
            'without __attribute__((visibility("default")))?)'
        )
    if any(k.startswith("_Z") and f"{len(name)}{name}" in k for k in kernels):
        return f' (C++ names are mangled: declare {name} extern "C")'
    return ""
