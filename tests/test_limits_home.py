"""Bounds and defaults have one home, ``lua/include/limits.json``: every entry is read by
a script, the package or its tests, and the job option bounds, the page sizes and the stream caps
that the package enforces are the file's."""

from __future__ import annotations

import re
from datetime import date, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from redis_lease import LeaseStore, limits
from redis_lease.cli import app
from redis_lease.errors import InvalidInput
from redis_lease.fleet.jobs.job import JobOptions
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.backfill import backfill_dates
from redis_lease.protocol.leases import Item

PACKAGE = Path(limits.__file__).resolve().parent


def test_every_entry_of_limits_json_is_read_by_a_script_or_the_package() -> None:
    lua = " ".join(path.read_text() for path in limits.lua_dir().rglob("*.lua"))
    # record_bytes bounds an earlier version's record: only the tests read it now.
    sources = [*PACKAGE.rglob("*.py"), *Path(__file__).parent.rglob("*.py")]
    python = " ".join(path.read_text() for path in sources)
    for part, reader in (("bounds", "bound"), ("defaults", "default")):
        for name in limits.table()[part]:
            in_lua = re.search(rf"\b{name}\b", lua) is not None  # LIMITS holds what it names
            assert in_lua or f'{reader}("{name}")' in python, f"limits.json {part}.{name}: unread"


@pytest.mark.parametrize(
    ("option", "bound"),
    [
        ("catch_up_days", "catch_up_days"),
        ("workers_per_shard", "workers_per_shard"),
        ("max_shard_jobs", "max_shard_jobs"),
        ("retention_days", "retention_days"),
        ("spare_nodes", "spare_nodes"),
        ("workers_per_node", "workers_per_node"),
    ],
)
def test_a_job_option_takes_exactly_its_bound_from_limits_json(option: str, bound: str) -> None:
    highest = limits.bound(bound)[1]
    assert getattr(JobOptions(**{option: highest}), option) == highest
    with pytest.raises(InvalidInput, match=option):
        JobOptions(**{option: highest + 1})


def test_the_command_line_pages_are_bounded_by_limits_json(
    real_store: LeaseStore, redis_url: str
) -> None:
    real_store.add("r", [Item("a")])
    base = ["--url", redis_url, "--prefix", real_store.prefix]
    over = CliRunner().invoke(app, [*base, "items", "r", "--limit", str(limits.PAGE_MAX + 1)])
    assert over.exit_code == InvalidInput.exit_code
    assert f"1 to {limits.PAGE_MAX}" in over.stderr


def test_a_runs_decision_log_is_capped_by_limits_json(real_store: LeaseStore) -> None:
    runs = Runs(real_store)
    real_store.add("r", [Item("a")])
    for n in range(limits.RUN_LOG_CAP + 200):
        runs.record_decision("r", "note", f"decision {n}")
    kept = real_store.client.xlen(real_store.keys.run_events("r"))
    assert limits.RUN_LOG_CAP <= kept < limits.RUN_LOG_CAP + 200


def test_a_backfill_spans_at_most_the_days_of_limits_json() -> None:
    from tests.fleet_jobs import nightly

    first = date(2030, 1, 1)
    last = first + timedelta(days=limits.BACKFILL_DAYS_MAX - 1)
    assert backfill_dates(nightly, first, last)
    with pytest.raises(InvalidInput, match=f"at most {limits.BACKFILL_DAYS_MAX} days"):
        backfill_dates(nightly, first, last + timedelta(days=1))


def test_the_run_states_are_spelled_only_in_limits_json() -> None:
    """The scripts and the protocol layer take a run's state words from limits.json (LIMITS,
    limits.py), never as literals of their own: one home for both languages."""
    words = "|".join([*limits.OPEN_RUN_STATES, *limits.FINAL_RUN_STATES])
    literal = re.compile(rf"""['"]({words})['"]""")
    sources = [*limits.lua_dir().rglob("*.lua"), *(PACKAGE / "protocol").rglob("*.py")]
    for path in sources:
        text = path.read_text()
        if path.name == "record_effect.lua":  # an effect's states: 'failed' is its own word
            text = text.replace("'applied', 'failed'", "")
        if path.name == "store_client.py":  # the effect state a held-back intent is marked with
            text = text.replace('INTENT_NOT_SENT = "failed"', "")
        assert not literal.search(text), f"{path.name} spells a run state: {literal.search(text)}"
