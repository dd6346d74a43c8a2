"""Jobs: a named planner and handler with the options of its nightly runs.

A job is declared in user code and found by workers and the scheduler through
its import path (``package.module:attr``)::

    reconcile = Job("payment-reconciliation", shards=16,
                    deadline="06:00", schedule="0 2 * * *", timezone="Europe/Berlin")

    @reconcile.planner
    def plan(business_date): yield Item("acct_1:cursor_9", {"account": 1})

    @reconcile.handler
    def handle(item, lease): ...
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from ..errors import InvalidInput
from ..errors import PermanentError as PermanentError  # re-exported: its earlier home
from ..limits import (
    ATTEMPTS_MAX,
    BATCH_MAX,
    CATCH_UP_DAYS_MAX,
    CONCURRENCY_MAX,
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETENTION_DAYS,
    DEFAULT_TTL,
    MAX_WORKERS_MAX,
    RETENTION_DAYS_MAX,
    SHARD_COUNT_MAX,
    SPARE_NODES_MAX,
    WORKERS_PER_NODE_MAX,
    WORKERS_PER_SHARD_MAX,
)
from ..protocol.validation import check_id, check_positive, ttl_to_ms
from ..protocol.values import Item

if TYPE_CHECKING:
    from .live_lease import ActiveLease

Planner = Callable[[date], Iterable[Item]]
Handler = Callable[[Item, "ActiveLease"], Any]

CATCH_UP_POLICIES = ("all", "latest", "none")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def check_concurrency(value: int) -> int:
    """Returns ``value`` when it is a valid concurrency (1 to CONCURRENCY_MAX), else raises."""
    return check_positive(value, "concurrency", CONCURRENCY_MAX)


def parse_duration(text: str) -> timedelta:
    """Parses ``90s``, ``45m``, ``2h`` or ``1d``."""
    match = _DURATION.match(text.strip())
    if not match:
        raise InvalidInput(f"invalid duration {text!r}: use a number and s, m, h or d, e.g. 2h")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


@dataclass(frozen=True)
class JobOptions:
    """The options of a job's runs (recorded in Redis so ``status`` can show them).

    Attributes:
        shards: shards per run; a shard is the unit of work of one RQ job.
        lease_ttl: seconds a claim lasts unless renewed (renewed every third of it). A
            worker that stops is taken over by its heartbeat within seconds
            (:mod:`redis_lease.fleet.takeover`); the lease's length is the bound where no
            ``redis-lease worker`` watches, and the most a holder paused or cut off keeps it.
        max_attempts: claims of an item before it goes dead.
        backoff_base: seconds before the first retry; doubles per attempt.
        backoff_cap: the longest retry delay in seconds.
        deadline: ``HH:MM`` in the job's timezone (the first such time after the
            scheduled start), or a duration after the run starts (``90m``, ``6h``).
        schedule: a cron expression in the job's timezone.
        timezone: an IANA zone name; business dates are dates in this zone.
        catch_up: for dates missed while nothing ticked: ``all`` (within
            ``catch_up_days``), ``latest`` or ``none``.
        catch_up_days: how far back ``all`` looks.
        catch_up_grace: seconds after a scheduled time in which a run still counts as on time.
        workers_per_shard: RQ jobs normally working one shard.
        max_workers: the most RQ jobs working one run at once (burst capacity included).
        shard_budget: seconds one RQ job works a shard before it re-enqueues itself.
        batch_size: the most items one claim_next call takes. Each claim takes about
            0.2 s of handler work for the slots (by the recent mean handler time; 20
            items at first), within this.
        commit_interval: seconds a finished item's commit may wait to be sent with
            others (one round trip per batch); 0 commits each item at once.
        queue: the RQ queue of the job's shard jobs.
        concurrency: handlers one shard job runs at once (threads for plain handlers,
            one event loop for ``async def`` ones); each holds its own lease.
        spare_nodes: nodes that may disappear; the tick's ``workers_needed`` adds
            ``spare_nodes * workers_per_node`` workers for them.
        workers_per_node: worker processes one node runs.
        retention_days: days a finished run's keys are kept.
    """

    shards: int = 8
    lease_ttl: float = DEFAULT_TTL
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_base: float = DEFAULT_BACKOFF_BASE
    backoff_cap: float = DEFAULT_BACKOFF_CAP
    deadline: str = "6h"
    schedule: str = "0 2 * * *"
    timezone: str = "UTC"
    catch_up: str = "latest"
    catch_up_days: int = 7
    catch_up_grace: float = 900.0
    workers_per_shard: int = 1
    max_workers: int = 16
    shard_budget: float = 300.0
    batch_size: int = 400
    commit_interval: float = 0.05
    queue: str = "redis-lease"
    concurrency: int = 1
    spare_nodes: int = 0
    workers_per_node: int = 1
    retention_days: int = DEFAULT_RETENTION_DAYS

    def __post_init__(self) -> None:
        check_positive(self.shards, "shards", SHARD_COUNT_MAX)
        check_positive(self.max_attempts, "max_attempts", ATTEMPTS_MAX)
        check_positive(self.catch_up_days, "catch_up_days", CATCH_UP_DAYS_MAX)
        check_positive(self.workers_per_shard, "workers_per_shard", WORKERS_PER_SHARD_MAX)
        check_positive(self.max_workers, "max_workers", MAX_WORKERS_MAX)
        check_positive(self.batch_size, "batch_size", BATCH_MAX)
        check_positive(self.retention_days, "retention_days", RETENTION_DAYS_MAX)
        check_concurrency(self.concurrency)
        if self.spare_nodes != 0:  # none spare is allowed
            check_positive(self.spare_nodes, "spare_nodes (0 for none)", SPARE_NODES_MAX)
        check_positive(self.workers_per_node, "workers_per_node", WORKERS_PER_NODE_MAX)
        if self.catch_up not in CATCH_UP_POLICIES:
            raise InvalidInput(f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}")
        if not croniter.is_valid(self.schedule):
            raise InvalidInput(f"schedule {self.schedule!r} is not a valid cron expression")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidInput(f"unknown timezone {self.timezone!r}; use an IANA name") from None
        if not re.fullmatch(r"\d\d:\d\d", self.deadline):
            parse_duration(self.deadline)
        if not 0 <= self.commit_interval < self.lease_ttl / 2:
            raise InvalidInput("commit_interval must be from 0 to under half the lease_ttl")
        ttl_to_ms(self.lease_ttl, "lease_ttl")
        ttl_to_ms(self.backoff_base, "backoff_base")
        ttl_to_ms(self.backoff_cap, "backoff_cap")
        if not 0 < self.shard_budget < math.inf:
            raise InvalidInput("shard_budget must be a positive number of seconds")
        check_id(self.queue, "queue")


@dataclass
class Job:
    """A named nightly job: a planner, a handler and their options.

    Args:
        name: the job's id; run ids are ``<name>:<YYYY-MM-DD>``.
        **options: any field of :class:`JobOptions`.
    """

    name: str
    options: JobOptions = field(default_factory=JobOptions)
    plan_items: Planner | None = None
    handle_item: Handler | None = None

    def __init__(self, name: str, **options: Any) -> None:
        self.name = check_id(name, "job name")
        if ":" in name:
            raise InvalidInput(f"job name {name!r} may not contain ':' (run ids are <job>:<date>)")
        self.options = JobOptions(**options)
        self.plan_items = None
        self.handle_item = None

    def planner(self, func: Planner) -> Planner:
        """Decorator: the function that yields a business date's items."""
        self.plan_items = func
        return func

    def handler(self, func: Handler) -> Handler:
        """Decorator: the function that processes one item under its lease."""
        self.handle_item = func
        return func

    @property
    def zone(self) -> ZoneInfo:
        """The job's timezone."""
        return ZoneInfo(self.options.timezone)

    def run_id(self, business_date: date) -> str:
        """The run id of a business date."""
        return f"{self.name}:{business_date.isoformat()}"

    def scheduled_start(self, business_date: date) -> datetime:
        """The first scheduled time on the business date (in the job's timezone)."""
        midnight = datetime.combine(business_date, time(0), self.zone)
        start: datetime = croniter(self.options.schedule, midnight - timedelta(seconds=1)).get_next(
            datetime
        )
        return start

    def deadline_for(self, business_date: date, started: datetime) -> datetime:
        """When a run must be finished: a time of day after its scheduled start, or a duration."""
        text = self.options.deadline
        if re.fullmatch(r"\d\d:\d\d", text):
            scheduled = self.scheduled_start(business_date)
            hour, minute = (int(part) for part in text.split(":"))
            deadline = scheduled.replace(hour=hour, minute=minute, second=0, microsecond=0)
            if deadline <= scheduled:
                deadline += timedelta(days=1)
            return deadline
        return started + parse_duration(text)

    def fire_times(self, since: datetime, until: datetime) -> list[datetime]:
        """Scheduled times in (since, until], oldest first."""
        itr = croniter(self.options.schedule, since.astimezone(self.zone))
        times: list[datetime] = []
        while True:
            nxt: datetime = itr.get_next(datetime)
            if nxt > until:
                return times
            times.append(nxt)

    def settings(self) -> dict[str, str]:
        """The options as text, for the job's record in Redis."""
        return {name: str(value) for name, value in asdict(self.options).items()}


def with_cwd_on_path() -> str:
    """Puts the working directory first on ``sys.path`` (once), as RQ does; returns it."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return cwd


def load_job(path: str) -> Job:
    """Imports a job by its path ``package.module:attr``.

    The working directory is on the import path first, as ``rq worker`` and
    ``python -m`` have it, so a module next to where the command runs imports.
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr or module_name.startswith("."):  # no relative imports
        raise InvalidInput(f"job path {path!r} must look like package.module:attr")
    cwd = with_cwd_on_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        where = ""
        if isinstance(error, ModuleNotFoundError) and module_name.startswith(error.name or "?"):
            where = (
                f" (searched the working directory {cwd} and the Python path; run from the "
                "directory that holds the module, or set PYTHONPATH)"
            )
        raise InvalidInput(
            f"cannot import {module_name!r} for job {path!r}: {error}{where}"
        ) from None
    job = getattr(module, attr, None)
    if not isinstance(job, Job):
        raise InvalidInput(f"{path!r} is not a redis_lease.Job")
    return job
