"""Python extensions that backends ship as C source (the CUDA launch path,
``backends/cuda/fastlaunch.c``), built for this interpreter like the exec shim:
once per user, source and Python ABI, by the system C compiler, into the private
state dir (``_shim_build``), and imported through the descriptor that was checked
(a file swapped in afterwards is never loaded).

:func:`load` returns the module, or None where it cannot be had here — no C
compiler, no ``Python.h``, a free-threaded Python, a failed build — and says why in
the log; the caller then takes its Python path.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
import sys
import sysconfig
from types import ModuleType

from ._shim_build import ensure_extension
from .statedir import StateDir

__all__ = ["load"]

logger = logging.getLogger("safejit.sandbox.extensions")


def load(source: bytes, name: str, state: StateDir | None, cc: str | None) -> ModuleType | None:
    """The extension module ``name`` (its init function is ``PyInit_<name>``) built from
    ``source`` for this interpreter and imported; None when it cannot be here."""
    why = _unbuildable(state, cc)
    if why is not None:
        logger.info("the %s extension is not built: %s", name, why)
        return None
    include = sysconfig.get_paths()["include"]
    tag = sys.implementation.cache_tag
    salt = f"{tag}:{sysconfig.get_config_var('SOABI')}:{include}".encode()
    assert state is not None and cc is not None
    built = ensure_extension(state, cc, f"{name}-{tag}", source, ["-shared", "-fPIC", f"-I{include}"], salt)
    if built is None:
        return None
    fd, shown = built
    try:
        through = f"/proc/self/fd/{fd}"
        path = through if os.path.exists(through) else shown
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        if spec is None:
            raise ImportError(f"no module spec for {shown}")
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module
    except ImportError as exc:
        logger.info("the %s extension could not be imported: %s", name, exc)
        return None
    finally:
        os.close(fd)


def _unbuildable(state: StateDir | None, cc: str | None) -> str | None:
    if state is None:
        return "no private state dir"
    if cc is None:
        return "no C compiler"
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "a free-threaded Python"
    include = sysconfig.get_paths().get("include", "")
    if not include or not os.path.isfile(os.path.join(include, "Python.h")):
        return f"no Python.h under {include!r}"
    return None
