"""GPU tests run only where a CUDA device is found (probed, not guessed)."""

from __future__ import annotations

import pytest

from safejit.backends.cuda.launch import has_cuda_device


def pytest_collection_modifyitems(config, items):
    if has_cuda_device():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(skip)
