"""A loopback TCP proxy in front of a Redis server that injects network faults.

Clients connect to :attr:`Proxy.url`; each connection is relayed to the target
by two threads per direction (a reader and a writer with a queue between them,
so that bytes can be held back). The faults, each on all connections at once:

- :meth:`Proxy.reset`: every open connection is reset now (RST, SO_LINGER 0);
- :meth:`Proxy.delay`: every byte relayed from now on waits N seconds first;
- :meth:`Proxy.refuse`: new connections are reset as soon as they are accepted;
- :meth:`Proxy.blackhole`: new connections are accepted but nothing is relayed
  (not even a connection to the target made) until the blackhole ends.

:class:`CuttingProxy` cuts a client's connection right after relaying a chosen
command to the server: the server runs it, the client never sees the reply.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
import time

#: SO_LINGER on, 0 seconds: close() sends a RST instead of a FIN.
_RST = struct.pack("ii", 1, 0)
#: Directions of the delay: bytes to the server, bytes to the client.
UP, DOWN = "up", "down"


def _hard_close(sock: socket.socket) -> None:
    """Closes ``sock`` with a RST, waking any thread blocked reading it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)  # wakes a blocked recv without sending anything
    with contextlib.suppress(OSError):
        sock.close()


def _soft_close(sock: socket.socket) -> None:
    """Closes ``sock`` with a FIN, waking any thread blocked reading it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One relayed connection: the client's socket and the upstream one."""

    def __init__(self, proxy: Proxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.done = False
        #: A command was relayed to be cut: the server's next reply is dropped and the
        #: client's connection closed then (so the server surely ran it first).
        self.cut_pending = False
        self._lock = threading.Lock()

    def start(self, hold_until: float) -> None:
        """Connects upstream (after a blackhole, if one holds) and starts relaying."""
        threading.Thread(target=self._connect, args=(hold_until,), daemon=True).start()

    def _connect(self, hold_until: float) -> None:
        wait = hold_until - time.monotonic()
        if wait > 0 and self.proxy.closing.wait(wait):
            self.close(hard=True)
            return
        try:
            upstream = socket.create_connection(self.proxy.target, timeout=2.0)
            upstream.settimeout(None)
        except OSError:  # the server is down: the client sees a reset
            self.close(hard=True)
            return
        with self._lock:
            if self.done:
                upstream.close()
                return
            self.upstream = upstream
        for source, sink, way in ((self.client, upstream, UP), (upstream, self.client, DOWN)):
            chunks: queue.Queue[tuple[float, bytes, bool] | None] = queue.Queue()
            threading.Thread(target=self._read, args=(source, chunks, way), daemon=True).start()
            threading.Thread(target=self._write, args=(sink, chunks, way), daemon=True).start()

    def _read(
        self,
        source: socket.socket,
        chunks: queue.Queue[tuple[float, bytes, bool] | None],
        direction: str,
    ) -> None:
        try:
            while chunk := source.recv(65536):
                due = time.monotonic() + self.proxy.delay_of(direction)
                chunks.put((due, chunk, direction == UP and self.proxy.cut_after(chunk)))
        except OSError:
            pass
        finally:
            chunks.put(None)

    def _write(
        self,
        sink: socket.socket,
        chunks: queue.Queue[tuple[float, bytes, bool] | None],
        direction: str,
    ) -> None:
        try:
            while (entry := chunks.get()) is not None:
                due, chunk, cut = entry
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)  # the delay itself: this byte is held back until due
                if direction == DOWN and self.cut_pending:
                    break  # the server ran the command: the client never sees the reply
                sink.sendall(chunk)
                if cut:  # cut when the reply comes (or after a while without one)
                    self.cut_pending = True
                    threading.Timer(5.0, self.close).start()
        except OSError:
            pass
        self.close()

    def close(self, hard: bool = False) -> None:
        """Closes both sides (with RSTs when ``hard``); once."""
        with self._lock:
            if self.done:
                return
            self.done = True
        closing = _hard_close if hard else _soft_close
        for sock in (self.client, self.upstream):
            if sock is not None:
                closing(sock)
        self.proxy.forget(self)


class Proxy:
    """A fault-injecting loopback TCP relay to ``127.0.0.1:<target_port>``."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.closing = threading.Event()
        #: Connections accepted, reset by :meth:`reset`, and refused.
        self.accepted = self.resets = self.refused = 0
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        self._delays = {UP: 0.0, DOWN: 0.0}
        self._refuse_until = self._hold_until = 0.0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def url(self) -> str:
        """The proxy's redis:// URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def open_connections(self) -> int:
        """Connections being relayed now."""
        with self._lock:
            return len(self._links)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # the listener was closed
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self.closing.is_set() or time.monotonic() < self._refuse_until:
                    self.refused += 1
                    _hard_close(client)
                    continue
                self.accepted += 1
                link = _Link(self, client)
                self._links.add(link)
                hold_until = self._hold_until
            link.start(hold_until)

    def forget(self, link: _Link) -> None:
        """Drops a closed link."""
        with self._lock:
            self._links.discard(link)

    def delay_of(self, direction: str) -> float:
        """Seconds a byte read now in ``direction`` waits before it is relayed."""
        return self._delays[direction]

    def cut_after(self, chunk: bytes) -> bool:
        """True to cut the client's connection after relaying ``chunk`` (see CuttingProxy)."""
        return False

    # -- the faults ---------------------------------------------------------------

    def reset(self) -> int:
        """Resets every open connection now (both sides get a RST); returns how many."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close(hard=True)
        self.resets += len(links)
        return len(links)

    def delay(self, seconds: float, direction: str = "both") -> None:
        """Holds every byte read from now on ``seconds`` before relaying it (0: no delay).

        ``direction``: ``up`` (to the server), ``down`` (to the clients) or ``both``.
        Bytes already held keep their due time, so the order never changes.
        """
        for name in (UP, DOWN) if direction == "both" else (direction,):
            self._delays[name] = seconds

    def refuse(self, seconds: float) -> None:
        """Resets every new connection for ``seconds`` (0: accept again now)."""
        self._refuse_until = time.monotonic() + seconds

    def blackhole(self, seconds: float) -> None:
        """Accepts new connections for ``seconds`` but relays nothing on them until then."""
        self._hold_until = time.monotonic() + seconds

    def close(self) -> None:
        """Stops accepting and resets every open connection."""
        self.closing.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept
        self.listener.close()
        self.reset()


class CuttingProxy(Proxy):
    """A proxy that cuts connections in mid-command.

    Every ``every``-th chunk from a client that contains all ``markers`` (up to
    ``most`` of them) is relayed to the server, and the client's connection is
    closed when the server's reply comes back, instead of the reply: the server
    ran the command, the client sees a reset.
    """

    def __init__(
        self,
        target_port: int,
        markers: tuple[bytes, ...] = (b"EVALSHA",),
        every: int = 4,
        most: int | None = None,
    ) -> None:
        self.markers, self.every, self.most = markers, every, most
        self.seen = self.cuts = 0
        self._count_lock = threading.Lock()
        super().__init__(target_port)

    def cut_after(self, chunk: bytes) -> bool:
        """Counts chunks with every marker; True for every ``every``-th (up to ``most``)."""
        if not all(marker in chunk for marker in self.markers):
            return False
        with self._count_lock:
            self.seen += 1
            cut = self.seen % self.every == 0 and (self.most is None or self.cuts < self.most)
            self.cuts += cut
        return cut
