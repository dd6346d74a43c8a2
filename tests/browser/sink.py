"""A sink a hostile value would call: an HTTP server on a free loopback port of its own that
records every request it gets (and answers 204), so a test can show none came."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Sink:
    """The sink's URL and the requests it got (method and path)."""

    url: str
    hits: list[str] = field(default_factory=list)


@contextmanager
def sink() -> Iterator[Sink]:
    """A sink listening on 127.0.0.1 until the block ends."""
    made: list[Sink] = []

    class Recorder(BaseHTTPRequestHandler):
        def _record(self) -> None:
            made[0].hits.append(f"{self.command} {self.path}")
            self.send_response(204)
            self.end_headers()

        do_GET = do_POST = do_HEAD = _record

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the hits are the record."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    made.append(Sink(f"http://127.0.0.1:{server.server_address[1]}/sink"))
    thread = threading.Thread(target=server.serve_forever, name="sink", daemon=True)
    thread.start()
    try:
        yield made[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
