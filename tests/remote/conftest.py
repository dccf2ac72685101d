"""Fixtures for the remote engine tests: one Valkey and one moto S3 server per session
(on 127.0.0.1, free ports), reset between tests, a store factory per engine, and
Runtimes standing for nodes (each with its own disk root) on those servers."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import safejit
from safejit.cache.remote import RemoteSettings, RemoteStore, open_store
from tests.conftest import settle

from ._servers import BUCKET, Moto, Valkey, s3_admin, start_moto, start_valkey

TENANT = "t1"
BACKEND = "cuda"


def hexkey(n: int | str) -> str:
    """A 64-hex-digit key made from ``n`` (build keys, deps keys and digests in tests)."""
    import hashlib

    return hashlib.sha256(str(n).encode()).hexdigest()


#: The HMAC key the nodes of a test share, unless it gives them keys of its own.
FLEET_KEY = b"safejit-fleet-test-key-0123456789"


@pytest.fixture(scope="session")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Valkey]:
    server = start_valkey(tmp_path_factory.mktemp("valkey"))
    yield server
    server.stop()


@pytest.fixture
def redis_server(valkey: Valkey) -> Iterator[Valkey]:
    """The session server with an empty keyspace, no ACL users but ``default``, unpaused."""
    admin = valkey.admin()
    admin.execute_command("CLIENT", "UNPAUSE")
    admin.flushall()
    admin.script_flush()
    yield valkey
    admin.execute_command("CLIENT", "UNPAUSE")
    for user in admin.acl_users():
        if user != "default":
            admin.acl_deluser(user)


@pytest.fixture(scope="session")
def moto() -> Iterator[Moto]:
    server = start_moto()
    yield server
    server.server.stop()  # type: ignore[attr-defined]


@pytest.fixture
def s3_url(moto: Moto) -> str:
    """An ``s3://`` URL under a prefix of its own (so tests never see each other's keys)."""
    return f"s3://testing:testing@{BUCKET}/run-{uuid.uuid4().hex[:12]}?endpoint={moto.endpoint}&region=us-east-1"


@pytest.fixture
def s3_client(moto: Moto):
    return s3_admin(moto)


StoreFactory = Callable[..., RemoteStore]


@pytest.fixture
def make_store(request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """``make_store(url, tenant=..., backend=..., **settings)``; closes what it made."""
    made: list[RemoteStore] = []

    def factory(url: str, *, tenant: str = TENANT, backend: str = BACKEND, **kwargs: Any) -> RemoteStore:
        store_kwargs = {k: kwargs.pop(k) for k in ("breaker", "on_transition", "observer") if k in kwargs}
        creds = {k: kwargs.pop(k) for k in ("username", "password") if k in kwargs}
        settings = RemoteSettings.from_url(url, **creds, **kwargs)
        store = open_store(settings, tenant=tenant, backend=backend, **store_kwargs)
        made.append(store)
        return store

    yield factory
    for store in made:
        store.close()


@pytest.fixture(params=["redis", "s3"])
def engine_url(request: pytest.FixtureRequest) -> str:
    """The URL of a fresh namespace on each engine in turn."""
    if request.param == "redis":
        return str(request.getfixturevalue("redis_server").url)
    return str(request.getfixturevalue("s3_url"))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A source root with ``include/inner.h`` (``#define INNER 41``)."""
    root = tmp_path / "project"
    (root / "include").mkdir(parents=True)
    (root / "include" / "inner.h").write_text("#define INNER 41\n")
    settle()  # (a compile right away must not see it as written during it)
    return root


@pytest.fixture
def node(tmp_path: Path, project: Path, redis_server: Valkey) -> Iterator[Callable[..., safejit.Runtime]]:
    """``node(name, **config)``: a Runtime standing for one node (its own disk root) on
    the session's Valkey; closed at the end."""
    made: list[safejit.Runtime] = []

    def factory(name: str, **cfg: Any) -> safejit.Runtime:
        cfg.setdefault("remote", redis_server.url)
        if not cfg.get("signing_key") and not cfg.get("verify_keys"):
            cfg["signing_key"] = FLEET_KEY  # (a remote leaf is used only when signed by a key held here)
        elif not cfg.get("signing_key"):
            cfg.setdefault("remote_mode", "read-only")  # (public keys only: a node that reads)
        cfg.setdefault("backend", "fake")
        cfg.setdefault("source_roots", (str(project),))
        rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(tmp_path / f"disk-{name}"),), **cfg))
        made.append(rt)
        return rt

    yield factory
    for rt in made:
        rt.close()
