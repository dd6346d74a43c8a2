"""The tick leader: the one worker of a fleet that ticks the scheduler.

``redis-lease worker --job app.jobs:nightly`` runs a :class:`TickLeader` beside its RQ
worker. Every :data:`~redis_lease.limits.TICK_LEADER_RENEW_MS` ms it declares its jobs
(:mod:`redis_lease.protocol.store.declared_jobs`) and tries to hold the tick leader's lease
(``tick_leader.lua``: one lease per key prefix, on the server's clock,
:data:`~redis_lease.limits.TICK_LEADER_TTL_MS` long), as its process's own holder (its name
and an id made when it starts). While it holds it, it ticks at once and then every
:data:`~redis_lease.limits.TICK_EVERY` seconds, each tick fenced by the lease's token
(:func:`redis_lease.fleet.tick.scheduler_tick.tick`): its own jobs, and every job a live
worker declared that it finds in a module it had loaded when it started; it names the
others (its log, beside its lease for ``redis-lease workers`` and the metrics, and the
declaring worker's log). It says one line when it becomes the leader and one when it stops
being it.

When the leader dies or is paused, its lease runs out at most ``TICK_LEADER_TTL_MS``
after its last renewal, and every other worker tries every ``TICK_LEADER_RENEW_MS``: so
another ticks within :data:`~redis_lease.limits.TICK_TAKEOVER_BOUND` seconds (12 s at the
defaults).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence

from ...errors import InvalidInput, RedisLeaseError
from ...limits import TICK_EVERY, TICK_LEADER_RENEW_MS, TICK_LEADER_TTL_MS
from ...protocol.connection.translate import REDIS_FAILURES
from ...protocol.store.declared_jobs import (
    Unticked,
    declarations,
    declare_jobs,
    unticked_text,
    withdraw_jobs,
)
from ...protocol.store.leader import (
    Leadership,
    fence_floor,
    hold_leadership,
    process_holder,
    release_leadership,
    shown_holder,
)
from ...protocol.store.lease_store import LeaseStore
from ..full_redis import notice_full
from ..jobs.job import Job, load_job, loaded_job
from ..loss import data_set_mark, tick_memory
from .scheduler_tick import NOT_LEADER, tick

log = logging.getLogger("redis_lease.tick")

#: Periods a tick may run before its leader gives the lease up to another worker (it says
#: so every period past the first): a tick stuck on a planner that never returns must not
#: stop the fleet's ticks for good. The stuck tick, should it go on, is fenced off.
STUCK_PERIODS = 10


def check_jobs(job_paths: Sequence[str]) -> list[Job]:
    """Every job a worker is to tick, imported and well formed: a :class:`Job` with a
    planner and a handler, no job named twice.

    Raises:
        InvalidInput: one line naming the path and the fix.
    """
    jobs: dict[str, str] = {}
    loaded = []
    for path in job_paths:
        job = load_job(path)
        attr = path.partition(":")[2]
        for part, given in (("planner", job.plan_items), ("handler", job.handle_item)):
            if given is None:
                raise InvalidInput(
                    f"job {path!r} has no {part}: decorate a function with @{attr}.{part}"
                )
        if job.name in jobs and jobs[job.name] != path:
            raise InvalidInput(
                f"jobs {jobs[job.name]!r} and {path!r} are both named {job.name!r}: "
                "give each job its own name"
            )
        jobs[job.name] = path
        loaded.append(job)
    return loaded


class TickLeader(threading.Thread):
    """Holds or waits for the tick leader's lease, and ticks its jobs while it holds it.

    Args:
        store: the lease store (the tick enqueues shard jobs on ``store.rq``).
        name: the worker's name (shown; the lease's holder is :attr:`holder`).
        job_paths: the jobs it ticks (``package.module:attr``); it declares them too.
        say: told the lines of leadership won and lost, of each tick that decided
            something and of declared jobs not ticked; None to log them.
        every: seconds between two ticks of the leader.
    """

    def __init__(
        self,
        store: LeaseStore,
        name: str,
        job_paths: Sequence[str],
        say: Callable[[str], None] | None = None,
        every: float = TICK_EVERY,
    ) -> None:
        super().__init__(name="redis-lease-tick-leader", daemon=True)
        self.store, self.worker, self.job_paths = store, name, list(job_paths)
        #: This process's holder in the lease: its name and an id of its own, so that another
        #: process of the same name never shares its lease.
        self.holder = process_holder(name)
        self.say = say
        self.every = every
        self._done = threading.Event()
        self._tried = threading.Event()  # its first try is made, even when closed at once
        self._losing = threading.Lock()  # the renewals and the tick may both see a loss
        #: The lease held now, None while another holds it.
        self.leadership: Leadership | None = None
        #: When its last successful hold was sent (monotonic), and the token it gave.
        self._renewed = 0.0
        self._last_token = 0
        #: No hold answered another holder (or none), and it released nothing, since then.
        self._unbroken = False
        self._next_tick = 0.0
        self._ticking: threading.Thread | None = None
        self._tick_started = 0.0
        self._periods_told = 0
        #: The least token the next hold asks for (past a job fence a tick met).
        self._at_least = 1
        #: Its own jobs, by name, and the modules loaded once they were: the only code in
        #: which it looks for a job another worker declared.
        self._own = self._own_jobs()
        self._loaded = frozenset(sys.modules)
        #: What it says, beside its lease, of the declared jobs it does not tick.
        self._unticked = ""
        #: Declared jobs it said it ticks, or does not tick (and why), as the leader; its own
        #: jobs it was told are not ticked, as a declaring worker.
        self._told_adopted: dict[str, str] = {}
        self._told_unticked: dict[str, str] = {}
        self._told_mine: dict[str, str] = {}
        #: Ticks this worker made as the leader.
        self.ticks = 0

    def run(self) -> None:
        """Tries to hold the lease every renewal period until :meth:`close`."""
        while not self._done.is_set():
            try:
                self.step()
            except (RedisLeaseError, *REDIS_FAILURES) as error:
                if not notice_full(error, "tick leader"):
                    log.warning("tick leader: %s", error)
                self._lapse_if_late()
            except Exception:  # the thread must outlive any failure, or the fleet stops ticking
                log.exception("tick leader: unexpected error; trying again")
                self._lapse_if_late()
            self._tried.set()
            self._done.wait(TICK_LEADER_RENEW_MS / 1000)

    def step(self) -> None:
        """One try to hold (or renew) the lease, after declaring its jobs; a tick started when
        one is due."""
        try:
            self._declare()
        except InvalidInput as error:  # refused: it still competes for the lease and ticks
            log.warning("tick leader: could not declare its jobs: %s", error)
        if self._stuck():
            return
        sent = time.monotonic()
        lease = hold_leadership(
            self.store, self.holder, TICK_LEADER_TTL_MS, self._at_least, self._unticked
        )
        if not lease.held:
            self._unbroken = False
            if self.leadership is not None:
                holder = shown_holder(lease.holder) or "no one"
                self._end(f"{holder} holds it now (token {lease.token})")
            # a doubtful copy of what the server holds, should this worker lead after a wipe
            data_set_mark.mirror(self.store, list(self._own))
            return
        # held since its last hold without a break: nobody else held it (no other holder
        # answered, nothing released), its lease was live when this hold arrived (sent within
        # the TTL of the last one), and the token is its own or the next (each new holder
        # adds one: more means another held it between), or the least a hold may give
        # (the hash was lost, a wipe, and this is its first holder since)
        continuous = (
            self._unbroken
            and time.monotonic() - self._renewed < TICK_LEADER_TTL_MS / 1000
            and lease.token in (self._last_token, self._last_token + 1, self._at_least)
        )
        self._renewed, self._last_token, self._unbroken = sent, lease.token, True
        if self.leadership is not None and self.leadership.token != lease.token:
            self._end(f"it holds the lease again, with token {lease.token}")
        if self.leadership is None:
            self._begin(Leadership(self.holder, lease.token), continuous)
        busy = self._ticking is not None and self._ticking.is_alive()
        if not busy and time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.every
            self._ticking = threading.Thread(
                target=self._tick, args=(self.leadership,), name="redis-lease-tick", daemon=True
            )
            self._tick_started, self._periods_told = time.monotonic(), 0
            self._ticking.start()

    def _begin(self, leadership: Leadership, continuous: bool) -> None:
        """Where a leadership of this process begins (the one place).

        ``continuous``: this process held the lease without a break up to this leadership
        (its previous one ended less than the lease's TTL ago by the monotonic clock, no
        other holder was seen and nothing was released since, the token did not go back but
        to the least a hold gives, after a lost hash): no other leader can have ticked in
        between. False for its first leadership: then what the process remembers of the data
        set is in doubt (:func:`redis_lease.fleet.loss.tick_memory.distrust`).
        """
        if not continuous:  # another leader may have ticked since this process last did
            tick_memory.distrust(self.store)
        self.leadership = leadership
        self._next_tick = 0.0
        self._unticked, self._told_adopted, self._told_unticked = "", {}, {}
        self._tell(
            f"worker {self.worker}: tick leader (token {leadership.token}): ticks "
            f"{', '.join(self.job_paths)} every {self.every:g}s"
        )

    def _end(self, why: str, only: Leadership | None = None) -> None:
        """Where a leadership of this process ends (the one place): the leadership held now
        is forgotten (``only``: when it is still that one) and ``why`` is said."""
        with self._losing:
            if self.leadership is None or (only is not None and self.leadership != only):
                return
            token, self.leadership = self.leadership.token, None
        self._tell(f"worker {self.worker}: no longer the tick leader (token {token}): {why}")

    def _stuck(self) -> bool:
        """Says so each period a tick runs past its period; once it ran
        :data:`STUCK_PERIODS` periods, gives the lease up (and holds none while it runs)."""
        if self._ticking is None or not self._ticking.is_alive():
            return False
        ran = time.monotonic() - self._tick_started
        periods = int(ran // self.every)
        if periods > self._periods_told:
            self._periods_told = periods
            self._tell(
                f"worker {self.worker}: its tick has run {ran:.0f}s (one every {self.every:g}s)"
                + (
                    f"; it gives the lease up after {STUCK_PERIODS * self.every:g}s"
                    if periods < STUCK_PERIODS
                    else ""
                )
            )
        if periods < STUCK_PERIODS:
            return False
        if self.leadership is not None:
            release_leadership(self.store, self.holder)
            self._unbroken = False
            self._end(f"its tick has run {ran:.0f}s: another worker ticks now")
        return True

    def _tick(self, leadership: Leadership) -> None:
        try:
            try:
                paths, names = self._jobs_to_tick(leadership)
            except (RedisLeaseError, *REDIS_FAILURES) as error:  # its own jobs all the same
                log.warning("tick leader: could not read the declared jobs: %s", error)
                paths, names = list(self.job_paths), list(self._own)
            decisions = tick(self.store, paths, leader=leadership)
            self.ticks += 1
            if decisions:
                shown = "; ".join(str(d) for d in decisions)
                self._tell(f"worker {self.worker}: tick (token {leadership.token}): {shown}")
            if any(d.kind == NOT_LEADER for d in decisions):
                # a newer leader took over, or the lease's hash was lost and a job's fence is
                # ahead of this token: the next hold asks for a token past every fence
                self._at_least = fence_floor(self.store, names)
                self._end("a newer leader took over, or a job's fence is ahead", leadership)
        except (RedisLeaseError, *REDIS_FAILURES) as error:
            if not notice_full(error, "tick leader: tick"):
                log.warning("tick leader: tick failed: %s", error)
        except Exception:
            log.exception("tick leader: the tick failed unexpectedly")

    def _own_jobs(self) -> dict[str, str]:
        """Its own jobs that load: name -> path (one that does not is its tick's error)."""
        own: dict[str, str] = {}
        for path in self.job_paths:
            try:
                own.setdefault(load_job(path).name, path)
            except InvalidInput:
                continue
        return own

    def _jobs_to_tick(self, leadership: Leadership) -> tuple[list[str], list[str]]:
        """The paths this tick ticks and their jobs' names: its own, then each job another
        live worker declared that it finds, by a declared path, in a module it had loaded
        when it started (:func:`~redis_lease.fleet.jobs.job.loaded_job`: nothing is imported). The
        others are named (its log, and beside its lease from its next renewal)."""
        paths, names = list(self.job_paths), list(self._own)
        declared: dict[str, dict[str, set[str]]] = {}  # job -> path -> workers
        for declaration in declarations(self.store):
            if declaration.holder == self.holder:
                continue
            for name, path in declaration.jobs.items():
                if name not in self._own:
                    declared.setdefault(name, {}).setdefault(path, set()).add(declaration.worker)
        adopted: dict[str, str] = {}
        unticked: list[Unticked] = []
        for name, by_path in sorted(declared.items()):
            workers = sorted(set().union(*by_path.values()))
            reasons = [(path, self._not_tickable(name, path)) for path in sorted(by_path)]
            found = next((path for path, reason in reasons if not reason), None)
            if found is not None:
                paths.append(found)
                names.append(name)
                adopted[name] = (
                    f"ticks job {name} ({found}) too, declared by worker {', '.join(workers)}"
                )
            else:
                path, reason = reasons[0]
                unticked.append(Unticked(name, path, tuple(workers), reason))
        self._unticked = unticked_text(leadership.holder, leadership.token, unticked)
        self._tell_declared(adopted, unticked)
        return paths, names

    def _not_tickable(self, name: str, path: str) -> str:
        """Why this leader cannot tick job ``name`` at ``path``; '' when it can."""
        module = path.partition(":")[0]
        if module not in self._loaded:
            return (
                f"its module {module!r} was not loaded in the leader when it started, and a "
                "leader imports no module another worker names: give every worker the same "
                "--job options"
            )
        try:
            job = loaded_job(path)
        except InvalidInput as error:
            return str(error)
        return "" if job.name == name else f"{path!r} is job {job.name!r} in the leader"

    def _tell_declared(self, adopted: dict[str, str], unticked: list[Unticked]) -> None:
        """Says which declared jobs it ticks too, and which it does not and why, when that
        changed since it last said so."""
        now = {
            u.job: f"job {u.job} ({u.path}), declared by worker {', '.join(u.workers)}, is not "
            f"ticked: {u.reason}"
            for u in unticked
        }
        for told, lines in ((self._told_adopted, adopted), (self._told_unticked, now)):
            for name, line in lines.items():
                if told.get(name) != line:
                    self._tell(f"worker {self.worker}: {line}")
        self._told_adopted, self._told_unticked = adopted, now

    def _declare(self) -> None:
        """Declares its jobs, and says when the live leader does not tick one of them (or
        ticks one again that it did not)."""
        if not self._own:
            return
        said = declare_jobs(self.store, self.holder, self.worker, self._own)
        if said is None:  # no worker leads: nothing is said of any job until one does
            return
        mine = {
            u.job: f"job {u.job} ({u.path}), which this worker declared, is not ticked: {u.reason}"
            for u in said
            if u.job in self._own
        }
        for name, line in mine.items():
            if self._told_mine.get(name) != line:
                self._tell(f"worker {self.worker}: {line}")
        for name in self._told_mine.keys() - mine.keys():
            self._tell(
                f"worker {self.worker}: job {name}, which this worker declared, is ticked now"
            )
        self._told_mine = mine

    def _lapse_if_late(self) -> None:
        """The lease is taken for lost once no renewal succeeded for its whole TTL."""
        late = time.monotonic() - self._renewed > TICK_LEADER_TTL_MS / 1000
        if self.leadership is not None and late:
            self._end("its lease ran out unrenewed")

    def _tell(self, line: str) -> None:
        if self.say is not None:
            self.say(line)
        else:
            log.warning(line)

    def close(self) -> None:
        """Stops trying (after its first try), waits for a tick under way, frees the lease at
        once when held, and withdraws its declared jobs."""
        if self.is_alive():
            self._tried.wait(timeout=5)
        self._done.set()
        if self.is_alive():
            self.join(timeout=5)
        if self._ticking is not None:
            self._ticking.join(timeout=30)
        try:
            release_leadership(self.store, self.holder)
            if self._own:
                withdraw_jobs(self.store, self.holder)
        except (RedisLeaseError, *REDIS_FAILURES) as error:
            log.warning("could not release the tick leader's lease: %s", error)
        self._end("its worker stops")
