"""The CUDA backend (imported only when ``backend="cuda"`` is asked for).

- ``backend``: :class:`CudaBackend` — toolchain probes, argv for nvcc, NVRTC compiles.
- ``nvrtc``: NVRTC with a complete dependency closure; ``worker``: the isolated
  NVRTC process.
- ``cubin``: kernel names, parameter layouts and frame sizes from a cubin.
- ``launch``: loading cubins and launching kernels; ``args``: argument packing;
  ``streams``: stream handles; ``driver``: the driver through ``cuda.bindings``.
- ``fastpath``: the C launch path (``fastlaunch.c``), built once per user and Python;
  the Python path in ``launch`` is its fallback and its reference.
"""
