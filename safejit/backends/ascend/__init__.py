"""The Ascend backend (bisheng + ld.lld; CANN's runtime imported lazily).

- ``backend``: :class:`AscendBackend` — toolkit discovery, argv, kernel names.
- ``launch``: loading through ACL and packing arguments to the kernel ABI.
"""
