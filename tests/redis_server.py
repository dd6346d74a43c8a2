"""A private redis-server process for tests that restart or reconfigure a server."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server on a free loopback port, its data in ``directory``.

    Args:
        directory: where the server keeps its files (AOF, RDB, log).
        config: extra ``redis-server`` options, e.g. ``{"appendonly": "yes"}``.
    """

    def __init__(self, directory: Path, config: dict[str, str] | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: apt-get install redis-server")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.config = {"save": "", "appendonly": "no", **(config or {})}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's redis:// URL."""
        password = self.config.get("requirepass")
        auth = f":{password}@" if password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Starts the server and waits until it answers PING."""
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        for name, value in self.config.items():
            args += [f"--{name}", value]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if client.ping():
                    # AOF loading answers LOADING; wait for a real PONG
                    return
            except (redis.ConnectionError, redis.ResponseError, redis.TimeoutError):
                if self.process.poll() is not None:
                    log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited: {log}") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
            finally:
                client.close()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Sends ``sig`` (SIGKILL by default) and waits for the process to end."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, sig)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        """Stops the server (SIGTERM)."""
        self.kill(signal.SIGTERM)
