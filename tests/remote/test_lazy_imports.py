"""Nothing remote is imported unless a remote is used: ``import safejit`` (and building
remote settings, or importing the trust module) loads no client, codec or crypto library."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("redis", "hiredis", "obstore", "zstandard", "cryptography", "boto3", "botocore", "moto", "valkey")


def modules_after(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def heavy(mods: list[str]) -> list[str]:
    return [m for m in mods if m.split(".")[0] in HEAVY]


@pytest.mark.parametrize(
    "code",
    [
        "import safejit",
        "import safejit; safejit.Config()",
        "import safejit.policy.trust",
        "import safejit.cli",
        "from safejit.cache.remote import RemoteSettings, Breaker\n"
        "RemoteSettings.from_url('redis://u:p@127.0.0.1:6379/0'); RemoteSettings.from_url('s3://bucket-1/p')",
    ],
)
def test_remote_libraries_are_not_imported(code):
    mods = modules_after(code)
    assert heavy(mods) == []
    assert "safejit.cache.remote.redis" not in mods and "safejit.cache.remote.s3" not in mods


def test_opening_a_redis_store_imports_redis_but_not_s3_or_zstd():
    mods = modules_after(
        "from safejit.cache.remote import RemoteSettings, open_store\n"
        "open_store(RemoteSettings.from_url('redis://127.0.0.1:1/0'), tenant='t', backend='cuda')"
    )
    assert "redis" in mods
    # (redis-py itself may look up cryptography's version: that is its import, not ours.)
    assert [m for m in heavy(mods) if m.split(".")[0] not in ("redis", "hiredis", "cryptography")] == []
