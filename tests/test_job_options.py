"""A job's options: typed keywords, the two deadline forms, their one table,
the README's first job under ``mypy --strict``, and ``start`` on a past date."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import MISSING, fields
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from redis_lease import Job, LeaseStore
from redis_lease.cli import app
from redis_lease.cli.options import TICK_FAILED_EXIT, exit_if_failed
from redis_lease.errors import InvalidInput
from redis_lease.fleet.jobs.job_options import JobOptions, options_table
from redis_lease.fleet.runs.lifecycle import Decision, Runs
from redis_lease.fleet.tick.scheduler_tick import TickResult, tick
from tests.fleet_helpers import NIGHTLY_PATH, REPO, Configure, configure_nightly


@pytest.fixture
def nightly(real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Configure]:
    """Sets the nightly job's options for this test (its own RQ queue) and its planner."""
    yield from configure_nightly(real_store, monkeypatch, items=4)


def test_job_takes_every_option_as_a_typed_keyword_with_its_default() -> None:
    keywords = {
        name: parameter
        for name, parameter in inspect.signature(Job).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    options = {option.name: option for option in fields(JobOptions)}
    assert list(keywords) == list(options)
    for name, option in options.items():
        assert keywords[name].annotation == option.type, name
        assert option.default is not MISSING
        assert keywords[name].default == option.default, name
        assert getattr(Job("j").options, name) == option.default, name


def test_the_deadline_has_two_forms_and_only_one_is_taken() -> None:
    day = date(2026, 12, 2)
    started = datetime(2026, 12, 2, 2, 30, tzinfo=UTC)
    clock = Job("j", deadline_at="06:00", schedule="0 2 * * *")
    assert clock.deadline_for(day, started) == datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
    after = Job("j", deadline_after=timedelta(hours=2))
    assert after.deadline_for(day, started) == started + timedelta(hours=2)
    assert Job("j").deadline_for(day, started) == started + timedelta(hours=6)
    assert Job("j").settings()["deadline_after"] == "6h"
    assert "deadline_after" not in clock.settings() and clock.settings()["deadline_at"] == "06:00"
    with pytest.raises(InvalidInput, match="not both"):
        Job("j", deadline_at="06:00", deadline_after=timedelta(hours=1))
    with pytest.raises(InvalidInput, match="deadline_after=timedelta"):
        Job("j", deadline_at="6h")
    with pytest.raises(InvalidInput, match="positive timedelta"):
        Job("j", deadline_after=timedelta(0))


def test_the_docs_table_is_every_option_as_the_dataclass_describes_it() -> None:
    page = (REPO / "docs" / "jobs.md").read_text()
    assert options_table() in page, (
        "regenerate the table in docs/jobs.md: python -c 'from redis_lease.fleet.jobs.job_options "
        "import options_table; print(options_table())'"
    )
    rows = re.findall(r"^\| `(\w+)` \| `", page, flags=re.MULTILINE)
    assert rows[: len(fields(JobOptions))] == [option.name for option in fields(JobOptions)]
    assert "Job options: jobs.md" in (REPO / "mkdocs.yml").read_text()  # on the site's nav


#: ``app.billing`` for mypy: the reader's code the README's first job imports.
BILLING_STUB = """
from datetime import date
from typing import Any

def accounts_for(business_date: date) -> list[int]: ...

class Provider:
    def apply(self, key: str, payload: Any) -> dict[str, str]: ...
    def lookup(self, key: str) -> dict[str, str] | None: ...

provider: Provider
"""


def test_the_readmes_first_job_type_checks_under_mypy_strict(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    first = next(block for block in blocks if re.search(r"\bJob\(", block))
    assert "@" in first and ".handler" in first  # the whole job, not a fragment
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.pyi").write_text("")
    (tmp_path / "app" / "billing.pyi").write_text(BILLING_STUB)
    (tmp_path / "first_job.py").write_text(first)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "first_job.py"],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": f"{tmp_path}:{REPO}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_job_record_shows_the_new_names_and_drops_the_old(
    real_store: LeaseStore, nightly: Configure
) -> None:
    job = nightly()
    key = real_store.keys.job(job.name)
    real_store.client.hset(key, mapping={"max_workers": "4", "deadline": "6h", "lease_ttl": "30"})
    tick(real_store, [NIGHTLY_PATH], now=datetime.now(UTC))
    record = {k.decode(): v.decode() for k, v in real_store.client.hgetall(key).items()}
    assert not {"max_workers", "deadline", "lease_ttl", "deadline_at"} & set(record)
    assert record["max_shard_jobs"] == "4" and record["deadline_after"] == "6h"
    assert record["lease_ttl_seconds"] == "30"


def test_start_on_a_past_date_gives_the_run_its_window_from_now(
    real_store: LeaseStore, redis_url: str, nightly: Configure
) -> None:
    nightly(deadline_at="06:00", deadline_after=None)
    past = (datetime.now(UTC) - timedelta(days=3)).date()
    base = ["--url", redis_url, "--prefix", real_store.prefix]
    started = CliRunner().invoke(app, [*base, "start", NIGHTLY_PATH, "--date", past.isoformat()])
    assert started.exit_code == 0, started.output
    run_id = f"nightly:{past.isoformat()}"
    runs = Runs(real_store)
    info = runs.info(run_id)
    assert info["state"] == "running", info
    window_ms = 4 * 3600 * 1000  # 02:00 to 06:00
    now_ms = int(runs.server_now().timestamp() * 1000)
    assert now_ms < int(info["deadline_at"]) <= now_ms + window_ms
    reasons = [decision.get("reason", "") for decision in runs.decisions(run_id)]
    assert any("deadline had passed: its full window from now" in r for r in reasons), reasons


def test_a_command_whose_new_run_failed_at_once_exits_7(capsys: pytest.CaptureFixture[str]) -> None:
    failed = Decision("finalize", "job:2026-12-01", "failed: deadline passed: 0 done")
    exit_if_failed(TickResult([failed]), made=["job:2026-12-02"])  # not a run it made
    with pytest.raises(typer.Exit) as stopped:
        exit_if_failed(TickResult([failed]), made=["job:2026-12-01"])
    assert stopped.value.exit_code == TICK_FAILED_EXIT
    assert "job:2026-12-01: made and failed before any work" in capsys.readouterr().err


def test_a_job_path_names_what_the_module_lacks() -> None:
    from redis_lease.fleet.jobs.job import load_job

    with pytest.raises(InvalidInput) as missing:
        load_job("tests.fleet_jobs:nope")
    assert str(missing.value) == (
        "module 'tests.fleet_jobs' has no 'nope' for job 'tests.fleet_jobs:nope' "
        "(its jobs: fleet, nightly)"
    )
    with pytest.raises(InvalidInput, match=r"'tests.fleet_helpers' has no 'x'.*defines no"):
        load_job("tests.fleet_helpers:x")
    with pytest.raises(InvalidInput, match=r"'tests.fleet_jobs:os' is a module, not a"):
        load_job("tests.fleet_jobs:os")
    assert load_job("tests.fleet_jobs:fleet").name
