"""safejit: compile device kernels at run time, cache them safely, load and launch.

>>> import safejit
>>> rt = safejit.Runtime()                                   # doctest: +SKIP
>>> src = safejit.Source("int add(int a, int b) { return a + b; }", "add")
>>> rt.compile(src).kernel("add")(2, 3)                      # doctest: +SKIP
5
"""

from __future__ import annotations

from . import faults
from ._version import __version__
from .config import Config
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
from .kernel import Artifact, Kernel, Module
from .runtime import Explanation, Runtime
from .spec import Source

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
