"""Where the demo's Redis comes from: a given URL, a private redis-server, or fakeredis."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from ..errors import InvalidInput
from ..extras import require
from ..protocol.connection.urls import safe_url


@dataclass(frozen=True)
class Backend:
    """A Redis the demo's processes can all reach."""

    url: str
    description: str
    owned: bool
    #: The embedded fakeredis server: one Python thread serves every process, so it is slower.
    embedded: bool = False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ping(url: str, timeout: float = 10.0) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        client.close()


def _plain_addresses(base: Any) -> Any:
    """fakeredis's TCP server reports CLIENT INFO addresses as Python tuples, which
    redis-py cannot parse (an RQ worker dies at start); this handler writes host:port."""

    class Handler(base):  # type: ignore[misc]
        def setup(self) -> None:
            super().setup()
            info = self.current_client.get_socket()._client_info
            for key in ("addr", "laddr"):
                if isinstance(info.get(key), tuple):
                    info[key] = f"{info[key][0]}:{info[key][1]}"

    return Handler


@contextmanager
def demo_backend(url: str | None, kind: str = "auto") -> Iterator[Backend]:
    """The given URL; else a private redis-server when installed; else embedded fakeredis.

    ``kind`` forces ``redis-server`` or ``embedded``. The embedded backend is a
    fakeredis server (with Lua) on a loopback port so that the worker processes
    can share it.
    """
    if url:
        yield Backend(url, f"Redis at {safe_url(url)}", owned=False)
        return
    binary = shutil.which("redis-server") if kind in ("auto", "redis-server") else None
    if kind == "redis-server" and binary is None:
        raise InvalidInput("redis-server is not installed: apt-get install redis-server")
    if binary:
        with tempfile.TemporaryDirectory(prefix="redis-lease-demo-") as folder:
            port = _free_port()
            process = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    folder,
                    "--logfile",
                    str(Path(folder) / "log"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                private = f"redis://127.0.0.1:{port}/0"
                _wait_ping(private)
                yield Backend(private, f"private redis-server on 127.0.0.1:{port}", owned=True)
            finally:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
        return
    require("demo", "the demo's embedded backend")
    from fakeredis import TcpFakeServer

    server = TcpFakeServer(("127.0.0.1", 0), server_type="redis")
    server.RequestHandlerClass = _plain_addresses(server.RequestHandlerClass)
    # Connections left open by killed workers must not hold up the shutdown.
    server.daemon_threads = True
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, name="fakeredis", daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        embedded = f"redis://127.0.0.1:{port}/0"
        _wait_ping(embedded)
        yield Backend(
            embedded, f"embedded fakeredis on 127.0.0.1:{port}", owned=True, embedded=True
        )
    finally:
        server.shutdown()
        server.server_close()
