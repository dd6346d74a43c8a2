"""The operator commands: runs, items, dead, inspect, add --from-file, requeue, and their output.

Each friction an operator met has a test that failed before its fix: no command listed
dead items; requeue of an unknown item exited 0; add took items only as arguments and
--payload only as text; run ids wrapped at 80 columns; decision times came in two forms;
a final run showed a stale projected finish; a commit with a different result said
nothing; a database the server lacks was an "unexpected" exit 1. Commands run in-process
(typer's CliRunner: stdout is not a terminal, so tables are plain lines), on the real
Redis and on the embedded backend; the terminal tables are forced with TTY_COMPATIBLE=1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import redis

from redis_lease import LeaseStore
from redis_lease.fleet.effects.provider_gate import ProviderGate
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.schedule import pause
from redis_lease.protocol.leases import Item
from tests import test_cli as base
from tests.test_cli import ENV_NAMES, Cli, assert_error, command, shell

cli = base.cli
real_cli = base.real_cli

LONG_RUN = "payment-reconciliation-of-the-european-accounts-region-west:2026-12-02"


def store_of(cli: Cli) -> LeaseStore:
    return LeaseStore(cli.client, prefix=cli.prefix, url=cli.url)


def dead_item(cli: Cli, run: str, item: str, error: str) -> None:
    """Claims the item and fails it for good."""
    lease = cli.ok("claim", run, item, "-w", "w1")
    cli.ok("fail", run, item, "-t", str(lease["token"]), "-e", error, "--permanent")


# -- dead and requeue -----------------------------------------------------------


def test_dead_lists_dead_items_with_their_last_errors(cli: Cli) -> None:
    cli.ok("add", "r", "a", "b", "c", "--shards", "2")
    dead_item(cli, "r", "a", "provider 503: upstream down")
    dead_item(cli, "r", "c", "account closed")
    listed = cli.ok("dead", "r")
    assert listed["next_cursor"] is None
    rows = {row["item"]: row for row in listed["items"]}
    assert set(rows) == {"a", "c"}
    assert rows["a"]["error"] == "provider 503: upstream down"
    assert rows["a"]["attempts"] == 1 and rows["a"]["dead_at"].endswith("+00:00")
    assert [e["error"] for e in rows["c"]["errors"]] == ["account closed"]
    human = cli("dead", "r")
    assert human.exit_code == 0, human.output
    lines = human.stdout.splitlines()
    assert lines[0] == "dead items of run r"
    assert lines[1].split("\t") == ["item", "attempts", "dead at", "last error"]
    assert any(
        line.startswith("a\t1\t") and "provider 503: upstream down" in line for line in lines
    )
    cli.ok("requeue", "r", "--item", "a")
    assert [row["item"] for row in cli.ok("dead", "r")["items"]] == ["c"]


def test_dead_of_a_run_with_none_and_errors(cli: Cli) -> None:
    cli.ok("add", "r", "a")
    assert cli.ok("dead", "r") == {"run": "r", "items": [], "next_cursor": None}
    assert cli("dead", "r").stdout == "run r: no dead items\n"
    assert_error(cli("dead", "nope"), 5, "nope")
    assert_error(cli("dead", "r", "--cursor", "x"), 2, "cursor")
    assert_error(cli("dead", "r", "--cursor", "3:0"), 2, "cursor")
    assert_error(cli("dead", "r", "--limit", "0"), 2, "limit")


def test_requeue_of_an_unknown_item_exits_5_and_requeues_nothing(cli: Cli) -> None:
    cli.ok("add", "r", "a", "b")
    dead_item(cli, "r", "a", "boom")
    before = cli.snapshot()
    result = cli("requeue", "r", "a", "nosuch")
    assert_error(result, 5, "'nosuch'", "not found", "nothing requeued")
    assert_error(cli("requeue", "r", "--item", "zz", "--item", "a"), 5, "'zz'")
    assert cli.snapshot() == before
    assert cli.ok("inspect", "r", "a")["state"] == "dead"
    assert_error(cli("requeue", "nope", "--item", "a"), 5, "nope")
    # Known items: requeued (dead) or left alone (not dead), exit 0.
    done = cli("requeue", "r", "-i", "a", "-i", "b")
    assert done.exit_code == 0, done.output
    assert done.stdout == "run r: 1 item(s) requeued (1 named item(s) not dead, left as they are)\n"
    assert cli.ok("inspect", "r", "a")["state"] == "pending"


def test_requeue_on_a_partial_run_says_nothing_runs_until_resume(cli: Cli) -> None:
    run = "nightly:2026-12-01"
    job_run(store_of(cli), run, "nightly")
    dead_item(cli, run, "a", "boom")
    Runs(store_of(cli)).transition(run, "running", "partial", "deadline passed")
    done = cli("requeue", run)
    assert done.exit_code == 0, done.output
    assert done.stdout == (
        f"run {run}: 1 item(s) requeued; the run is partial: nothing runs until resumed "
        f"(redis-lease resume {run})\n"
    )
    assert cli("requeue", run).stdout == f"run {run}: 0 item(s) requeued\n"


def test_an_unknown_run_points_at_the_runs_command(cli: Cli) -> None:
    hint = "run 'nope' not found (`redis-lease runs` lists the runs)"
    assert_error(cli("status", "nope"), 5, hint, "add items to create it")
    assert_error(cli("resume", "nope"), 5, hint)


def test_status_says_why_the_recent_rate_is_missing_before_the_first_sample(cli: Cli) -> None:
    cli.ok("add", "r", "a")
    assert "recent rate (items/s)\t- (no sample yet)" in cli("status", "r").stdout.splitlines()
    store = store_of(cli)
    store.client.hset(store.keys.run("r"), "rate_per_s", "2.5")
    assert "recent rate (items/s)\t2.5" in cli("status", "r").stdout.splitlines()


def test_status_shows_the_runs_own_rate_not_its_retry_tails(cli: Cli) -> None:
    """30 items done in 180 s: 0.167 items/s, whatever the tick's last sample said (the
    slow tail of retries: 0.35); a final run has no recent rate."""
    cli.ok("add", "r", *[f"i{n}" for n in range(30)])
    store = store_of(cli)
    for n in range(30):
        store.commit(store.claim("r", f"i{n}", "w1"))
    Runs(store).transition("r", "running", "succeeded", "no item left to work")
    ended = int(store.client.hget(store.keys.run("r"), "state_at"))
    store.client.hset(
        store.keys.run("r"), mapping={"created_at": ended - 180_000, "rate_per_s": "0.35"}
    )
    shown = cli("status", "r").stdout.splitlines()
    assert "rate (items/s)\t0.167" in shown, shown
    assert "recent rate (items/s)\t-" in shown, shown


def test_a_run_past_its_deadline_is_shown_late_open_or_final(cli: Cli) -> None:
    store = store_of(cli)
    hour = 3_600_000
    now = int(cli.client.time()[0]) * 1000
    job_run(store, "over:2026-12-01", "over", deadline_at=str(now - hour))
    job_run(store, "closed:2026-12-01", "closed", deadline_at=str(now - hour))
    Runs(store).transition("closed:2026-12-01", "running", "partial", "deadline passed")
    job_run(store, "early:2026-12-01", "early", deadline_at=str(now + hour))
    Runs(store).transition("early:2026-12-01", "running", "failed", "finalized by an operator")
    late = {row["run"]: row["past_deadline"] for row in cli.ok("runs")}
    assert late == {"over:2026-12-01": True, "closed:2026-12-01": True, "early:2026-12-01": False}
    states = {line.split("\t")[0]: line.split("\t")[1] for line in cli("runs").stdout.splitlines()}
    assert states["over:2026-12-01"] == "running (late)"
    assert states["closed:2026-12-01"] == "partial (late)"
    assert states["early:2026-12-01"] == "failed"
    listed = {
        line.split("\t")[0]: line.split("\t")[1] for line in cli("status").stdout.splitlines()
    }
    assert listed["closed:2026-12-01"] == "partial (late)"
    one = cli("status", "closed:2026-12-01").stdout.splitlines()
    assert "state\tpartial (late)" in one
    assert cli.ok("status", "closed:2026-12-01")["past_deadline"] is True
    assert cli.ok("status", "early:2026-12-01")["past_deadline"] is False


# -- add from a file, payloads from files ----------------------------------------


def test_add_from_json_lines_csv_and_stdin(cli: Cli, tmp_path: Path) -> None:
    lines = tmp_path / "items.jsonl"
    lines.write_text('{"id": "a", "payload": {"n": 1}}\n\n{"id": "b"}\n')
    added = cli.ok("add", "r", "--from-file", str(lines), "--payload", '{"default": true}')
    assert added == {"run": "r", "added": 2, "existing": 0, "shards": 1}
    assert cli.ok("inspect", "r", "a")["payload"] == {"n": 1}
    assert cli.ok("inspect", "r", "b")["payload"] == {"default": True}

    table = tmp_path / "items.csv"
    table.write_text("\ufeffid,amount,currency\nc,10,EUR\nd,,USD\n\na,1,EUR\n")
    added = cli.ok("add", "r", "-f", str(table))
    assert (added["added"], added["existing"]) == (2, 1)
    assert cli.ok("inspect", "r", "c")["payload"] == {"amount": "10", "currency": "EUR"}
    assert cli.ok("inspect", "r", "d")["payload"] == {"currency": "USD"}

    piped = 'id,payload\ne,"{""k"": [1, 2]}"\nf,\n'
    result = base.runner.invoke(
        base.app,
        ["--url", cli.url, "--prefix", cli.prefix, "add", "r", "-f", "-", "--format", "csv"],
        input=piped,
        env=dict.fromkeys(ENV_NAMES),
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "run r: 2 added, 0 already there\n"
    assert cli.ok("inspect", "r", "e")["payload"] == {"k": [1, 2]}
    assert cli.ok("inspect", "r", "f")["payload"] is None


BAD_FILES = [
    ('{"id": "a"}\n{"id": "b c"}\n', "line 2", "item id"),
    ('{"id": "a"}\n{"id": 7}\n', "line 2", "string"),
    ('{"id": "a"}\nnot json\n', "line 2", "JSON object"),
    ('{"id": "a"}\n{"id": "b", "pay": 1}\n', "line 2", "'pay'"),
    ('{"id": "a"}\n{"payload": 1}\n', "line 2", '"id"'),
    ('{"id": "a", "payload": ' + "[" * 40 + "]" * 40 + "}\n", "line 1", ""),
    ("name,amount\nx,1\n", "'id' column", ""),
    ("id,amount\nx,1,2\n", "line 2", "cells"),
    ("id,payload\nx,{oops\n", "line 2", "JSON"),
    ("id,payload,other\nx,1,2\n", "payload", ""),
    ("\n\n", "no items", ""),
]


@pytest.mark.parametrize(("text", "where", "what"), BAD_FILES)
def test_a_bad_line_anywhere_writes_nothing(
    cli: Cli, tmp_path: Path, text: str, where: str, what: str
) -> None:
    path = tmp_path / "items.txt"
    path.write_text(text)
    assert_error(cli("add", "r", "--from-file", str(path)), 2, where, what)
    assert cli.keys() == []


def test_add_file_errors_exit_2(cli: Cli, tmp_path: Path) -> None:
    assert_error(cli("add", "r", "-f", str(tmp_path / "missing.csv")), 2, "cannot be read")
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"id\ncaf\xe9\n")
    assert_error(cli("add", "r", "-f", str(path)), 2, "not UTF-8")
    assert_error(cli("add", "r", "a", "-f", str(path)), 2, "not both")
    assert_error(cli("add", "r"), 2, "--from-file")
    assert_error(cli("add", "r", "-f", str(path), "--format", "xml"), 2, "format")
    assert_error(cli("add", "r", "-f", "-", "--payload", "@-"), 2, "stdin")
    assert cli.keys() == []


def test_payload_and_result_from_a_file(cli: Cli, tmp_path: Path) -> None:
    payload = tmp_path / "payload.json"
    payload.write_text('{"amount": 12.5, "note": "from a file"}\n')
    cli.ok("add", "r", "a", "--payload", f"@{payload}")
    assert cli.ok("inspect", "r", "a")["payload"] == {"amount": 12.5, "note": "from a file"}
    lease = cli.ok("claim", "r", "a", "-w", "w1")
    result = tmp_path / "result.json"
    result.write_text('{"ok": true}')
    done = cli.ok("commit", "r", "a", "-t", str(lease["token"]), "--result", f"@{result}")
    assert done["result"] == {"ok": True}
    assert_error(cli("add", "r", "b", "--payload", f"@{tmp_path / 'none.json'}"), 2, "cannot")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    assert_error(cli("add", "r", "b", "--payload", f"@{bad}"), 2, "not valid JSON")
    assert_error(cli("add", "r", "b", "--payload", "@"), 2, "names no file")
    big = tmp_path / "big.json"
    big.write_text(json.dumps("x" * 600_000))
    assert_error(cli("add", "r", "b", "--payload", f"@{big}"), 2, "limit")
    stdin = base.runner.invoke(
        base.app,
        ["--url", cli.url, "--prefix", cli.prefix, "add", "r", "c", "--payload", "@-"],
        input="[1, 2]",
        env=dict.fromkeys(ENV_NAMES),
    )
    assert stdin.exit_code == 0, stdin.output
    assert cli.ok("inspect", "r", "c")["payload"] == [1, 2]


def test_add_from_a_file_shows_a_progress_bar_on_a_terminal(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "ids.csv"
    path.write_text("id\n" + "".join(f"x{n}\n" for n in range(5000)))
    shown = cli("add", "r", "-f", str(path), env={"TTY_COMPATIBLE": "1"})
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == "run r: 5000 added, 0 already there\n"
    assert "adding to r" in shown.stderr and "5000/5000" in shown.stderr
    quiet = cli("add", "r", "-f", str(path), env={"TTY_COMPATIBLE": "0"})
    assert quiet.stdout == "run r: 0 added, 5000 already there\n" and quiet.stderr == ""


def test_two_hundred_thousand_ids_from_a_file_in_a_real_process(
    real_cli: Cli, tmp_path: Path
) -> None:
    """Too many for an argument list (the shell's limit); read and sent in batches."""
    path = tmp_path / "ids.csv"
    with path.open("w") as out:
        out.write("id\n")
        out.writelines(f"acct_{n:06d}\n" for n in range(200_000))
    done = shell(real_cli.url, real_cli.prefix, "add", "big", "-f", str(path), "--shards", "8")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "run big: 200000 added, 0 already there\n"
    assert done.stderr == ""  # no progress bar off a terminal
    status = real_cli.ok("status", "big")
    assert status["counts"]["pending"] == 200_000 and status["planned"] == 200_000


# -- items, paged -----------------------------------------------------------------


def test_items_pages_through_every_item_once(cli: Cli) -> None:
    ids = [f"i{n:03d}" for n in range(45)]
    cli.ok("add", "r", *ids, "--shards", "3")
    store = store_of(cli)
    done = sorted(ids[::9])
    for item in done:
        store.commit(store.claim("r", item, "w1"))
    expected = {"pending": sorted(set(ids) - set(done)), "done": done, None: ids}
    for state, limit in (("pending", 7), ("done", 2), (None, 7), (None, 100)):
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            args = ["items", "r", "--limit", str(limit)]
            args += ["--state", state] if state else []
            args += ["--cursor", cursor] if cursor else []
            page = cli.ok(*args)
            if state == "pending":  # from the index: never more than the limit
                assert len(page["items"]) <= limit
            seen += [row["item"] for row in page["items"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
            assert pages < 50
        assert sorted(seen) == expected[state], (state, limit)
        assert len(seen) == len(set(seen))
    assert pages == 1  # a limit above the run's size: one page


def test_items_by_state_and_the_cursor_line(cli: Cli) -> None:
    cli.ok("add", "r", "a", "b", "c", "d")
    cli.ok("claim", "r", "a", "-w", "w1")
    lease = cli.ok("claim", "r", "b", "-w", "w1")
    cli.ok("commit", "r", "b", "-t", str(lease["token"]))
    dead_item(cli, "r", "c", "bad")
    for state, expected in (
        ("leased", ["a"]),
        ("done", ["b"]),
        ("dead", ["c"]),
        ("pending", ["d"]),
    ):
        page = cli.ok("items", "r", "--state", state)
        assert [row["item"] for row in page["items"]] == expected, state
        assert all(row["state"] == state for row in page["items"])
    leased = cli.ok("items", "r", "--state", "leased")["items"][0]
    assert leased["expires_at"].endswith("+00:00") and leased["owner"] == "w1"
    first = cli("items", "r", "--state", "pending", "--limit", "1")
    assert first.exit_code == 0, first.output
    assert first.stderr == ""  # d is the only pending item: no next page
    cli.ok("add", "r", "e")
    first = cli("items", "r", "--state", "pending", "--limit", "1")
    assert first.stdout.splitlines()[0] == "pending items of run r"
    assert first.stdout.splitlines()[2].startswith("d\tpending\t")
    (hint,) = first.stderr.splitlines()
    assert hint == "next page: redis-lease items r --state pending --limit 1 --cursor 0:1"
    second = cli("items", "r", "--state", "pending", "--limit", "1", "--cursor", "0:1")
    assert second.stdout.splitlines()[2].startswith("e\tpending\t")
    assert_error(cli("items", "r", "--state", "lost"), 2, "state")
    assert_error(cli("items", "nope"), 5, "nope")
    assert_error(cli("items", "r", "--limit", "1001"), 2, "limit")


# -- runs ---------------------------------------------------------------------------


def job_run(store: LeaseStore, run_id: str, job: str, **fields: str) -> None:
    """A run recorded as a job's run (the fields Runs.ensure writes), with two items."""
    store.create_run(
        run_id, 1, fields={"job": job, "business_date": run_id.split(":", 1)[1], **fields}
    )
    store.add(run_id, [Item("a"), Item("b")])


def test_runs_filters_and_shows_paused_jobs_and_failed_shard_jobs(cli: Cli) -> None:
    store = store_of(cli)
    job_run(store, "nightly:2026-12-01", "nightly")
    job_run(store, "nightly:2026-12-02", "nightly", failed_jobs="2", last_job_error="shard 0: X")
    job_run(store, "weekly:2026-12-02", "weekly")
    cli.ok("add", "adhoc", "x")
    Runs(store).transition("nightly:2026-12-01", "running", "partial", "deadline passed")
    listed = cli.ok("runs")
    assert [r["run"] for r in listed] == [
        "adhoc", "weekly:2026-12-02", "nightly:2026-12-02", "nightly:2026-12-01",
    ]  # fmt: skip
    nightly = cli.ok("runs", "--job", "nightly")
    assert [r["run"] for r in nightly] == ["nightly:2026-12-02", "nightly:2026-12-01"]
    assert nightly[0]["failed_jobs"] == 2 and nightly[1]["failed_jobs"] == 0
    assert [r["run"] for r in cli.ok("runs", "--state", "partial")] == ["nightly:2026-12-01"]
    assert len(cli.ok("runs", "--limit", "1")) == 1
    assert cli.ok("runs", "--since", "2999-01-01") == []
    assert len(cli.ok("runs", "--since", "2000-01-01T00:00:00+00:00")) == 4
    assert nightly[0]["job_paused"] is None
    pause(store, "nightly", by="alice")
    paused = cli.ok("runs", "--job", "nightly")
    assert paused[0]["job_paused"].startswith("paused by alice at ")
    human = cli("runs")
    assert human.exit_code == 0, human.output
    assert re.search(r"^job nightly is paused by alice at \S+\+00:00$", human.stdout, re.M)
    row = next(line for line in human.stdout.splitlines() if line.startswith("nightly:2026-12-02"))
    assert row.split("\t")[:7] == ["nightly:2026-12-02", "running", "2", "0", "0", "0", "2"]
    assert_error(cli("runs", "--state", "done"), 2, "state")
    assert_error(cli("runs", "--since", "yesterday"), 2, "since")
    assert_error(cli("runs", "--job", "a b"), 2, "job")


# -- status -------------------------------------------------------------------------


def test_decision_times_have_one_form(cli: Cli) -> None:
    store = store_of(cli)
    job_run(store, "nightly:2026-12-02", "nightly", deadline_at="1764730800000")
    runs = Runs(store)
    runs.record_decision("nightly:2026-12-02", "create", "scheduled at 2026-12-02T02:00:00+01:00")
    runs.record_decision(
        "nightly:2026-12-02", "resume", "claims allowed until 2026-12-03T06:00:00Z"
    )
    data = cli.ok("status", "nightly:2026-12-02")
    assert data["deadline"] == "2025-12-03T03:00:00.000+00:00"
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00"
    for decision in data["decisions"]:
        assert re.fullmatch(stamp, decision["at"]), decision
    reasons = [d["reason"] for d in data["decisions"]]
    assert reasons == [
        "scheduled at 2026-12-02T01:00:00.000+00:00",
        "claims allowed until 2026-12-03T06:00:00.000+00:00",
    ]
    human = cli("status", "nightly:2026-12-02").stdout
    times = re.findall(r"\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:\d\d)?", human)
    assert len(times) >= 5 and all(re.fullmatch(stamp, t) for t in times), times


def test_a_final_run_shows_no_projected_finish(cli: Cli) -> None:
    store = store_of(cli)
    job_run(store, "nightly:2026-12-02", "nightly", projected_finish_at="1764730800000")
    assert cli.ok("status", "nightly:2026-12-02")["projected_finish"] == (
        "2025-12-03T03:00:00.000+00:00"
    )
    Runs(store).transition("nightly:2026-12-02", "running", "partial", "deadline passed")
    data = cli.ok("status", "nightly:2026-12-02")
    assert data["state"] == "partial" and data["projected_finish"] is None
    human = cli("status", "nightly:2026-12-02").stdout
    assert "projected finish\t-\n" in human and "2025-12-03T03" not in human


def test_status_shows_failed_jobs_effects_providers_and_lost_items(cli: Cli) -> None:
    store = store_of(cli)
    error = "shard 0: ImportError: cannot import app.jobs"
    job_run(store, "n:2026-12-02", "n", failed_jobs="3", last_job_error=error, planned_items="5")
    lease = store.claim("n:2026-12-02", "a", "w1")
    store.record_effect(lease, "n:2026-12-02|a|pay", "pay", "intended")
    store.record_effect(lease, "n:2026-12-02|a|pay", "pay", "applied", {"ref": "p-1"})
    lease_b = store.claim("n:2026-12-02", "b", "w1")
    store.record_effect(lease_b, "n:2026-12-02|b|pay", "pay", "intended")
    store.record_effect(lease_b, "n:2026-12-02|b|pay", "pay", "unknown", "timeout")
    gate = ProviderGate(store, "bank", max_concurrency=4)
    with gate.slot():
        data = cli.ok("status", "n:2026-12-02")
        human = cli("status", "n:2026-12-02").stdout
    assert data["failed_jobs"] == 3 and data["last_job_error"] == error
    assert data["effects"] == {"applied": 1, "unknown": 1}
    assert data["lost"] == 3  # planned 5, two items in the run
    (bank,) = [p for p in data["providers"] if p["provider"] == "bank"]
    assert (bank["cap"], bank["in_use"]) == (4, 1)
    assert f"failed shard jobs\t3 (last: {error})\n" in human
    assert "effects applied\t1\n" in human and "effects unknown\t1\n" in human
    assert "lost\t3 (records vanished: check maxmemory-policy and persistence)\n" in human
    assert re.search(r"^bank\t4\t1\t1-4\t0$", human, re.M), human


# -- output at 80 columns -------------------------------------------------------------


def wide_run(cli: Cli) -> None:
    cli.ok("add", LONG_RUN, "an-item-with-a-rather-long-identifier-for-its-account-0001")
    dead_item(cli, LONG_RUN, "an-item-with-a-rather-long-identifier-for-its-account-0001", "x")


VIEWS = [("status",), ("runs",), ("status", LONG_RUN), ("dead", LONG_RUN), ("items", LONG_RUN)]


@pytest.mark.parametrize("args", VIEWS, ids=" ".join)
def test_run_ids_are_never_wrapped_in_a_pipe(cli: Cli, args: tuple[str, ...]) -> None:
    wide_run(cli)
    result = cli(*args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert [line for line in result.stdout.splitlines() if LONG_RUN in line], result.stdout
    assert "┃" not in result.stdout and "│" not in result.stdout  # plain text off a terminal


@pytest.mark.parametrize("args", VIEWS, ids=" ".join)
def test_terminal_tables_keep_ids_whole_at_80_columns(cli: Cli, args: tuple[str, ...]) -> None:
    wide_run(cli)
    result = cli(*args, env={"COLUMNS": "80", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    plain = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    item = "an-item-with-a-rather-long-identifier-for-its-account-0001"
    whole = [line for line in plain.splitlines() if LONG_RUN in line or item in line]
    assert whole, plain
    for line in plain.splitlines():
        if LONG_RUN not in line and item not in line:
            assert len(line) <= 80, line
    # A short run id fits a real table.
    cli.ok("add", "r", "a")
    table = cli("status", "r", env={"COLUMNS": "80", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"})
    assert "┃" in table.stdout or "│" in table.stdout


def test_installed_command_status_grep_finds_a_long_run(real_cli: Cli) -> None:
    wide_run(real_cli)
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    env.update(COLUMNS="80", REDIS_LEASE_URL=real_cli.url, REDIS_LEASE_PREFIX=real_cli.prefix)
    line = " ".join(command())
    piped = subprocess.run(
        f"{line} status | grep -F '{LONG_RUN}'", shell=True, capture_output=True, text=True,
        env=env, timeout=60, check=False,
    )  # fmt: skip
    assert piped.returncode == 0, (piped.stdout, piped.stderr)
    assert piped.stdout.startswith(f"{LONG_RUN}\trunning\t1\t0\t0\t0\t1\t0\t")


# -- commit with another result, a database the server lacks ---------------------------


def test_a_repeated_commit_with_another_result_says_the_earlier_one_stands(cli: Cli) -> None:
    cli.ok("add", "r", "a")
    token = str(cli.ok("claim", "r", "a", "-w", "w1")["token"])
    cli.ok("commit", "r", "a", "-t", token, "--result", '{"paid": 10}')
    same = cli("commit", "r", "a", "-t", token, "--result", '{"paid": 10}', "--json")
    assert same.exit_code == 0 and same.stderr == "", same.output
    other = cli("commit", "r", "a", "-t", token, "--result", '{"paid": 99}', "--json")
    assert other.exit_code == 0, other.output
    assert json.loads(other.stdout)["result"] == {"paid": 10}
    (line,) = other.stderr.splitlines()
    assert line.startswith("warning: ") and "earlier commit was returned" in line
    assert "not the new --result" in line
    human = cli("commit", "r", "a", "-t", token, "--result", "[]")
    assert human.exit_code == 0 and human.stdout.endswith("(already committed with this token)\n")
    assert len(human.stderr.splitlines()) == 1
    no_result = cli("commit", "r", "a", "-t", token)
    assert no_result.exit_code == 0 and no_result.stderr == ""


def test_a_database_the_server_lacks_is_a_clear_exit_2(redis_url: str, prefix: str) -> None:
    url = re.sub(r"/\d*$", "", redis_url.rstrip("/")) + "/99"
    cli = Cli(url, prefix, redis.Redis())
    result = cli("status")
    assert_error(result, 2, "has no database 99", "--url")
    assert "unexpected" not in result.stderr
    done = shell(url, prefix, "add", "r", "a")
    assert done.returncode == 2 and "has no database 99" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1


# -- shell completion -----------------------------------------------------------------------


def test_shell_completion_lists_commands_and_options() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    env.update(_REDIS_LEASE_COMPLETE="complete_bash", COMP_WORDS="redis-lease de", COMP_CWORD="1")
    done = subprocess.run(command(), capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["dead", "demo"]
    env.update(COMP_WORDS="redis-lease items r --st", COMP_CWORD="3")
    done = subprocess.run(command(), capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.split() == ["--state"]
    script_env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    script_env["_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION"] = "1"
    script = subprocess.run(
        [*command(), "--show-completion", "bash"],
        capture_output=True,
        text=True,
        env=script_env,
        timeout=60,
    )
    assert script.returncode == 0, script.stderr
    assert "_REDIS_LEASE_COMPLETE=complete_bash" in script.stdout
    assert "complete -o default -F _redis_lease_completion redis-lease" in script.stdout


# -- one item: inspect, resolve-effect ----------------------------------------------------


def test_inspect_shows_the_record_effects_and_attempts(cli: Cli) -> None:
    cli.ok("add", "r", "a", "b", "--payload", '{"n": 1}')
    first = cli.ok("claim", "r", "a", "-w", "w1")
    trace = ["--trace-id", first["trace_id"]]
    cli.ok("fail", "r", "a", "-t", str(first["token"]), "-e", "provider 503", *trace)
    store = store_of(cli)
    lease = store.lease_ref("r", "b", cli.ok("claim", "r", "b", "-w", "w2")["token"])
    store.record_effect(lease, "r|b|pay", "pay", "intended")
    store.record_effect(lease, "r|b|pay", "pay", "applied", {"ref": "p-9"})
    store.record_effect(lease, "r|b|mail", "mail", "intended")
    a = cli.ok("inspect", "r", "a")
    assert (a["state"], a["attempts"], a["error"], a["effects"]) == (
        "pending",
        1,
        "provider 503",
        [],
    )
    (attempt,) = a["attempt_log"]
    assert (attempt["event"], attempt["attempt"], attempt["error"]) == ("retry", 1, "provider 503")
    assert attempt["worker"] == "w1" and attempt["trace_id"] == first["trace_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", attempt["trace_id"])
    assert [e["error"] for e in a["errors"]] == ["provider 503"]
    b = cli.ok("inspect", "r", "b")
    effects = {e["key"]: e for e in b["effects"]}
    assert set(effects) == {"r|b|mail", "r|b|pay"}
    assert effects["r|b|pay"]["state"] == "applied" and effects["r|b|pay"]["result"] == {
        "ref": "p-9"
    }
    assert effects["r|b|mail"]["state"] == "intended"
    assert effects["r|b|pay"]["updated_at"].endswith("+00:00")
    human = cli("inspect", "r", "a").stdout
    assert "attempts (newest first)\n" in human and attempt["trace_id"] in human
    assert "effects: none recorded" in human
    assert re.search(r"^r\|b\|pay\tpay\tapplied\t", cli("inspect", "r", "b").stdout, re.M)
    assert_error(cli("inspect", "r", "a", "--attempts", "0"), 2, "attempts")
    assert_error(cli("inspect", "r", "zz"), 5, "zz")


def test_resolve_effect_settles_an_unknown_outcome(cli: Cli) -> None:
    cli.ok("add", "r", "a")
    store = store_of(cli)
    lease = store.lease_ref("r", "a", cli.ok("claim", "r", "a", "-w", "w1")["token"])
    store.record_effect(lease, "r|a|pay", "pay", "intended")
    store.record_effect(lease, "r|a|pay", "pay", "unknown", "timeout after sending")
    store.release(lease)
    assert_error(cli("resolve-effect", "r", "a", "pay"), 2, "--applied")
    assert_error(cli("resolve-effect", "r", "a", "pay", "--applied", "{}", "--not-applied"), 2)
    assert_error(cli("resolve-effect", "r", "a", "mail", "--not-applied"), 5, "never sent")
    done = cli.ok("resolve-effect", "r", "a", "pay", "--applied", '{"ref": "p-1"}')
    assert (done["state"], done["result"]) == ("applied", {"ref": "p-1"})
    assert_error(cli("resolve-effect", "r", "a", "pay", "--not-applied"), 2, "nothing to settle")
    assert cli.ok("inspect", "r", "a")["state"] == "pending"
