"""A payment provider on loopback for the demo and the examples, and its client.

The server applies corrections (``POST /corrections`` with an ``Idempotency-Key``
header) and answers lookups by key (``GET /corrections/<key>``). It counts every
request and every application by key (``GET /_stats``), so duplicate effects are
counted where they would hurt: at the provider. Faults are set with
``POST /_faults`` (or the constructor) and each applies to the next N requests:

- ``timeout_after_accept``: apply, then hold the response past the client's timeout;
- ``lose_response``: apply, then close the connection without answering;
- ``throttle``: answer 429 with ``Retry-After`` without applying;
- ``max_in_flight``: answer 429 whenever more requests than this are in flight.

With ``honour_keys`` off, a repeated key is applied again (a provider that does
not dedupe): only the client's ledger and lookups then prevent a second effect.

Run it alone: ``python -m redis_lease.demo.provider --port 8700``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..fleet.effects.ledger import EffectFailed, EffectUnknown, Throttled

log = logging.getLogger("redis_lease.demo.provider")

#: A client that went away mid-request (killed, timed out): one of the demo's faults.
_CLIENT_GONE = (ConnectionResetError, BrokenPipeError, TimeoutError)


@dataclass
class ProviderState:
    """What the provider has applied and seen, and the faults still to inject."""

    honour_keys: bool = True
    latency: float = 0.0
    hold_seconds: float = 5.0
    retry_after: float = 0.5
    max_in_flight: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    applications: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    peak_in_flight: int = 0
    throttled: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_fault(self, name: str) -> bool:
        """Consumes one pending fault of this kind; True if there was one."""
        with self.lock:
            left = self.faults.get(name, 0)
            if left <= 0:
                return False
            self.faults[name] = left - 1
            return True

    def stats(self) -> dict[str, Any]:
        """Counts by key, for tests and the demo's report."""
        with self.lock:
            return {
                "applied_keys": len(self.applications),
                "applications": sum(self.applications.values()),
                "duplicate_effects": sum(n - 1 for n in self.applications.values() if n > 1),
                "requests": sum(self.requests.values()),
                "peak_in_flight": self.peak_in_flight,
                "throttled": self.throttled,
                "faults_left": dict(self.faults),
            }


class _Handler(BaseHTTPRequestHandler):
    server: ProviderServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
            self.close_connection = True

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null")

    def do_GET(self) -> None:
        state = self.server.state
        if self.path == "/_stats":
            self._send(200, state.stats())
        elif self.path.startswith("/corrections/"):
            key = urllib.parse.unquote(self.path.removeprefix("/corrections/"))
            with state.lock:
                record = state.records.get(key)
            self._send(200, record) if record else self._send(404, {"error": "no such key"})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        state = self.server.state
        if self.path == "/_faults":
            with state.lock:
                for name, value in self._body().items():
                    if name in ("honour_keys",):
                        state.honour_keys = bool(value)
                    elif name == "max_in_flight":
                        state.max_in_flight = int(value)
                    else:
                        state.faults[name] = int(value)
            self._send(200, {"ok": True})
            return
        if self.path != "/corrections":
            self._send(404, {"error": "not found"})
            return
        key = self.headers.get("Idempotency-Key", "")
        body = self._body()
        if not key:
            self._send(400, {"error": "Idempotency-Key header required"})
            return
        with state.lock:
            state.requests[key] = state.requests.get(key, 0) + 1
            state.in_flight += 1
            state.peak_in_flight = max(state.peak_in_flight, state.in_flight)
            overloaded = 0 < state.max_in_flight < state.in_flight
        try:
            self._correction(state, key, body, overloaded)
        finally:
            with state.lock:
                state.in_flight -= 1

    def _correction(self, state: ProviderState, key: str, body: Any, overloaded: bool) -> None:
        if overloaded or state.take_fault("throttle"):
            with state.lock:
                state.throttled += 1
            self._send(429, {"error": "slow down"}, {"Retry-After": f"{state.retry_after:g}"})
            return
        time.sleep(state.latency)
        with state.lock:
            existing = state.records.get(key) if state.honour_keys else None
            if existing is None:
                existing = {"id": f"corr_{uuid.uuid4().hex[:12]}", "key": key, "request": body}
                state.records[key] = existing
                state.applications[key] = state.applications.get(key, 0) + 1
                replay = False
            else:
                replay = True
        if state.take_fault("lose_response"):
            self.close_connection = True
            self.connection.close()
            return
        if state.take_fault("timeout_after_accept"):
            time.sleep(state.hold_seconds)
        self._send(200 if replay else 201, existing, {"Idempotent-Replayed": str(replay).lower()})


class ProviderServer(ThreadingHTTPServer):
    """The provider on a loopback port (0 picks a free one)."""

    daemon_threads = True

    def __init__(self, port: int = 0, state: ProviderState | None = None) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.state = state or ProviderState()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request is not reported (the demo kills and pauses
        its workers); any other failure is logged, not printed as a traceback."""
        if isinstance(sys.exc_info()[1], _CLIENT_GONE):
            return
        log.exception("provider: a request from %s:%s failed", *client_address[:2])

    @property
    def url(self) -> str:
        """The base URL."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> ProviderServer:
        """Serves in a daemon thread; as a context manager, stops on exit."""
        threading.Thread(target=self.serve_forever, name="provider", daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
        self.server_close()


class ProviderClient:
    """Calls the provider, translating its answers into effect outcomes.

    2xx: the result; 429: Throttled (with Retry-After); other 4xx: EffectFailed;
    5xx, timeouts, resets and lost responses: EffectUnknown.
    """

    def __init__(self, base_url: str, timeout: float = 2.0) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.timeout = timeout

    def _request(
        self, method: str, path: str, body: Any = None, key: str = ""
    ) -> tuple[int, Any, str]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            connection.connect()
        except OSError as error:  # nothing was sent: the attempt may simply be retried
            connection.close()
            detail = f"{type(error).__name__}: {error}"
            raise EffectFailed(f"{method} {path}: not sent: {detail}") from error
        try:
            headers = {"Content-Type": "application/json"}
            if key:
                headers["Idempotency-Key"] = key
            data = json.dumps(body).encode() if body is not None else None
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            payload = json.loads(response.read() or b"null")
            return response.status, payload, response.getheader("Retry-After") or ""
        except (TimeoutError, OSError, http.client.HTTPException) as error:
            raise EffectUnknown(f"{method} {path}: {type(error).__name__}: {error}") from None
        finally:
            connection.close()

    def apply(self, key: str, body: Any) -> Any:
        """Sends a correction under ``key``; returns the provider's record."""
        status, payload, retry_after = self._request("POST", "/corrections", body, key)
        if 200 <= status < 300:
            return payload
        if status == 429:
            raise Throttled(f"provider throttled {key}", float(retry_after or 1))
        if 400 <= status < 500:
            raise EffectFailed(f"provider refused {key}: {status} {payload}")
        raise EffectUnknown(f"provider answered {status} for {key}")

    def lookup(self, key: str) -> Any:
        """The provider's record of ``key``, or None when it never applied it."""
        status, payload, _ = self._request(
            "GET", "/corrections/" + urllib.parse.quote(key, safe="")
        )
        if status == 200:
            return payload
        if status == 404:
            return None
        raise EffectUnknown(f"lookup of {key} answered {status}")

    def stats(self) -> dict[str, Any]:
        """The provider's counts."""
        return dict(self._request("GET", "/_stats")[1])

    def set_faults(self, **faults: Any) -> None:
        """Arms faults (see the module docstring)."""
        self._request("POST", "/_faults", faults)


def main() -> None:
    """Runs the provider in the foreground."""
    parser = argparse.ArgumentParser(description="A payment provider on loopback.")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--no-honour-keys", action="store_true")
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    server = ProviderServer(
        args.port, ProviderState(honour_keys=not args.no_honour_keys, latency=args.latency)
    )
    print(f"provider on {server.url}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
