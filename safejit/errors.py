"""The safejit error tree.

Every public error derives from :class:`SafejitError` and from the builtin
that matches its meaning, so callers may catch either::

    SafejitError
    ├── ConfigError                  (ValueError)   bad configuration or argument
    │   └── KeyDeclarationError      (ValueError)   extras differ from Config.declared_extras
    ├── LimitExceededError           (ValueError)   source, artifact, deps or time over a limit
    ├── PolicyError                  (PermissionError)
    │   ├── PathConfinementError                    path outside every declared root
    │   ├── FlagPolicyError                         compiler flag refused
    │   ├── UndeclaredDependencyError               closure reads outside declared roots
    │   └── LoadTimeCodeError                       a host kernel would run its own code when loaded
    ├── SandboxUnavailableError      (RuntimeError) sandbox="required" but not offered
    ├── CompileError                 (RuntimeError) compiler failed; carries .log
    │   └── CompileTimeout           (TimeoutError) compiler killed at the time limit
    ├── LoadError                    (RuntimeError) artifact could not be loaded
    ├── KernelNotFoundError          (LookupError)  no such kernel in a module
    ├── ArgumentTypeError            (TypeError)    a host kernel called with the wrong count or kind of arguments
    ├── ArgumentValueError           (ValueError)   ... with a value it cannot pass (range, layout, read-only)
    └── CacheError                   (OSError)      the cache cannot be used (on_cache_error="raise")

Errors carry structured attributes and pickle, so they cross process pools.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "CacheError",
    "CompileError",
    "CompileTimeout",
    "ConfigError",
    "FlagPolicyError",
    "KernelNotFoundError",
    "KeyDeclarationError",
    "LimitExceededError",
    "LoadError",
    "LoadTimeCodeError",
    "PathConfinementError",
    "PolicyError",
    "SafejitError",
    "SandboxUnavailableError",
    "UndeclaredDependencyError",
]


class SafejitError(Exception):
    """Root of every error safejit raises on purpose."""

    def __init__(self, message: str, **attrs: Any) -> None:
        super().__init__(message)
        self.message = message
        self._attrs = attrs
        for name, value in attrs.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self._attrs))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[SafejitError], message: str, attrs: dict[str, Any]) -> SafejitError:
    return cls(message, **attrs)


class ConfigError(SafejitError, ValueError):
    """A configuration value or call argument is invalid."""


class KeyDeclarationError(ConfigError):
    """``extras`` names keys other than exactly ``Config.declared_extras``."""


class LimitExceededError(SafejitError, ValueError):
    """An input or output is larger than its configured limit."""


class PolicyError(SafejitError, PermissionError):
    """A security policy refused the request."""


class PathConfinementError(PolicyError):
    """A path lies outside every declared root (or the compiler looked for one there:
    :class:`UndeclaredDependencyError`, whichever backend)."""


class FlagPolicyError(PolicyError):
    """A compiler flag is refused by the flag policy."""


class UndeclaredDependencyError(PathConfinementError):
    """The compiler read a file that the closure cannot declare: outside every declared
    root, or with a name that is not UTF-8 text."""


class LoadTimeCodeError(PolicyError):
    """A host kernel's shared object would run code of its own when it is loaded
    (a constructor, an IFUNC resolver, code added to ``_init``…) or would change the
    process for it (an executable stack, a library search path). ``.reasons`` names
    each finding; nothing was published or loaded."""

    reasons: tuple[str, ...]


class SandboxUnavailableError(SafejitError, RuntimeError):
    """``sandbox="required"`` but this kernel offers no Landlock."""


class CompileError(SafejitError, RuntimeError):
    """The compiler failed. ``.log`` holds its (capped) output ("" when none came);
    ``.argv`` the command that ran, where one did (else None)."""

    log: str
    argv: list[str] | None

    def __init__(self, message: str, *, log: str = "", argv: Sequence[str] | None = None, **attrs: Any) -> None:
        super().__init__(message, log=log, argv=None if argv is None else list(argv), **attrs)


class CompileTimeout(CompileError, TimeoutError):
    """The compiler ran past ``Config.compile_timeout_s`` (``.timeout``) and was killed."""

    timeout: float


class LoadError(SafejitError, RuntimeError):
    """A verified artifact could not be loaded."""


class KernelNotFoundError(SafejitError, LookupError):
    """A module has no kernel of the requested name."""


class ArgumentTypeError(SafejitError, TypeError):
    """A host kernel was called with too few or too many arguments, or one of a kind
    its parameter does not take (``.kernel``; ``.param``: the parameter, ``'x'`` or
    ``#2``, None when no one parameter is at fault). Nothing was called."""

    kernel: str
    param: str | None


class ArgumentValueError(SafejitError, ValueError):
    """A host kernel's argument is of the right kind but cannot be passed: an integer
    out of its C type's range, an array that is not C-contiguous, a read-only array
    for a non-const pointer (``.kernel``, ``.param``). Nothing was called."""

    kernel: str
    param: str | None


class CacheError(SafejitError, OSError):
    """The disk cache cannot be used and ``on_cache_error="raise"``."""
