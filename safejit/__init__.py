"""safejit: compile device kernels at run time, cache them safely, load and launch.

>>> import safejit
>>> rt = safejit.Runtime()                                   # doctest: +SKIP
>>> src = safejit.Source("int add(int a, int b) { return a + b; }", "add")
>>> rt.compile(src).kernel("add")(2, 3)                      # doctest: +SKIP
5
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    ArgumentTypeError,
    ArgumentValueError,
    CacheError,
    CompileError,
    CompileTimeout,
    ConfigError,
    FlagPolicyError,
    KernelNotFoundError,
    KeyDeclarationError,
    LimitExceededError,
    LoadError,
    LoadTimeCodeError,
    PathConfinementError,
    PolicyError,
    SafejitError,
    SandboxUnavailableError,
    UndeclaredDependencyError,
)

if TYPE_CHECKING:
    from . import faults
    from .config import Config
    from .kernel import Artifact, Kernel, KernelHandle, Module
    from .runtime import Explanation, Runtime
    from .spec import Source

# The data path (and what it imports: msgspec, OpenTelemetry's API, BLAKE3, ctypes)
# is imported on first use of a name below, not by ``import safejit``.
_LAZY = {
    "Artifact": "kernel",
    "Config": "config",
    "Explanation": "runtime",
    "Kernel": "kernel",
    "KernelHandle": "kernel",
    "Module": "kernel",
    "Runtime": "runtime",
    "Source": "spec",
    "faults": "",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'safejit' has no attribute {name!r}")
    value = importlib.import_module(f".{module or name}", __name__)
    if module:
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # (the public names and the submodules imported so far; not this file's own imports)
    own = (n for n, v in globals().items() if type(v) is type(importlib) and v.__name__ == f"{__name__}.{n}")
    return sorted({*__all__, "__version__", *(n for n in own if not n.startswith("_"))})


__all__ = [
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
