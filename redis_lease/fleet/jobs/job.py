"""Jobs: a named planner and handler with the options of its nightly runs.

A job is declared in user code and found by workers and the scheduler through
its import path (``package.module:attr``)::

    reconcile = Job("payment-reconciliation", shards=16, deadline_at="06:00",
                    schedule="0 2 * * *", timezone="Europe/Berlin")

    @reconcile.planner
    def plan(business_date): yield Item("acct_1:cursor_9", {"account": 1})

    @reconcile.handler
    def handle(item, lease): ...
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from datetime import date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any, overload
from zoneinfo import ZoneInfo

from croniter import croniter

from ...errors import InvalidInput
from ...limits import (
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETENTION_DAYS,
    DEFAULT_TTL,
)
from ...messages import one_line
from ...protocol.leases import Item
from ...protocol.validation import check_id
from .job_options import CATCH_UP_POLICIES as CATCH_UP_POLICIES
from .job_options import DEFAULT_DEADLINE_AFTER
from .job_options import JobOptions as JobOptions
from .job_options import check_concurrency as check_concurrency
from .job_options import parse_duration as parse_duration

if TYPE_CHECKING:
    from .live_lease import ActiveLease

Planner = Callable[[date], Iterable[Item]]
Handler = Callable[[Item, "ActiveLease"], Any]


@dataclass
class Job:
    """A named nightly job: a planner, a handler and their options.

    Every keyword is a field of :class:`~redis_lease.fleet.jobs.job_options.JobOptions`, with
    the same default; ``docs/jobs.md`` tables what each changes.

    Args:
        name: the job's id; run ids are ``<name>:<YYYY-MM-DD>``.
    """

    name: str
    options: JobOptions = field(default_factory=JobOptions)
    plan_items: Planner | None = None
    handle_item: Handler | None = None
    #: The planner's errors that are transient (:meth:`planner`'s ``retry_on``).
    plan_retry_on: tuple[type[BaseException], ...] = ()

    def __init__(
        self,
        name: str,
        *,
        shards: int = 8,
        lease_ttl_seconds: float = DEFAULT_TTL,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff_base_seconds: float = DEFAULT_BACKOFF_BASE,
        backoff_cap_seconds: float = DEFAULT_BACKOFF_CAP,
        deadline_at: str | None = None,
        deadline_after: timedelta | None = None,
        schedule: str = "0 2 * * *",
        timezone: str = "UTC",
        catch_up: str = "latest",
        catch_up_days: int = 7,
        catch_up_grace_seconds: float = 900.0,
        workers_per_shard: int = 1,
        max_shard_jobs: int = 16,
        shard_budget_seconds: float = 300.0,
        batch_size: int = 400,
        commit_interval_seconds: float = 0.05,
        queue: str = "redis-lease",
        concurrency: int = 1,
        spare_nodes: int = 0,
        workers_per_node: int = 1,
        retention_days: int = DEFAULT_RETENTION_DAYS,
    ) -> None:
        self.name = check_id(name, "job name")
        if ":" in name:
            raise InvalidInput(f"job name {name!r} may not contain ':' (run ids are <job>:<date>)")
        given = dict(locals())
        self.options = JobOptions(
            **{option.name: given[option.name] for option in fields(JobOptions)}
        )
        self.plan_items = None
        self.handle_item = None
        self.plan_retry_on = ()

    @overload
    def planner(self, func: Planner) -> Planner: ...

    @overload
    def planner(
        self, *, retry_on: tuple[type[BaseException], ...]
    ) -> Callable[[Planner], Planner]: ...

    def planner(
        self, func: Planner | None = None, *, retry_on: tuple[type[BaseException], ...] = ()
    ) -> Planner | Callable[[Planner], Planner]:
        """Decorator: the function that yields a business date's items.

        ``@job.planner`` or ``@job.planner(retry_on=(TimeoutError, ...))``: the planner's
        errors of those classes (and their subclasses) are transient (a database timeout
        at 02:00): the run stays ``planning`` and a later tick plans it again, after
        10 s, then twice as long each time up to 5 minutes, until its deadline. Any other
        error, or one still failing at the deadline, fails the run at once. Planning again
        is safe: the items added already are left as they are.
        """
        if not isinstance(retry_on, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in retry_on
        ):
            raise InvalidInput(
                "retry_on must be a tuple of exception classes, e.g. (TimeoutError,)"
            )

        def register(planner: Planner) -> Planner:
            self.plan_items, self.plan_retry_on = planner, retry_on
            return planner

        return register if func is None else register(func)

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
        """When a run must be finished: ``deadline_at``'s first time after the scheduled
        start, or ``deadline_after`` after the run starts."""
        text = self.options.deadline_at
        if text is None:
            return started + (self.options.deadline_after or DEFAULT_DEADLINE_AFTER)
        scheduled = self.scheduled_start(business_date)
        hour, minute = (int(part) for part in text.split(":"))
        deadline = scheduled.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if deadline <= scheduled:
            deadline += timedelta(days=1)
        return deadline

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
        return self.options.settings()


def business_date(job: Job, fire: datetime) -> date:
    """The business date of a scheduled time: its date in the job's timezone."""
    return fire.astimezone(job.zone).date()


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
    except Exception as error:  # the module's own code raised while it was imported
        raise InvalidInput(
            f"cannot import {module_name!r} for job {path!r}: it raised "
            f"{type(error).__name__}: {one_line(str(error))}{_raised_at(error)}"
        ) from None
    if not hasattr(module, attr):
        jobs = sorted(name for name, value in vars(module).items() if isinstance(value, Job))
        known = f"its jobs: {', '.join(jobs)}" if jobs else "it defines no redis_lease.Job"
        raise InvalidInput(f"module {module_name!r} has no {attr!r} for job {path!r} ({known})")
    job = getattr(module, attr)
    if not isinstance(job, Job):
        raise InvalidInput(f"{path!r} is a {type(job).__name__}, not a redis_lease.Job")
    return job


def _raised_at(error: BaseException) -> str:
    """Where the innermost frame of ``error``'s traceback outside this package lies (the
    user's line that raised, or called what raised): ' (at FILE:LINE)', or ''."""
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if f.filename[:1] != "<" and not os.path.abspath(f.filename).startswith(ours + os.sep)
    ]
    if not frames:  # a SyntaxError says where in its own message
        return ""
    return f" (at {frames[-1].filename}:{frames[-1].lineno})"


def loaded_job(path: str) -> Job:
    """The job at ``path`` (``package.module:attr``) in a module this process has loaded
    already, with a planner and a handler. Nothing is imported: a path that another process
    wrote (a job another worker declared) never chooses code for this one to run.

    Raises:
        InvalidInput: the module is not loaded here, holds no such job, or the job has no
            planner or handler (one line, said from the leader's side).
    """
    module_name, _, attr = path.partition(":")
    module = sys.modules.get(module_name)
    if module is None:
        raise InvalidInput(
            f"its module {module_name!r} is not loaded in the leader, which imports no module "
            "another worker names: give every worker the same --job options"
        )
    job = vars(module).get(attr)
    if not isinstance(job, Job):
        raise InvalidInput(
            f"the leader's module {module_name!r} has no job {attr!r} (the leader runs other "
            "code: an older release?)"
        )
    if job.plan_items is None or job.handle_item is None:
        raise InvalidInput(f"{path!r} has no planner or no handler in the leader")
    return job
