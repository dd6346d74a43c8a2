"""A private redis-server process for tests that restart or reconfigure a server."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a TLS-only server: its CA, its certificate and key, and a client's."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_options(self) -> dict[str, Any]:
        """redis-py options of a client that presents the client certificate."""
        return {
            "ssl_ca_certs": str(self.ca),
            "ssl_certfile": str(self.client_cert),
            "ssl_keyfile": str(self.client_key),
        }


def make_certificates(
    directory: Path, host: str = "127.0.0.1", names: str | None = None
) -> TlsFiles:
    """A CA, a server certificate for ``host`` and a client certificate, made with openssl.

    ``names`` replaces the certificates' subjectAltName (``IP:HOST,DNS:localhost``).
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is not installed: apt-get install openssl")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    )
    (directory / "san.ext").write_text(f"subjectAltName={names or f'IP:{host},DNS:localhost'}\n")
    for name in ("server", "client"):
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            f"{name}.crt",
        )
    return TlsFiles(
        directory / "ca.crt",
        directory / "server.crt",
        directory / "server.key",
        directory / "client.crt",
        directory / "client.key",
    )


class RedisServer:
    """One redis-server on a free loopback port, its data in ``directory``.

    Args:
        directory: where the server keeps its files (AOF, RDB, log).
        config: extra ``redis-server`` options, e.g. ``{"appendonly": "yes"}``.
        tls: serve TLS only (no plain port), asking clients for certificates of its CA.
    """

    def __init__(
        self, directory: Path, config: dict[str, str] | None = None, tls: TlsFiles | None = None
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: apt-get install redis-server")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.config = {"save": "", "appendonly": "no", **(config or {})}
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's redis:// URL (rediss://, without its TLS files, for a TLS server)."""
        password = self.config.get("requirepass")
        auth = f":{password}@" if password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Starts the server and waits until it answers PING; killed again if it does not."""
        ports = ["--port", str(self.port)]
        if self.tls is not None:
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "yes"]
            ports += ["--tls-cert-file", str(self.tls.server_cert)]
            ports += ["--tls-key-file", str(self.tls.server_key)]
            ports += ["--tls-ca-cert-file", str(self.tls.ca)]
        args = [
            self.binary,
            *ports,
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
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        # The probe does not check the host name: a test may serve a certificate for another.
        options = {**self.tls.client_options(), "ssl_check_hostname": False} if self.tls else {}
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, **options)
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
