"""The CUDA backend (imported only when ``backend="cuda"`` is asked for).

- ``backend``: :class:`CudaBackend` — toolchain probes, argv for nvcc, NVRTC compiles.
- ``nvrtc``: NVRTC with a complete dependency closure; ``worker``: the isolated
  NVRTC process.
- ``cubin``: kernel names, parameter layouts and frame sizes from a cubin.
- ``launch``: loading cubins and launching kernels; ``args``: argument packing.
"""
