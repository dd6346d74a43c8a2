"""A large JSON-lines file in parts: byte ranges that begin at line starts, each read on
its own, so that the parts can be checked side by side in worker processes.

A part ends just after a ``\\n`` (or at the end of the file), so a line, and a ``\\r\\n``,
is never cut: each part reads as the same lines as the whole file read at once.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import IO, Any

#: A JSON-lines file of at least this many bytes is checked in parts, in parallel
#: (smaller ones, stdin and CSV are checked in one pass: that costs less than the workers).
PARALLEL_MIN_BYTES = 8 * 1024 * 1024
#: Worker processes checking the parts (one or none: checked in one pass).
PARALLEL_WORKERS = min(4, os.cpu_count() or 1)
#: Parts per worker: a worker slowed by other work on the machine takes fewer.
PARTS_PER_WORKER = 2

_SCAN = 1 << 16


@dataclass(frozen=True)
class Part:
    """Bytes ``start`` to ``end`` (excluded) of the file ``path``."""

    path: str
    start: int
    end: int

    def reader(self) -> IO[bytes]:
        """The part's bytes, read as a stream."""
        return io.BufferedReader(_Range(self.path, self.start, self.end), _SCAN)


def split(path: str, count: int) -> list[Part]:
    """The file in at most ``count`` parts of about equal size, each beginning at a line
    start; fewer when lines are long, none when the file is empty."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        bounds = [0]
        for k in range(1, count):
            start = _line_start(file, max(size * k // count, bounds[-1] + 1), size)
            if start >= size:
                break
            if start > bounds[-1]:
                bounds.append(start)
    ends = [*bounds[1:], size]
    return [Part(path, start, end) for start, end in zip(bounds, ends, strict=True) if end > start]


def _line_start(file: IO[bytes], at: int, size: int) -> int:
    """The first line start at or after byte ``at`` (``size`` when there is none)."""
    file.seek(at - 1)  # the line starting at `at`, if the byte before it is a newline
    position = at - 1
    while position < size:
        chunk = file.read(_SCAN)
        if not chunk:
            break
        found = chunk.find(b"\n")
        if found >= 0:
            return position + found + 1
        position += len(chunk)
    return size


class _Range(io.RawIOBase):
    """Bytes ``start`` to ``end`` of a file, read unbuffered."""

    def __init__(self, path: str, start: int, end: int) -> None:
        super().__init__()
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by close())
        self._file.seek(start)
        self._left = end - start

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._left <= 0:
            return 0
        with memoryview(buffer) as view:
            read = self._file.readinto(view[: self._left]) or 0
        self._left -= read
        return read

    def close(self) -> None:
        self._file.close()
        super().close()
