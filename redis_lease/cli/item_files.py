"""Items from a file for ``add --from-file``: JSON lines or CSV, read as a stream.

JSON lines: one object per line, ``{"id": "acct_1", "payload": {...}}`` (``payload``
optional; blank lines skipped). CSV: a header with an ``id`` column; a ``payload``
column holds JSON text, or else the other columns make the payload, an object of
their texts (empty cells left out). ``-`` is stdin.

The file is read once, checked line by line into a temporary file of checked items
(an id and its payload's JSON text a line), so that nothing is written unless every
line is good, nothing is checked twice, and the file is never held in memory. A large
JSON-lines file is checked in parts (:mod:`.item_parts`) by worker processes, each into
a file of its own, read in file order; a bad line is named as a check in one pass would.
"""

from __future__ import annotations

import csv
import io
import json
import multiprocessing
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack, contextmanager
from typing import IO, Any

from ..errors import InvalidInput
from ..protocol.validation import check_id, encode_json, parse_json
from . import item_parts
from .item_parts import Part

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
        self._checked: list[IO[str]] | None = None

    @contextmanager
    def opened(self) -> Iterator[ItemFile]:
        """Checks every line (raising InvalidInput at the first bad one) into temporary
        files of checked items, then yields."""
        self._default_text = encode_json(self.default_payload, "payload")
        with ExitStack() as stack:
            parts = self._parts()
            done = self._checked_in_parts(parts, stack) if parts else None
            if done is None:
                checked = stack.enter_context(
                    tempfile.TemporaryFile("w+", encoding="utf-8", newline="\n")
                )
                done = [checked], _write_checked(self._items(), checked)
            files, count = done
            if count == 0:
                raise InvalidInput(f"{self._name()} holds no items")
            self.count, self._checked = count, files
            try:
                yield self
            finally:
                self._checked = None

    def items(self) -> Iterator[tuple[str, str]]:
        """The checked items, (id, payload JSON text) pairs in file order (inside
        :meth:`opened`)."""
        assert self._checked is not None, "items() is read inside opened()"
        for checked in self._checked:
            checked.seek(0)
            for line in checked:
                item_id, _, text = line[:-1].partition("\t")
                yield item_id, text

    # -- checking in parts ----------------------------------------------------

    def _parts(self) -> list[Part]:
        """The parts to check side by side: none unless the file is JSON lines, a regular
        file of at least :data:`~.item_parts.PARALLEL_MIN_BYTES`, and there are workers."""
        workers = item_parts.PARALLEL_WORKERS
        if self.path == "-" or workers < 2 or self.form == "csv":
            return []
        try:
            found = os.stat(self.path)
        except OSError:
            return []  # the one pass says why it cannot be read
        if not stat.S_ISREG(found.st_mode) or found.st_size < item_parts.PARALLEL_MIN_BYTES:
            return []
        if self._form_of_file() != "jsonl":
            return []
        parts = item_parts.split(self.path, workers * item_parts.PARTS_PER_WORKER)
        return parts if len(parts) > 1 else []

    def _form_of_file(self) -> str | None:
        """The file's form, read from its first line when need be (None: no line)."""
        if self.form != "auto":
            return self.form
        with self._binary() as binary, io.TextIOWrapper(binary, "utf-8-sig", newline="") as text:
            first = _peek(iter(_Lines(text, self._name())))
        return None if first is None else self._form(first[1])

    def _checked_in_parts(
        self, parts: list[Part], stack: ExitStack
    ) -> tuple[list[IO[str]], int] | None:
        """Checks the parts in worker processes, each into a file of its own; returns the
        files in file order and the item count. Raises InvalidInput for the first bad line
        in file order; None when the workers could not run (then check in one pass)."""
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="redis-lease-add-"))
        outs = [os.path.join(folder, f"part-{n}") for n in range(len(parts))]
        workers = min(item_parts.PARALLEL_WORKERS, len(parts))
        lines = count = 0
        try:
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(workers, mp_context=context) as pool:
                futures = [
                    pool.submit(_check_part, self, p, o) for p, o in zip(parts, outs, strict=True)
                ]
                for part, future in zip(parts, futures, strict=True):
                    done = future.result()
                    if done is None:  # a bad line: named with its number in the whole file
                        # the parts still checking finish before their folder is removed
                        pool.shutdown(wait=True, cancel_futures=True)
                        self._recheck(part, lines + 1)
                    else:
                        lines, count = lines + done[0], count + done[1]
        except BrokenProcessPool:
            return None
        files: list[IO[str]] = [
            stack.enter_context(open(o, encoding="utf-8", newline="\n"))  # noqa: SIM115
            for o in outs
        ]
        return files, count

    @contextmanager
    def _part_lines(self, part: Part, first: int) -> Iterator[_Lines]:
        """The part's lines, numbered from ``first``."""
        encoding = "utf-8-sig" if part.start == 0 else "utf-8"  # a BOM only begins the file
        with part.reader() as binary, io.TextIOWrapper(binary, encoding, newline="") as text:
            yield _Lines(text, self._name(), first)

    def _recheck(self, part: Part, first: int) -> None:
        """Checks a part holding a bad line again, its lines numbered from ``first``:
        raises InvalidInput for the first bad line."""
        with self._part_lines(part, first) as lines:
            for _ in self._jsonl(iter(lines)):
                pass
        raise InvalidInput(f"{self._name()}: a line after line {first - 1} is not acceptable")

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
            lines = iter(_Lines(text, self._name()))
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


class _Lines:
    """The lines of ``text`` with their numbers, from ``first``; a byte that is not UTF-8
    is InvalidInput. ``last`` is the number of the last line read."""

    def __init__(self, text: IO[str], name: str, first: int = 1) -> None:
        self._text, self._name, self.last = text, name, first - 1

    def __iter__(self) -> Iterator[tuple[int, str]]:
        try:
            for number, line in enumerate(self._text, start=self.last + 1):
                self.last = number
                yield number, line
        except UnicodeDecodeError:
            raise InvalidInput(f"{self._name} is not UTF-8 (near line {self.last + 1})") from None


def _write_checked(items: Iterable[tuple[str, str]], checked: IO[str]) -> int:
    """Writes checked items to ``checked``, an id and its payload's JSON text a line;
    returns how many."""
    count, lines = 0, []
    for item_id, text in items:
        lines.append(f"{item_id}\t{text}\n")  # no id or JSON text holds a tab or newline
        count += 1
        if len(lines) == 4096:
            checked.writelines(lines)
            lines.clear()
    checked.writelines(lines)
    return count


def _check_part(source: ItemFile, part: Part, out: str) -> tuple[int, int] | None:
    """In a worker process: checks a part's lines into the file ``out``; returns (its
    lines, its items), or None when it holds a bad line."""
    with (
        source._part_lines(part, 1) as lines,
        open(out, "w", encoding="utf-8", newline="\n") as checked,
    ):
        try:
            count = _write_checked(source._jsonl(iter(lines)), checked)
        except InvalidInput:
            return None
    return lines.last, count


def _peek(lines: Iterator[tuple[int, str]]) -> tuple[int, str] | None:
    """The first line that is not blank, or None."""
    for number, line in lines:
        if line.strip():
            return number, line
    return None


def _chain(first: tuple[int, str], rest: Iterator[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    yield first
    yield from rest
