"""The README's 3 a.m. walk-through, run as written.

The test builds the scene on the real Redis under its own prefix: a job's run of 20
accounts worked by the real shard loop, where one account fails every attempt until it
is dead, and the run's deadline passes. Then it reads the ``sh`` block under
"At 3 a.m.: from a late run to the failed attempt" out of README.md and runs each
command in a shell (``REDIS_LEASE_URL`` and ``REDIS_LEASE_PREFIX`` point it at the
scene), checking what each shows: the late run, its dead item, and in ``inspect`` the
failing attempt with its error and its trace id.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import pytest

from redis_lease import LeaseStore
from redis_lease.fleet.job import Job
from redis_lease.fleet.runs import Runs, to_ms
from redis_lease.fleet.worker.lease_keeper import LeaseKeeper
from redis_lease.fleet.worker.shard_job import ActiveLease
from redis_lease.fleet.worker.shard_loop import work_shard
from redis_lease.protocol.values import Item
from tests.helpers import wait_past
from tests.test_cli import ENV_NAMES

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## At 3 a.m.: from a late run to the failed attempt"
RUN = "payment-reconciliation:2026-12-02"
BROKEN = "acct_0013"
ERROR = "bank gateway 502: upstream timed out"

payments = Job(
    "payment-reconciliation",
    shards=2,
    max_attempts=3,
    backoff_base_seconds=0.02,
    backoff_cap_seconds=0.05,
    schedule="0 0 29 2 *",  # 29 February only: nothing falls due while the test runs
    queue="rltest-walkthrough",
)


@payments.planner
def plan_accounts(business_date: date) -> Iterator[Item]:
    """Twenty accounts."""
    for n in range(1, 21):
        yield Item(f"acct_{n:04d}", {"account": n, "date": business_date.isoformat()})


@payments.handler
def reconcile(item: Item, lease: ActiveLease) -> dict[str, int]:
    """Reconciles an account; one of them fails on every attempt."""
    if item.id == BROKEN:
        raise RuntimeError(ERROR)
    return {"account": item.payload["account"]}


def readme_commands() -> list[str]:
    """The commands of the section's ``sh`` block (comments and blank lines left out)."""
    text = README.read_text()
    assert HEADING in text, f"README.md has no section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the section has no sh block"
    commands = []
    for line in block.group(1).splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def late_run(store: LeaseStore) -> None:
    """The job's run, worked until only the broken account is left (dead), then late."""
    runs = Runs(store)
    now = runs.server_now()
    deadline = now + timedelta(seconds=5)  # room for the work on a busy machine
    run_id, _ = runs.ensure(payments, date(2026, 12, 2), now, deadline=deadline)
    assert run_id == RUN
    assert runs.plan(payments, run_id) == 20
    keeper = LeaseKeeper(store, payments.options.lease_ttl_seconds)  # not started: nothing to renew
    give_up = time.monotonic() + 20
    while store.status(run_id).unfinished:  # a pass ends when nothing is due: retry later
        assert time.monotonic() < give_up, store.status(run_id).counts
        for shard in range(payments.options.shards):
            stop = threading.Event()
            work_shard(
                store, payments, run_id, shard, worker="w1", budget=5, stop=stop, keeper=keeper
            )
        time.sleep(0.02)  # the retry's backoff (20-50 ms) runs on the server clock
    status = store.status(run_id)
    assert (status.counts["done"], status.counts["dead"]) == (19, 1), status.counts
    wait_past(store.client, to_ms(deadline), timeout=10)
    assert runs.finalize(run_id, "deadline passed") is not None


@pytest.fixture
def shell_env(real_store: LeaseStore) -> dict[str, str]:
    """The environment of the README's commands: this test's Redis and prefix."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    env["REDIS_LEASE_URL"] = real_store.url
    env["REDIS_LEASE_PREFIX"] = real_store.prefix
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "80"
    return env


def run_line(line: str, env: dict[str, str]) -> str:
    """Runs one README command in a shell; returns its stdout (it must exit 0)."""
    assert shlex.split(line)[0] == "redis-lease", line
    done = subprocess.run(
        line, shell=True, capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr
    return done.stdout


def test_the_readme_walkthrough_leads_to_the_failed_attempt(
    real_store: LeaseStore, shell_env: dict[str, str]
) -> None:
    late_run(real_store)
    commands = readme_commands()
    names = [shlex.split(c)[1] for c in commands]
    assert names == ["runs", "status", "dead", "inspect", "requeue", "resume"]
    outputs = {}
    dead_now = ""
    for name, line in zip(names, commands, strict=True):
        outputs[name] = run_line(line, shell_env)
        if name == "inspect":  # the state the views were read in
            dead_now = real_store.item(RUN, BROKEN).state

    runs_line = next(line for line in outputs["runs"].splitlines() if line.startswith(RUN))
    assert runs_line.split("\t")[:5] == [RUN, "partial (late)", "20", "19", "1"]
    status = dict(line.split("\t", 1) for line in outputs["status"].splitlines() if "\t" in line)
    assert status["state"] == "partial (late)" and status["dead"] == "1"
    assert status["reason"].startswith("deadline passed: 19 done of 20 planned, 1 dead")
    assert status["projected finish"] == "-"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", status["deadline"])
    dead_rows = [line.split("\t") for line in outputs["dead"].splitlines()]
    assert dead_rows[2][:2] == [BROKEN, "3"] and dead_rows[2][3] == f"RuntimeError: {ERROR}"

    inspected = outputs["inspect"]
    attempts = inspected.split("attempts (newest first)\n", 1)[1].splitlines()
    header, *rows = (line.split("\t") for line in attempts)
    assert header == ["at", "attempt", "event", "token", "worker", "error", "trace id"]
    failed = [dict(zip(header, row, strict=True)) for row in rows]
    assert [row["event"] for row in failed] == ["dead", "retry", "retry"]
    assert [row["attempt"] for row in failed] == ["3", "2", "1"]
    for row in failed:
        assert row["error"] == f"RuntimeError: {ERROR}"
        assert re.fullmatch(r"[0-9a-f]{32}", row["trace id"]), row
    assert len({row["trace id"] for row in failed}) == 3  # one trace per attempt
    logged = real_store.attempts(RUN, BROKEN)
    assert [a.trace_id for a in logged] == [row["trace id"] for row in failed]
    assert dead_now == "dead"

    # The fix: the item is due again and the run claimable until its new deadline.
    assert outputs["requeue"] == (
        f"run {RUN}: 1 item(s) requeued; the run is partial: nothing runs until resumed "
        f"(redis-lease resume {RUN})\n"
    )
    assert outputs["resume"].startswith(f"{RUN}: running (resumed by an operator")
    assert real_store.item(RUN, BROKEN).state == "pending"
    assert real_store.claim(RUN, BROKEN, "w2").attempt == 1
