"""A seeded cache for the fault tests: one earlier leaf, plus the sandbox shim
and the toolchain probe already in place (so each test starts in milliseconds,
and no fault fires in the toolchain probe instead of the compile)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import safejit
from safejit import faults
from tests.conftest import assert_cache_sound
from tests.fault._support import EARLIER_C, EARLIER_NAME, EXPECTED, only_leaf, staging_entries


@pytest.fixture(scope="session")
def _seed_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    faults.reset()
    root = tmp_path_factory.mktemp("fault-seed") / "cache"
    root.mkdir()
    with safejit.Runtime(config=safejit.Config(cache_dirs=(str(root),))) as rt:
        mod = rt.compile(safejit.Source(EARLIER_C, EARLIER_NAME))
        assert mod.kernel(EARLIER_NAME)(6, 7) == EXPECTED[EARLIER_NAME]
    assert_cache_sound(root)
    assert staging_entries(root) == []
    only_leaf(root)
    return root


@pytest.fixture
def seeded_cache(cache_dir: Path, _seed_template: Path) -> Path:
    """``cache_dir`` holding one sound earlier leaf (kernel ``add``)."""
    shutil.copytree(_seed_template, cache_dir, symlinks=True, dirs_exist_ok=True)
    return cache_dir
