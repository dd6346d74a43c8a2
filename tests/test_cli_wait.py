"""``redis-lease wait RUN``: it waits while the run is open and answers once it is final.

Exit 0 for a run that succeeded, 11 for one that ended partial, failed or canceled, 12
when the timeout passed first, 5 for an unknown run, 2 for bad input; on the real Redis,
the waiting command in its own process while the test finalizes the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from tests import test_cli as base
from tests.test_cli import ENV_NAMES, Cli, assert_error, command

real_cli = base.real_cli


def finish(cli: Cli, run: str, item: str) -> None:
    """Claims the item and commits it."""
    lease = cli.ok("claim", run, item, "-w", "w1")
    cli.ok("commit", run, item, "-t", str(lease["token"]))


def waiting(cli: Cli, *args: str) -> subprocess.Popen[str]:
    """``redis-lease wait ARGS`` started in its own process."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    return subprocess.Popen(
        [*command(), "--url", cli.url, "--prefix", cli.prefix, "wait", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_wait_returns_once_the_run_is_finalized_while_it_waits(real_cli: Cli) -> None:
    real_cli.ok("add", "r", "a", "b")
    waiter = waiting(real_cli, "r", "--timeout", "60")
    finish(real_cli, "r", "a")
    finish(real_cli, "r", "b")
    assert waiter.poll() is None  # the run is open still: it is waiting
    started = time.monotonic()
    assert real_cli.ok("finalize", "r")["state"] == "succeeded"
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    assert time.monotonic() - started < 30  # noticed by a poll, not at the 60 s timeout
    assert out == "run r succeeded: 2 done of 2 planned\n"
    assert err == ""


def test_wait_exits_11_for_a_run_that_did_not_succeed(real_cli: Cli) -> None:
    real_cli.ok("add", "p", "a", "b")
    finish(real_cli, "p", "a")
    waiter = waiting(real_cli, "p", "--json")
    assert waiter.poll() is None
    real_cli.ok("finalize", "p")
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 11, err
    snapshot = json.loads(out)
    assert snapshot["state"] == "partial" and snapshot["timed_out"] is False
    assert snapshot["counts"]["done"] == 1 and snapshot["counts"]["pending"] == 1
    real_cli.ok("add", "c", "a")
    assert real_cli("cancel", "c").exit_code == 0
    canceled = real_cli("wait", "c")
    assert canceled.exit_code == 11, canceled.output
    assert canceled.stdout == "run c canceled: 0 done of 1 planned, 1 pending\n"
    real_cli.ok("add", "f", "a")
    real_cli.ok("finalize", "f")
    assert real_cli("wait", "f").exit_code == 11


def test_wait_exits_12_when_the_timeout_passes_first(real_cli: Cli) -> None:
    real_cli.ok("add", "r", "a", "b")
    finish(real_cli, "r", "a")
    started = time.monotonic()
    result = real_cli("wait", "r", "--timeout", "1")
    assert time.monotonic() - started >= 1
    assert_error(result, 12, "timed out after 1 s", "run r is still running", "1 done of 2")
    as_json = real_cli("wait", "r", "--timeout", "0", "--json")
    assert as_json.exit_code == 12
    snapshot = json.loads(as_json.stdout)
    assert snapshot["state"] == "running" and snapshot["timed_out"] is True
    assert as_json.stderr.startswith("error: timed out after 0 s: run r is still running")


def test_wait_for_an_unknown_run_or_with_bad_input(real_cli: Cli) -> None:
    assert_error(real_cli("wait", "nope", "--timeout", "5"), 5, "'nope' not found")
    real_cli.ok("add", "r", "a")
    assert_error(real_cli("wait", "r", "--timeout", "-1"), 2, "invalid --timeout -1")
    assert_error(real_cli("wait", "r", "--timeout", "nan"), 2, "invalid --timeout nan")
    assert_error(real_cli("wait", "bad id!"), 2, "invalid run id")
