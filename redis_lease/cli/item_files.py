"""Items from a file for ``add --from-file``: JSON lines or CSV, read as a stream.

JSON lines: one object per line, ``{"id": "acct_1", "payload": {...}}`` (``payload``
optional; blank lines skipped). CSV: a header with an ``id`` column; a ``payload``
column holds JSON text, or else the other columns make the payload, an object of
their texts (empty cells left out). ``-`` is stdin.

The file is read once, checked line by line into a temporary file of checked items
(an id and its payload's JSON text a line), so that nothing is written unless every
line is good, nothing is checked twice, and the file is never held in memory.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from ..errors import InvalidInput
from ..validation import check_id, encode_json, parse_json

FORMATS = ("auto", "jsonl", "csv")
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")


class ItemFile:
    """A file of items, checked whole before any is sent.

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
        self._default_text = "null"
        self._checked: IO[str] | None = None

    @contextmanager
    def opened(self) -> Iterator[ItemFile]:
        """Checks every line (raising InvalidInput at the first bad one) into a temporary
        file of checked items, then yields."""
        self._default_text = encode_json(self.default_payload, "payload")
        with tempfile.TemporaryFile("w+", encoding="utf-8", newline="\n") as checked:
            count, lines = 0, []
            for item_id, text in self._items():
                lines.append(f"{item_id}\t{text}\n")  # no id or JSON text holds a tab or newline
                count += 1
                if len(lines) == 4096:
                    checked.writelines(lines)
                    lines.clear()
            checked.writelines(lines)
            if count == 0:
                raise InvalidInput(f"{self._name()} holds no items")
            self.count, self._checked = count, checked
            try:
                yield self
            finally:
                self._checked = None

    def items(self) -> Iterator[tuple[str, str]]:
        """The checked items, (id, payload JSON text) pairs in file order (inside
        :meth:`opened`)."""
        assert self._checked is not None, "items() is read inside opened()"
        self._checked.seek(0)
        for line in self._checked:
            item_id, _, text = line[:-1].partition("\t")
            yield item_id, text

    # -- reading --------------------------------------------------------------

    def _name(self) -> str:
        return "stdin" if self.path == "-" else repr(self.path)

    def _binary(self) -> IO[bytes]:
        """The bytes to read: the file, or stdin."""
        if self.path == "-":
            return io.BufferedReader(_Unclosed(sys.stdin.buffer))
        try:
            return open(self.path, "rb")
        except OSError as error:
            raise InvalidInput(f"file {self._name()} cannot be read: {error.strerror}") from None

    def _items(self) -> Iterator[tuple[str, str]]:
        binary = self._binary()
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

    def _jsonl(self, lines: Iterator[tuple[int, str]]) -> Iterator[tuple[str, str]]:
        for number, line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                raise InvalidInput(
                    f'{self._where(number)} is not a JSON object ({{"id": ..., "payload": ...}}): '
                    f"{line.strip()[:80]!r}"
                ) from None
            if not isinstance(row, dict) or "id" not in row:
                raise InvalidInput(
                    f'{self._where(number)} has no "id": use {{"id": ..., "payload": ...}}'
                )
            if len(row) > 2 or (len(row) == 2 and "payload" not in row):
                extra = sorted(set(row) - {"id", "payload"})
                raise InvalidInput(
                    f'{self._where(number)} has unknown field {extra[0]!r}: only "id", "payload"'
                )
            yield self._checked_item(number, row["id"], row.get("payload", self.default_payload))

    def _csv(self, lines: Iterator[tuple[int, str]]) -> Iterator[tuple[str, str]]:
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
            number = numbers[-1]
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(names):
                raise InvalidInput(
                    f"{self._where(number)} has {len(row)} cells; the header has {len(names)}"
                )
            payload: Any = self.default_payload
            if payload_at is not None:
                if row[payload_at].strip():
                    payload = parse_json(row[payload_at], f"{self._where(number)}: payload")
            elif len(names) > 1:
                payload = {n: v for i, (n, v) in enumerate(zip(names, row, strict=True))
                           if i != id_at and v != ""}  # fmt: skip
            yield self._checked_item(number, row[id_at].strip(), payload)

    def _where(self, number: int) -> str:
        return f"{self._name()} line {number}"

    def _checked_item(self, number: int, item_id: Any, payload: Any) -> tuple[str, str]:
        """The item of line ``number``: its id and its payload's JSON text, both checked."""
        if not isinstance(item_id, str):
            raise InvalidInput(f"{self._where(number)}: the id must be a string, got {item_id!r}")
        try:
            check_id(item_id, "item id")
            if payload is self.default_payload:
                return item_id, self._default_text
            return item_id, encode_json(payload, "payload")
        except InvalidInput as error:
            raise InvalidInput(f"{self._where(number)}: {error.message}") from None


class _Unclosed(io.RawIOBase):
    """Reads ``source`` (stdin) and leaves it open when closed."""

    def __init__(self, source: IO[bytes]) -> None:
        super().__init__()
        self._source = source

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._source.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


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
