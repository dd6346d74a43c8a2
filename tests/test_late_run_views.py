"""The operator's views of a late run, as the 3 a.m. walk-through (docs/how-to/at-3am.md)
uses them: from the run list to the failed attempt, then requeue and resume.

The scene is the snippet runner's setup ``late-run`` (tests/snippets/setups.py): a run of
20 accounts worked by the real shard loop, one account failing every attempt until it is
dead, and the run's deadline passed. Each command runs in a real shell, as the page's do;
the page checks a line of each, this test the whole of what each shows.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from redis_lease import LeaseStore
from tests.snippets.runner import page_env
from tests.snippets.setups import late_run
from tests.walkthrough_jobs import BROKEN, ERROR, RUN

COMMANDS = {
    "runs": "redis-lease runs --state partial",
    "status": f"redis-lease status {RUN}",
    "dead": f"redis-lease dead {RUN}",
    "inspect": f"redis-lease inspect {RUN} {BROKEN}",
    "requeue": f"redis-lease requeue {RUN} --item {BROKEN}",
    "resume": f"redis-lease resume {RUN} --deadline 2h",
}


@pytest.fixture
def shell_env(real_store: LeaseStore) -> dict[str, str]:
    """The commands' environment: this test's Redis and prefix, as a page's."""
    return page_env(real_store.url, real_store.prefix)


def run_line(line: str, env: dict[str, str]) -> str:
    """Runs one command in a shell; returns its stdout (it must exit 0)."""
    done = subprocess.run(
        line, shell=True, capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr
    return done.stdout


def test_the_views_lead_from_the_late_run_to_the_failed_attempt(
    real_store: LeaseStore, shell_env: dict[str, str], tmp_path: Path
) -> None:
    late_run(real_store, tmp_path)
    outputs = {}
    dead_now = ""
    for name, line in COMMANDS.items():
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
