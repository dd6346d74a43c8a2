"""The tick leader: the one worker of a fleet that ticks the scheduler.

``redis-lease worker --job app.jobs:nightly`` runs a :class:`TickLeader` beside its RQ
worker. Every :data:`~redis_lease.limits.TICK_LEADER_RENEW_MS` ms it tries to hold the
tick leader's lease (``tick_leader.lua``: one lease per key prefix, on the server's
clock, :data:`~redis_lease.limits.TICK_LEADER_TTL_MS` long); while it holds it, it ticks
its jobs at once and then every :data:`~redis_lease.limits.TICK_EVERY` seconds, each tick
fenced by the lease's token (:func:`redis_lease.fleet.tick.scheduler_tick.tick`). It says
one line when it becomes the leader and one when it stops being it.

When the leader dies or is paused, its lease runs out at most ``TICK_LEADER_TTL_MS``
after its last renewal, and every other worker tries every ``TICK_LEADER_RENEW_MS``: so
another ticks within :data:`~redis_lease.limits.TICK_TAKEOVER_BOUND` seconds (12 s at the
defaults).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from ...errors import InvalidInput, RedisLeaseError
from ...limits import TICK_EVERY, TICK_LEADER_RENEW_MS, TICK_LEADER_TTL_MS
from ...protocol.connection.translate import REDIS_FAILURES
from ...protocol.store.leader import (
    Leadership,
    fence_floor,
    hold_leadership,
    release_leadership,
)
from ...protocol.store.lease_store import LeaseStore
from ..job import Job, load_job
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
    """Holds or waits for the tick leader's lease, and ticks ``job_paths`` while it holds it.

    Args:
        store: the lease store (the tick enqueues shard jobs on ``store.rq``).
        name: the worker's name (the lease's holder).
        job_paths: the jobs it ticks (``package.module:attr``).
        say: told the lines of leadership won and lost and of each tick that decided
            something; None to log them.
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
        self.say = say
        self.every = every
        self._done = threading.Event()
        self._tried = threading.Event()  # its first try is made, even when closed at once
        self._losing = threading.Lock()  # the renewals and the tick may both see a loss
        #: The lease held now, None while another holds it.
        self.leadership: Leadership | None = None
        self._renewed = 0.0
        self._next_tick = 0.0
        self._ticking: threading.Thread | None = None
        self._tick_started = 0.0
        self._periods_told = 0
        #: The least token the next hold asks for (past a job fence a tick met).
        self._at_least = 1
        #: Ticks this worker made as the leader.
        self.ticks = 0

    def run(self) -> None:
        """Tries to hold the lease every renewal period until :meth:`close`."""
        while not self._done.is_set():
            try:
                self.step()
            except (RedisLeaseError, *REDIS_FAILURES) as error:
                log.warning("tick leader: %s", error)
                self._lapse_if_late()
            except Exception:  # the thread must outlive any failure, or the fleet stops ticking
                log.exception("tick leader: unexpected error; trying again")
                self._lapse_if_late()
            self._tried.set()
            self._done.wait(TICK_LEADER_RENEW_MS / 1000)

    def step(self) -> None:
        """One try to hold (or renew) the lease; a tick started when one is due."""
        if self._stuck():
            return
        lease = hold_leadership(self.store, self.worker, TICK_LEADER_TTL_MS, self._at_least)
        if not lease.held:
            if self.leadership is not None:
                self._lose(f"{lease.holder or 'no one'} holds it now (token {lease.token})")
            return
        self._renewed = time.monotonic()
        if self.leadership is None or self.leadership.token != lease.token:
            self.leadership = Leadership(self.worker, lease.token)
            self._next_tick = 0.0
            self._tell(
                f"worker {self.worker}: tick leader (token {lease.token}): ticks "
                f"{', '.join(self.job_paths)} every {self.every:g}s"
            )
        busy = self._ticking is not None and self._ticking.is_alive()
        if not busy and time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.every
            self._ticking = threading.Thread(
                target=self._tick, args=(self.leadership,), name="redis-lease-tick", daemon=True
            )
            self._tick_started, self._periods_told = time.monotonic(), 0
            self._ticking.start()

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
            release_leadership(self.store, self.worker)
            self._lose(f"its tick has run {ran:.0f}s: another worker ticks now")
        return True

    def _tick(self, leadership: Leadership) -> None:
        try:
            decisions = tick(self.store, self.job_paths, leader=leadership)
            self.ticks += 1
            if decisions:
                shown = "; ".join(str(d) for d in decisions)
                self._tell(f"worker {self.worker}: tick (token {leadership.token}): {shown}")
            if any(d.kind == NOT_LEADER for d in decisions):
                # a newer leader took over, or the lease's hash was lost and a job's fence is
                # ahead of this token: the next hold asks for a token past every fence
                names = [load_job(path).name for path in self.job_paths]
                self._at_least = fence_floor(self.store, names)
                self._lose("a newer leader took over, or a job's fence is ahead", leadership)
        except (RedisLeaseError, *REDIS_FAILURES) as error:
            log.warning("tick leader: tick failed: %s", error)
        except Exception:
            log.exception("tick leader: the tick failed unexpectedly")

    def _lapse_if_late(self) -> None:
        """The lease is taken for lost once no renewal succeeded for its whole TTL."""
        late = time.monotonic() - self._renewed > TICK_LEADER_TTL_MS / 1000
        if self.leadership is not None and late:
            self._lose("its lease ran out unrenewed")

    def _lose(self, why: str, only: Leadership | None = None) -> None:
        """Forgets the leadership held now (``only``: when it is still that one)."""
        with self._losing:
            if self.leadership is None or (only is not None and self.leadership != only):
                return
            token, self.leadership = self.leadership.token, None
        self._tell(f"worker {self.worker}: no longer the tick leader (token {token}): {why}")

    def _tell(self, line: str) -> None:
        if self.say is not None:
            self.say(line)
        else:
            log.warning(line)

    def close(self) -> None:
        """Stops trying (after its first try), waits for a tick under way, and frees the lease
        at once when held."""
        if self.is_alive():
            self._tried.wait(timeout=5)
        self._done.set()
        if self.is_alive():
            self.join(timeout=5)
        if self._ticking is not None:
            self._ticking.join(timeout=30)
        try:
            release_leadership(self.store, self.worker)
        except (RedisLeaseError, *REDIS_FAILURES) as error:
            log.warning("could not release the tick leader's lease: %s", error)
