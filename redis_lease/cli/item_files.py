"""Items from a file for ``add --from-file``: JSON lines or CSV, read as a stream.

JSON lines: one object per line, ``{"id": "acct_1", "payload": {...}}`` (``payload``
optional; blank lines skipped). CSV: a header with an ``id`` column; a ``payload``
column holds JSON text, or else the other columns make the payload, an object of
their texts (empty cells left out). ``-`` is stdin, copied to a temporary file while
it is checked, so that nothing is written unless every line is good and the file is
never held in memory.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

from ..errors import InvalidInput
from ..lease import Item
from ..validation import check_id, encode_json, parse_json

FORMATS = ("auto", "jsonl", "csv")
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")


class ItemFile:
    """A file of items, read twice: once to check every line, once to add them.

    Args:
        path: the file, or ``-`` for stdin.
        form: ``jsonl``, ``csv`` or ``auto`` (by the name's suffix, else by the first
            character: ``{`` is JSON lines).
        default_payload: the payload of an item whose line gives none.
    """

    def __init__(self, path: str, form: str = "auto", default_payload: Any = None) -> None:
        if form not in FORMATS:
            raise InvalidInput(f"format {form!r} is not one of {', '.join(FORMATS)}")
        self.path = path
        self.form = form
        self.default_payload = default_payload
        self.count = 0
        self._spool: IO[bytes] | None = None

    @contextmanager
    def opened(self) -> Iterator[ItemFile]:
        """Checks every line (raising InvalidInput at the first bad one), then yields."""
        try:
            if self.path == "-":
                self._spool = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
            self.count = sum(1 for _ in self._items(check_only=True))
            if self.count == 0:
                raise InvalidInput(f"{self._name()} holds no items")
            yield self
        finally:
            if self._spool is not None:
                self._spool.close()

    def batches(
        self, size: int, progress: Callable[[int], None] = lambda n: None
    ) -> Iterator[list[Item]]:
        """The items in lists of at most ``size`` (after :meth:`opened` checked them)."""
        batch: list[Item] = []
        for item in self._items():
            batch.append(item)
            if len(batch) == size:
                yield batch
                progress(len(batch))
                batch = []
        if batch:
            yield batch
            progress(len(batch))

    # -- reading --------------------------------------------------------------

    def _name(self) -> str:
        return "stdin" if self.path == "-" else repr(self.path)

    def _binary(self, check_only: bool) -> IO[bytes]:
        """The bytes to read: the file, stdin (copied to the spool) on the first pass, the spool."""
        if self.path != "-":
            try:
                return open(self.path, "rb")
            except OSError as error:
                raise InvalidInput(
                    f"file {self._name()} cannot be read: {error.strerror}"
                ) from None
        assert self._spool is not None
        if check_only:
            return io.BufferedReader(_Tee(sys.stdin.buffer, self._spool))
        self._spool.seek(0)
        return io.BufferedReader(_Tee(self._spool, None))

    def _items(self, check_only: bool = False) -> Iterator[Item]:
        binary = self._binary(check_only)
        with binary, io.TextIOWrapper(binary, encoding="utf-8-sig", newline="") as text:
            lines = _numbered(text, self._name())
            first = _peek(lines)
            if first is None:
                return
            form = self._form(first[1])
            chained = _chain(first, lines)
            if form == "csv":
                yield from self._csv(chained)
            else:
                yield from self._jsonl(chained)

    def _form(self, first_line: str) -> str:
        if self.form != "auto":
            return self.form
        lowered = self.path.lower()
        if lowered.endswith(".csv"):
            return "csv"
        if lowered.endswith(_JSON_SUFFIXES):
            return "jsonl"
        return "jsonl" if first_line.lstrip().startswith("{") else "csv"

    def _jsonl(self, lines: Iterator[tuple[int, str]]) -> Iterator[Item]:
        for number, line in lines:
            if not line.strip():
                continue
            where = f"{self._name()} line {number}"
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                raise InvalidInput(
                    f'{where} is not a JSON object ({{"id": ..., "payload": ...}}): '
                    f"{line.strip()[:80]!r}"
                ) from None
            if not isinstance(row, dict) or "id" not in row:
                raise InvalidInput(f'{where} has no "id": use {{"id": ..., "payload": ...}}')
            extra = sorted(set(row) - {"id", "payload"})
            if extra:
                raise InvalidInput(f'{where} has unknown field {extra[0]!r}: only "id", "payload"')
            yield self._item(where, row["id"], row.get("payload", self.default_payload))

    def _csv(self, lines: Iterator[tuple[int, str]]) -> Iterator[Item]:
        numbers: list[int] = []

        def text_lines() -> Iterator[str]:
            for number, line in lines:
                numbers.append(number)
                yield line

        reader = csv.reader(text_lines())
        try:
            header = next(reader)
        except csv.Error as error:
            raise InvalidInput(f"{self._name()} line 1: not CSV ({error})") from None
        names = [name.strip() for name in header]
        if "id" not in names:
            raise InvalidInput(f"{self._name()} has no 'id' column (CSV header: {header[:5]!r})")
        id_at = names.index("id")
        payload_at = names.index("payload") if "payload" in names else None
        if payload_at is not None and len(names) > 2:
            raise InvalidInput(
                f"{self._name()}: a 'payload' column holds the whole payload; "
                "drop the other columns, or drop 'payload' to make them the payload"
            )
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                raise InvalidInput(
                    f"{self._name()} line {numbers[-1]}: not CSV ({error})"
                ) from None
            where = f"{self._name()} line {numbers[-1]}"
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(names):
                raise InvalidInput(f"{where} has {len(row)} cells; the header has {len(names)}")
            payload: Any = self.default_payload
            if payload_at is not None:
                if row[payload_at].strip():
                    payload = parse_json(row[payload_at], f"{where}: payload")
            elif len(names) > 1:
                payload = {n: v for i, (n, v) in enumerate(zip(names, row, strict=True))
                           if i != id_at and v != ""}  # fmt: skip
            yield self._item(where, row[id_at].strip(), payload)

    def _item(self, where: str, item_id: Any, payload: Any) -> Item:
        if not isinstance(item_id, str):
            raise InvalidInput(f"{where}: the id must be a string, got {item_id!r}")
        try:
            check_id(item_id, "item id")
            encode_json(payload, "payload")
        except InvalidInput as error:
            raise InvalidInput(f"{where}: {error.message}") from None
        return Item(item_id, payload)


class _Tee(io.RawIOBase):
    """Reads ``source`` and writes what it read to ``copy`` (None: no copy)."""

    def __init__(self, source: IO[bytes], copy: IO[bytes] | None) -> None:
        super().__init__()
        self._source, self._copy = source, copy

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._source.read(len(buffer))
        if self._copy is not None and data:
            self._copy.write(data)
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._copy is not None:
            self._copy.flush()
        super().close()


def _numbered(text: IO[str], name: str) -> Iterator[tuple[int, str]]:
    """The lines with their numbers (from 1); a byte that is not UTF-8 is InvalidInput."""
    number = 0
    try:
        for number, line in enumerate(text, start=1):
            yield number, line
    except UnicodeDecodeError:
        raise InvalidInput(f"{name} is not UTF-8 (near line {number + 1})") from None


def _peek(lines: Iterator[tuple[int, str]]) -> tuple[int, str] | None:
    """The first line that is not blank, or None."""
    for number, line in lines:
        if line.strip():
            return number, line
    return None


def _chain(first: tuple[int, str], rest: Iterator[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    yield first
    yield from rest
