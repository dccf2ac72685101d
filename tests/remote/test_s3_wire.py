"""What an S3 store puts on the wire, read by a listener that records each request's
headers: the credentials safejit chose, all of them and nothing else."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from safejit.config import Config

pytest.importorskip("obstore")


def _serve(srv: socket.socket, answer: Callable[[socket.socket, bytes], None]) -> None:
    """On a thread: accept each connection on ``srv``, read a request's head, and have
    ``answer(conn, head)`` reply (a peer gone meanwhile ends that one quietly)."""

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    got = conn.recv(65536)
                    if not got:
                        break
                    data += got
                with contextlib.suppress(OSError):
                    answer(conn, data)

    threading.Thread(target=serve, daemon=True).start()


@pytest.fixture
def listener() -> Iterator[tuple[int, list[str]]]:
    """A port that answers every request 404 and keeps each request's head, lowercased."""
    heads: list[str] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def answer(conn: socket.socket, head: bytes) -> None:
        heads.append(head.decode("latin-1").lower())
        conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    _serve(srv, answer)
    yield srv.getsockname()[1], heads
    srv.close()


def _ping(url: str) -> None:
    from safejit.cache.remote import open_store

    settings = Config(remote=url, signing_key=b"0123456789abcdef0123").remote_settings(env=True)
    assert settings is not None
    store = open_store(settings, tenant="t1", backend="fake")
    try:
        store.ping()
    finally:
        store.close()


def test_a_key_in_the_url_goes_with_its_own_token_only(listener, monkeypatch):
    """With a key in the URL, obstore added the environment's AWS_SESSION_TOKEN to it (the
    machine's role token, sent to whatever endpoint the URL names) and took
    AWS_SKIP_SIGNATURE from it (every request unsigned). Requests are signed by the URL's
    key, with the session token configured for it or none."""
    port, heads = listener
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-of-the-machines-role")
    monkeypatch.setenv("AWS_SKIP_SIGNATURE", "true")
    monkeypatch.setenv("AWS_UNSIGNED_PAYLOAD", "true")
    url = f"s3://AKIAURLKEY0000000000:urlsecret@bucket/p?endpoint=http://127.0.0.1:{port}&region=us-east-1"
    _ping(url)
    assert heads, "nothing was sent"
    for head in heads:
        assert "token-of-the-machines-role" not in head and "x-amz-security-token" not in head
        assert "credential=akiaurlkey0000000000/" in head  # (signed, by the URL's key)
        assert "x-amz-content-sha256: unsigned-payload" not in head
    heads.clear()
    monkeypatch.setenv("SAFEJIT_REMOTE_SESSION_TOKEN", "the-url-keys-own-token")
    _ping(url)
    assert heads and all("x-amz-security-token: the-url-keys-own-token" in h for h in heads)
    assert not any("token-of-the-machines-role" in h for h in heads)


def test_a_body_past_the_range_asked_for_is_never_read_whole():
    """A GET asks for a range of at most the cap and a byte; a server that answered with
    that range and a body that runs on (a 206 of 16 GiB) was read until the deadline: the
    process grew by what the link carried (hundreds of MiB in half a second). The reply
    is ``oversize``, and the client stops reading within a few MiB."""
    from safejit.cache.remote import RemoteError, RemoteSettings, open_store

    sent = [0]
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    chunk = bytes(1 << 20)

    def answer(conn: socket.socket, _: bytes) -> None:
        conn.sendall(
            b'HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-45/46\r\nETag: "x"\r\n'
            b"Last-Modified: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: 17179869184\r\n\r\n"
        )
        while sent[0] < 1 << 34:
            conn.sendall(chunk)
            sent[0] += len(chunk)

    _serve(srv, answer)
    port = srv.getsockname()[1]
    settings = RemoteSettings.from_url(f"s3://k:s@bucket/p?endpoint=http://127.0.0.1:{port}&region=us-east-1")
    store = open_store(settings, tenant="t1", backend="fake")
    try:
        with pytest.raises(RemoteError) as info:
            store.get_blob("ab" * 32, size=45)
        assert info.value.reason == "oversize"
    finally:
        store.close()
        srv.close()
    assert sent[0] < 64 << 20, f"{sent[0] >> 20} MiB sent for a 46-byte range"
