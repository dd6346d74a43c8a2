"""A job module or a planner that breaks gets one clear answer.

A module that raises while it is imported: ``worker --job``, ``tick`` and ``start`` exit 2
with one line naming the job path, the exception and its own message, and the user's line.
A planner that raises, or yields something that is not a valid :class:`Item`, fails the
run at once (never left ``planning``), its reason naming what was wrong by one rule.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

from redis_lease import Item, Job, LeaseStore
from redis_lease.errors import InvalidInput
from redis_lease.fleet.runs.lifecycle import Runs

BROKEN = """\
import redis_lease

raise RuntimeError("the ledger database is\\nnot configured")
"""

PLANNERS = """\
from datetime import timedelta

from redis_lease import Item, Job


def job(name, planner):
    made = Job(name, schedule="0 2 * * *", deadline_after=timedelta(hours=6))
    made.planner(planner)
    made.handler(lambda lease, item: {})
    return made


def yields_text(day):
    yield Item("a1", {})
    yield "oops"


def raises(day):
    yield Item("a1", {})
    raise ConnectionError("timeout talking to the ledger at 02:00")


def bad_id(day):
    yield Item("a1", {})
    yield Item("a2", {})
    yield Item("bad id!", {})


def bad_payload(day):
    yield Item("a1", {"at": object()})


text = job("text", yields_text)
raising = job("raising", raises)
badid = job("badid", bad_id)
badpayload = job("badpayload", bad_payload)
"""


def cli(folder: Path, redis_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``redis-lease`` run from ``folder`` (its modules importable), on this test's prefix."""
    command = [sys.executable, "-m", "redis_lease", "--url", redis_url, "--prefix", prefix, *args]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "--burst", "--job", "broken_jobs:nightly"],
        ["tick", "broken_jobs:nightly"],
        ["start", "broken_jobs:nightly", "--date", "2026-12-07"],
    ],
    ids=["worker", "tick", "start"],
)
def test_a_module_that_raises_at_import_is_exit_2_naming_the_job_and_the_message(
    tmp_path: Path, redis_url: str, real_store: LeaseStore, args: list[str]
) -> None:
    (tmp_path / "broken_jobs.py").write_text(BROKEN)
    done = cli(tmp_path, redis_url, real_store.prefix, *args)
    assert done.returncode == 2, done
    assert done.stderr == (
        "error: cannot import 'broken_jobs' for job 'broken_jobs:nightly': it raised "
        "RuntimeError: the ledger database is not configured "
        f"(at {tmp_path / 'broken_jobs.py'}:3)\n"
    )
    assert list(real_store.client.scan_iter(match=f"{real_store.prefix}:*")) == []


@pytest.mark.parametrize(
    ("job", "reason"),
    [
        (
            "text",
            "planning error: the planner's item 2 is a str ('oops'), not a redis_lease.Item: "
            "yield Item(id, payload)",
        ),
        (
            "raising",
            "planning error: the planner raised ConnectionError: timeout talking to the "
            "ledger at 02:00",
        ),
        ("badid", "planning error: the planner's item 3: invalid item id 'bad id!': use 1-200"),
        ("badpayload", "planning error: the planner's item 1: payload"),
    ],
)
def test_a_planner_that_breaks_fails_the_run_at_once_naming_what_was_wrong(
    tmp_path: Path, redis_url: str, real_store: LeaseStore, job: str, reason: str
) -> None:
    (tmp_path / "planners.py").write_text(textwrap.dedent(PLANNERS))
    done = cli(
        tmp_path, redis_url, real_store.prefix, "start", f"planners:{job}", "--date", "2026-12-07"
    )
    assert done.returncode == 7, done
    run_id = f"{job}:2026-12-07"
    info = Runs(real_store).info(run_id)
    assert info["state"] == "failed", info
    assert info["reason"].startswith(reason), info["reason"]
    assert f"failed: {reason}" in done.stdout
    assert "drop" not in done.stdout + done.stderr  # no decision the command did not print
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_adding_something_that_is_not_an_item_is_refused_whole(store: LeaseStore) -> None:
    with pytest.raises(InvalidInput, match=r"^item 2 is a str, not a redis_lease.Item"):
        store.add("r1", [Item("a1"), "a2"], shards=1)  # type: ignore[list-item]
    assert store.client.exists(store.keys.run("r1")) == 0


def test_a_planner_names_its_transient_errors_in_its_decorator() -> None:
    job = Job("retrying")

    @job.planner(retry_on=(TimeoutError, ConnectionError))
    def plan(day: date) -> Iterator[Item]:
        yield Item("a")

    assert (job.plan_items, job.plan_retry_on) == (plan, (TimeoutError, ConnectionError))
    plain = Job("plain")
    plain.planner(plan)
    assert (plain.plan_items, plain.plan_retry_on) == (plan, ())
    for bad in [TimeoutError, ("TimeoutError",), [TimeoutError], (TimeoutError("x"),)]:
        with pytest.raises(InvalidInput, match=r"^retry_on must be a tuple of exception classes"):
            job.planner(retry_on=bad)  # type: ignore[call-overload]
