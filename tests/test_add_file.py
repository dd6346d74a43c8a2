"""Adding many items: ``add --from-file`` and LeaseStore.add/add_checked send many
``add_items`` calls per round trip, a window of items at a time while the next is read, and
keep their guarantees: every line checked before anything is written, idempotent re-adds,
an id given twice counted once as added and then as already there (its first payload
kept), the counts printed, the progress, a refused call stopping the rest."""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from redis_lease import Item, LeaseStore
from redis_lease.cli import item_parts
from redis_lease.cli.item_files import ItemFile
from redis_lease.protocol.scripts import Call, Command, Scripts
from redis_lease.protocol.store.add import ADD_BATCH, ADD_PIPELINE, _Window, window_size
from tests import test_cli as base
from tests.test_cli import ENV_NAMES, Cli, assert_error

cli = base.cli


def item_lines(ids: Sequence[str], payload: Callable[[int], Any] = lambda i: {"n": i}) -> str:
    """JSON lines of items ``ids``, the i-th with ``payload(i)``."""
    return "".join(json.dumps({"id": i, "payload": payload(n)}) + "\n" for n, i in enumerate(ids))


def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The add_items calls of each round trip (Scripts.many) from now on."""
    seen: list[int] = []
    original = Scripts.many

    def spy(self: Scripts, calls: Sequence[Call | Command]) -> list[Any]:
        seen.append(sum(1 for c in calls if isinstance(c, Call) and c.name == "add_items"))
        return original(self, calls)

    monkeypatch.setattr(Scripts, "many", spy)
    return seen


def test_a_file_goes_many_calls_a_round_trip_and_again_changes_nothing(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 2 * window_size(4) + 123  # three windows: the next is read while one is sent
    path = tmp_path / "items.jsonl"
    path.write_text(item_lines([f"acct_{n:06d}" for n in range(count)]))
    trips = round_trips(monkeypatch)
    added = cli.ok("add", "r", "-f", str(path), "--shards", "4")
    assert added == {"run": "r", "added": count, "existing": 0, "shards": 4}
    calls = sum(trips)
    assert calls >= math.ceil(count / ADD_BATCH) and max(trips) == ADD_PIPELINE, trips
    assert len(trips) <= math.ceil(calls / ADD_PIPELINE) + 3, trips  # at most one short a window
    store = LeaseStore(cli.client, prefix=cli.prefix, url=cli.url)
    assert store.status("r").counts["pending"] == count
    for n in (0, count // 2, count - 1):
        assert cli.ok("inspect", "r", f"acct_{n:06d}")["payload"] == {"n": n}

    before = cli.snapshot()
    again = cli.ok("add", "r", "-f", str(path))
    assert again == {"run": "r", "added": 0, "existing": count, "shards": 4}
    assert cli.snapshot() == before


def test_an_id_given_twice_counts_once_added_then_there_with_its_first_payload(
    cli: Cli, tmp_path: Path
) -> None:
    ids = ["twice", *(f"x{n}" for n in range(window_size(1) + 10)), "twice", "once", "once"]
    path = tmp_path / "items.jsonl"
    path.write_text(item_lines(ids, lambda n: {"line": n + 1}))
    added = cli.ok("add", "r", "-f", str(path))
    assert (added["added"], added["existing"]) == (len(ids) - 2, 2)
    assert cli.ok("inspect", "r", "twice")["payload"] == {"line": 1}  # the first line's
    assert cli.ok("inspect", "r", "once")["payload"] == {"line": len(ids) - 1}


def test_a_bad_last_line_of_a_long_file_writes_nothing(cli: Cli, tmp_path: Path) -> None:
    count = window_size(1) + 5
    path = tmp_path / "items.jsonl"
    path.write_text(item_lines([f"i{n}" for n in range(count)]) + '{"id": "bad id"}\n')
    assert_error(cli("add", "r", "-f", str(path)), 2, f"line {count + 1}", "item id")
    assert cli.keys() == []


def test_a_long_stdin_is_added_after_it_is_checked(cli: Cli) -> None:
    count = window_size(1) + 7
    piped = item_lines([f"s{n}" for n in range(count)])
    result = base.runner.invoke(
        base.app,
        ["--url", cli.url, "--prefix", cli.prefix, "add", "r", "-f", "-", "--json"],
        input=piped,
        env=dict.fromkeys(ENV_NAMES),
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["added"] == count
    bad = base.runner.invoke(
        base.app,
        ["--url", cli.url, "--prefix", cli.prefix, "add", "r2", "-f", "-"],
        input=piped + "not json\n",
        env=dict.fromkeys(ENV_NAMES),
    )
    assert bad.exit_code == 2 and f"line {count + 1}" in bad.stderr
    keys = cli.keys()
    assert keys and not [k for k in keys if b"r2" in k]


def test_a_refused_window_stops_the_rest(cli: Cli, tmp_path: Path) -> None:
    cli.ok("add", "r", "first")
    LeaseStore(cli.client, prefix=cli.prefix, url=cli.url).set_closed("r", True)
    path = tmp_path / "items.jsonl"
    path.write_text(item_lines([f"i{n}" for n in range(2 * window_size(1))]))
    assert_error(cli("add", "r", "-f", str(path)), 4, "closed")
    assert cli.ok("status", "r")["counts"]["pending"] == 1


def test_store_add_of_many_items_sorts_out_each_and_reports_progress(store: LeaseStore) -> None:
    count = 2 * window_size(3) + 1
    store.add("r", [Item(f"e{n}") for n in range(0, count, 7)], shards=3)
    added, existing = store.add("r", [Item(f"e{n}", {"n": n}) for n in range(count)])
    assert existing == [f"e{n}" for n in range(0, count, 7)]
    assert added == [f"e{n}" for n in range(count) if n % 7]
    heard: list[int] = []
    pairs = [(f"p{n}", "null") for n in range(count)] + [("p0", "null")]
    assert store.add_checked("r", pairs, progress=heard.append) == (count, 1)
    assert sum(heard) == count + 1 and len(heard) >= 3
    assert store.status("r").counts["pending"] == count + len(added) + len(existing)


def test_a_window_holding_an_id_of_one_being_sent_waits_for_it(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows go out two at a time, but not two holding the same id: the first line wins."""
    size = window_size(1)
    pairs = [("dup", '"first"'), *((f"u{n}", "null") for n in range(size - 1))]
    pairs += [("second", "null"), ("dup", '"later"')]  # the second window
    second = "second"
    events: list[tuple[str, str]] = []
    second_started = threading.Event()
    original = _Window.send

    def send(window: _Window) -> list[bool]:
        first = window.pairs[0][0]
        events.append(("start", first))
        if first == "dup":  # give the second window the chance to overtake, were it sent
            second_started.wait(timeout=2)
        elif first == second:
            second_started.set()
        try:
            return original(window)
        finally:
            events.append(("end", first))

    monkeypatch.setattr(_Window, "send", send)
    assert store.add_checked("r", pairs) == (size + 1, 1)
    assert events.index(("end", "dup")) < events.index(("start", second)), events
    assert store.item("r", "dup").payload == "first"


def in_parts(monkeypatch: pytest.MonkeyPatch) -> list[list[item_parts.Part]]:
    """Files of 1 KiB and more checked in parts by two workers from now on; the parts of
    each file so checked."""
    monkeypatch.setattr(item_parts, "PARALLEL_MIN_BYTES", 1024)
    monkeypatch.setattr(item_parts, "PARALLEL_WORKERS", 2)
    seen: list[list[item_parts.Part]] = []
    original = item_parts.split

    def spy(path: str, count: int) -> list[item_parts.Part]:
        seen.append(original(path, count))
        return seen[-1]

    monkeypatch.setattr(item_parts, "split", spy)
    return seen


def checked_items(path: Path, default: Any = None) -> list[tuple[str, str]]:
    """The file's checked items, read inside ``opened``."""
    source = ItemFile(str(path), default_payload=default)
    with source.opened():
        items = list(source.items())
    assert source.count == len(items)
    return items


def test_split_parts_begin_at_line_starts_and_cover_the_file(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    data = b"".join(b'{"id": "i%d"}' % n + (b"\r\n" if n % 3 else b"\n") for n in range(500))
    path.write_bytes(data)
    parts = item_parts.split(str(path), 7)
    assert len(parts) == 7
    assert parts[0].start == 0 and parts[-1].end == len(data)
    for before, after in itertools.pairwise(parts):
        assert before.end == after.start and data[after.start - 1 : after.start] == b"\n"
        with after.reader() as reader:
            assert reader.read() == data[after.start : after.end]
    one_line = tmp_path / "one.jsonl"
    one_line.write_bytes(b'{"id": "a", "payload": "' + b"x" * 5000 + b'"}\n')
    assert len(item_parts.split(str(one_line), 4)) == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert item_parts.split(str(empty), 4) == []


def test_a_file_checked_in_parts_gives_the_items_of_one_pass_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = ["\ufeff" + json.dumps({"id": "first", "payload": [1, "\u00e9"]}) + "\r\n"]
    for n in range(3000):
        row: dict[str, Any] = {"id": f"acct_{n:05d}"}
        if n % 7:
            row["payload"] = {"n": n, "deep": {"list": [n, None, True]}, "s": "a\tb"}
        lines.append(json.dumps(row) + ("\r\n" if n % 5 == 0 else "\n"))
        if n % 11 == 0:
            lines.append("   \n" if n % 2 else "\n")  # blank lines are skipped
    path = tmp_path / "items.txt"  # no suffix: JSON lines by the first line, after the BOM
    path.write_text("".join(lines), encoding="utf-8")
    one_pass = checked_items(path, default={"d": 1})
    parts = in_parts(monkeypatch)
    checked = checked_items(path, default={"d": 1})
    assert len(parts) == 1 and len(parts[0]) == 2 * item_parts.PARTS_PER_WORKER
    assert checked == one_pass and len(checked) == 3001
    assert checked[0] == ("first", '[1,"\u00e9"]') and checked[1] == ("acct_00000", '{"d":1}')


def test_a_file_checked_in_parts_names_its_first_bad_line_and_writes_nothing(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 4000
    rows = [json.dumps({"id": f"i{n}", "payload": {"n": n}}) + "\n" for n in range(count)]
    rows.insert(10, "\n")  # a blank line early on: line numbers still count it
    late, early = count - 100, count // 3  # in the last part, in the second
    rows[late] = '{"id": "bad id"}\n'
    path = tmp_path / "items.jsonl"
    parts = in_parts(monkeypatch)
    path.write_text("".join(rows))
    assert_error(cli("add", "r", "-f", str(path)), 2, f"line {late + 1}:", "item id")
    rows[early] = "not json\n"
    path.write_text("".join(rows))
    assert_error(cli("add", "r", "-f", str(path)), 2, f"line {early + 1} is not a JSON object")
    assert cli.keys() == []

    def part_of(line: int, found: list[item_parts.Part]) -> int:
        at = len("".join(rows[:line]).encode())
        return next(n for n, part in enumerate(found) if part.start <= at < part.end)

    assert len(parts) == 2  # each file was checked in parts; the bad lines in different ones
    assert [part_of(late, found) for found in parts] == [3, 3]
    assert part_of(early, parts[1]) == 1
    rows[early] = rows[late] = "\n"
    path.write_text("".join(rows))
    assert cli.ok("add", "r", "-f", str(path))["added"] == count - 2
