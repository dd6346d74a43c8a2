"""The README's account of a new job's first run matches what the tick does, at any hour.

The README's job fires at 02:00 Berlin time and is due at 06:00. Its first tick creates
the latest scheduled run at once, and the README says which, for every hour: from 02:00
to 06:00 today's, on time, due at 06:00; from 06:00 today's, caught up, due its 4-hour
window after the tick; before 02:00 yesterday's, caught up the same way.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta
from pathlib import Path
from types import ModuleType
from zoneinfo import ZoneInfo

import pytest

from redis_lease import LeaseStore
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.protocol.leases import from_ms
from tests.redis_server import RedisServer
from tests.snippets.parse import read_page

ROOT = Path(__file__).resolve().parent.parent
BERLIN = ZoneInfo("Europe/Berlin")
#: The README's words for each case, in the order of the hours they cover.
SAYS = (
    "From 02:00 to 06:00 Berlin time that is today's run, on time and due at 06:00",
    "from 06:00, today's, caught up late and due 4 hours (its full window) after the tick",
    "before 02:00, yesterday's, caught up the same way",
)


@pytest.fixture
def readme_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The README's ``jobs.py``, imported as ``readme_jobs``."""
    code = next(s.code for s in read_page(ROOT, "README.md").snippets if s.file == "jobs.py")
    (tmp_path / "readme_jobs.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("readme_jobs", None)
    yield importlib.import_module("readme_jobs")
    sys.modules.pop("readme_jobs", None)


def expected(now: datetime) -> tuple[date, str, datetime]:
    """What the README says the first tick at ``now`` creates: the business date, the
    decision and the deadline."""
    local = now.astimezone(BERLIN)
    today = local.date()
    if local.hour < 2:
        return today - timedelta(days=1), "catch_up", now + timedelta(hours=4)
    if local.hour < 6:
        return today, "create", local.replace(hour=6, minute=0)
    return today, "catch_up", now + timedelta(hours=4)


def test_the_readme_says_which_run_a_new_job_gets() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    for words in SAYS:
        assert words in text


@pytest.mark.parametrize("day", [date(2026, 12, 6), date(2026, 7, 6)], ids=["winter", "summer"])
def test_the_first_tick_at_any_hour_creates_the_run_the_readme_names(
    readme_jobs: ModuleType,
    private_redis: Callable[..., RedisServer],
    prefix: str,
    day: date,
) -> None:
    url = private_redis().url
    moments = [datetime(day.year, day.month, day.day, h, 30, tzinfo=BERLIN) for h in range(24)]
    moments += [datetime(day.year, day.month, day.day, 1, 59, tzinfo=BERLIN)]
    moments += [datetime(day.year, day.month, day.day, 5, 59, tzinfo=BERLIN)]
    for number, now in enumerate(moments):
        store = LeaseStore.from_url(url, prefix=f"{prefix}-{number}")  # a new job each time
        made = list(tick(store, ["readme_jobs:nightly"], now=now))
        created = [d for d in made if d.kind in ("create", "catch_up")]
        assert len(created) == 1, (now, made)
        business_date, kind, deadline = expected(now)
        info = Runs(store).info(created[0].run_id)
        assert (created[0].run_id, created[0].kind) == (f"nightly:{business_date}", kind), now
        assert from_ms(int(info["deadline_at"])) == deadline, now
        assert re.fullmatch(r"nightly:\d{4}-\d\d-\d\d", created[0].run_id)
