"""Three ``redis-lease worker --job`` processes and nothing else on a private Redis: one
ticks; a run that falls due is created once, dispatched and finished; SIGKILL or SIGSTOP of
the ticking worker hands the lease to another within the stated bound, and a paused
former leader's late tick changes nothing. A worker started later with more jobs (a rolling
deploy that adds jobs): the leader ticks the one it finds in its code and names the other.

The job (tests.leader_jobs:scheduled) is scheduled to the second, a few seconds after the
workers start, so the run falls due while the test watches; the leader is killed or
paused before that, so it is the next leader that must create it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from redis_lease import LeaseStore
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.limits import TICK_LEADER_RENEW_MS, TICK_TAKEOVER_BOUND
from tests import leader_jobs
from tests.fleet_helpers import REPO, Processes, stop_group, text, wait_for
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

JOB_PATH = "tests.leader_jobs:scheduled"
#: A job of the leader's own module, and one of a module it never loads.
OTHER_PATH = "tests.leader_jobs:other"
WEEKLY_PATH = "tests.declared_jobs:weekly"
PROGRAM = [sys.executable, "-m", "redis_lease"]
#: Seconds between two ticks of the leader in these tests (60 by default).
TICK_EVERY = 1
#: How long a test waits for another worker to take the lease over: a deadline for a fleet
#: that never does, not the product's bound (TICK_TAKEOVER_BOUND, printed beside what it
#: took), which a loaded machine may miss for no defect.
TAKEOVER_DEADLINE = 60.0
_LEADER_LINE = re.compile(r"worker (\S+): tick leader \(token (\d+)\)")
_TICK_LINE = re.compile(r"worker (\S+): tick \(token (\d+)\): (.*)")
#: A worker process's id at the end of the lease's holder (its name comes first).
_PROCESS_ID = re.compile(r"#[0-9a-f]{32}$")


@dataclass
class Fleet:
    """Worker processes with ``--job`` on one private Redis, and what they say."""

    procs: Processes
    url: str
    prefix: str
    client: redis.Redis
    fire: datetime
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        """The run the schedule makes due."""
        return f"scheduled:{self.fire.date().isoformat()}"

    def start(self, count: int, jobs: tuple[str, ...] = (JOB_PATH,)) -> list[str]:
        """Starts ``count`` more workers, each given ``jobs`` to tick when it leads; the first
        of the fleet forks a work horse per shard job, the others run them in place
        (``--simple``). Returns their names."""
        second, minute, hour = self.fire.second, self.fire.minute, self.fire.hour
        env = {
            "LEADER_SCHEDULE": f"{minute} {hour} * * * {second}",
            "LEADER_QUEUE": f"{self.prefix}-q",
        }
        started = []
        for n in range(len(self.workers), len(self.workers) + count):
            name = f"{self.prefix}-w{n}"
            args = [*PROGRAM, "--url", self.url]
            args += ["--prefix", self.prefix, "worker", "--queue", f"{self.prefix}-q"]
            args += [*(["--simple"] if n else []), "--name", name]
            args += [arg for path in jobs for arg in ("--job", path)]
            args += ["--tick-every", str(TICK_EVERY)]
            self.workers[name] = self.procs.start(args, env, name)
            started.append(name)
        return started

    def lease(self) -> tuple[str, int]:
        """The tick leader's lease as Redis holds it: the holder's worker name and the token."""
        holder, token = self.client.hmget(f"{self.prefix}:{{tick_leader}}", ["holder", "token"])
        return _PROCESS_ID.sub("", text(holder or b"")), int(token or 0)

    def leader_after(self, token: int, timeout: float) -> str:
        """The worker that holds the lease with a token past ``token``, once one does."""

        def holder() -> str | None:
            name, now = self.lease()
            return name if name and now > token else None

        return wait_for(holder, timeout, f"a leader with a token past {token}", every=0.02)

    def log(self, name: str) -> str:
        """Everything worker ``name`` printed."""
        return (self.procs.logs / f"{name}.log").read_text(errors="replace")

    def server_now(self) -> datetime:
        """The server's clock."""
        seconds, micros = self.client.time()
        return datetime.fromtimestamp(seconds + micros / 1e6, UTC)

    def server_ms(self) -> int:
        """The server's clock in ms."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def beat(self, name: str) -> int:
        """Worker ``name``'s last beat (server ms, its fleet watch), 0 before any."""
        return int(self.client.zscore(f"{self.prefix}:{{workers}}:seen", name) or 0)

    def state(self) -> str:
        """The run's state ('' before it exists)."""
        return text(self.client.hget(f"{self.prefix}:run:{{{self.run_id}}}", "state") or b"")

    def evidence(self) -> dict[str, Any]:
        """What a tick writes, as Redis holds it: the runs, the job's dates, the run's
        record and event log, the fence of the job's tick lock and every RQ job made."""
        events = self.client.xrange(f"{self.prefix}:run:{{{self.run_id}}}:events")
        return {
            "runs": self.client.zrange(f"{self.prefix}:runs", 0, -1),
            "dates": self.client.zrange(f"{self.prefix}:job:{{scheduled}}:dates", 0, -1),
            "run": sorted(self.client.hgetall(f"{self.prefix}:run:{{{self.run_id}}}").items()),
            "events": events,
            "fence": self.client.get(f"{self.prefix}:job:{{scheduled}}:tick:fence"),
            "rq_jobs": sorted(self.client.scan_iter(match="rq:job:*", count=1000)),
        }


@pytest.fixture
def fleet(private_redis: Callable[..., RedisServer], procs: Processes) -> Iterator[Fleet]:
    """A private Redis and a fleet on it whose job falls due 16 s from now (server clock)."""
    server = private_redis()
    client = redis.Redis.from_url(server.url)
    made = Fleet(procs, server.url, "rlt", client, datetime.now(UTC))
    made.fire = (made.server_now() + timedelta(seconds=16)).replace(microsecond=0)
    yield made
    procs.kill_all()
    client.close()


def first_leader(fleet: Fleet) -> str:
    """Starts three workers; the one that holds the lease first (token 1), once it ticked."""
    fleet.start(3)
    name = fleet.leader_after(0, 30)
    wait_for(lambda: f"worker {name}: tick (token 1)" in fleet.log(name), 10, "a first tick")
    assert fleet.server_now() < fleet.fire - timedelta(seconds=2), "too slow to start"
    assert not fleet.state(), "the run was not due yet"
    return name


def assert_one_run_done_once(fleet: Fleet) -> None:
    """The due run exists once, made by one create decision, and each item took effect once."""
    store = LeaseStore(fleet.client, prefix=fleet.prefix)

    def decided() -> list[str]:
        return [event["kind"] for event in Runs(store).decisions(fleet.run_id, 100)]

    # the state changes first, then whoever ended the run records its finalize decision
    wait_for(
        lambda: fleet.state() == "succeeded" and "finalize" in decided(),
        60,
        "the run to succeed and its end to be recorded",
        every=0.2,
    )
    assert fleet.client.zrange(f"{fleet.prefix}:runs", 0, -1) == [fleet.run_id.encode()]
    kinds = decided()
    assert kinds.count("create") == 1 and "dispatch" in kinds, kinds
    effects = fleet.client.hgetall(leader_jobs.effects_key(fleet.prefix))
    assert sorted(effects.values()) == [b"1"] * leader_jobs.ITEMS


def assert_one_ticker_per_token(fleet: Fleet) -> dict[int, str]:
    """Each token was announced by one worker, and only that worker ticked with it."""
    leaders: dict[int, str] = {}
    for name in fleet.workers:
        for worker, token in _LEADER_LINE.findall(fleet.log(name)):
            assert worker == name
            assert int(token) not in leaders, f"token {token} announced twice"
            leaders[int(token)] = name
    for name in fleet.workers:
        for worker, token, _ in _TICK_LINE.findall(fleet.log(name)):
            assert leaders.get(int(token)) == worker == name, f"{name} ticked with token {token}"
    return leaders


def test_three_workers_tick_once_and_a_killed_leader_is_replaced(fleet: Fleet) -> None:
    """SIGKILL of the ticking worker before the run is due: another holds the lease within
    the bound, creates the run once, and the fleet dispatches and finishes it."""
    killed = first_leader(fleet)
    os.killpg(fleet.workers[killed].pid, signal.SIGKILL)
    fleet.workers[killed].wait(timeout=10)
    since = time.monotonic()
    successor = fleet.leader_after(1, TAKEOVER_DEADLINE)
    took = time.monotonic() - since
    assert successor != killed
    assert_one_run_done_once(fleet)
    leaders = assert_one_ticker_per_token(fleet)
    assert leaders == {1: killed, 2: successor}
    assert f"tick (token 2): create {fleet.run_id}" in fleet.log(successor)
    print(f"takeover after SIGKILL: {took:.1f}s (bound {TICK_TAKEOVER_BOUND:g}s)")


def test_a_paused_leader_is_replaced_and_its_late_tick_changes_nothing(fleet: Fleet) -> None:
    """SIGSTOP of the ticking worker past its lease: another creates and finishes the run;
    SIGCONT: the former leader says it no longer leads and Redis holds what it held."""
    paused = first_leader(fleet)
    pgid = fleet.workers[paused].pid
    stop_group(pgid)
    since = time.monotonic()
    successor = fleet.leader_after(1, TAKEOVER_DEADLINE)
    took = time.monotonic() - since
    assert_one_run_done_once(fleet)
    before = fleet.evidence()
    said = len(fleet.log(paused))
    os.killpg(pgid, signal.SIGCONT)
    wait_for(
        lambda: "no longer the tick leader (token 1)" in fleet.log(paused)[said:],
        10,
        "the former leader to see it lost the lease",
    )
    resumed = fleet.server_ms()
    wait_for(  # two of its renewal periods after it resumed, its process still working
        lambda: fleet.beat(paused) > resumed + 2 * TICK_LEADER_RENEW_MS,
        15,
        "the former leader to beat on after it resumed",
        every=0.1,
    )
    assert fleet.evidence() == before
    late = _TICK_LINE.findall(fleet.log(paused)[said:])
    assert all(line.startswith("not_leader") for _, _, line in late), late
    assert fleet.lease() == (successor, 2)
    assert assert_one_ticker_per_token(fleet) == {1: paused, 2: successor}
    print(f"takeover after SIGSTOP: {took:.1f}s (bound {TICK_TAKEOVER_BOUND:g}s)")


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("tests.no_such_module:job", "error: cannot import 'tests.no_such_module' for job"),
        ("tests.leader_jobs", "error: job path 'tests.leader_jobs' must look like"),
        ("tests.leader_jobs:bare", "error: job 'tests.leader_jobs:bare' has no handler"),
    ],
)
def test_a_bad_job_refuses_to_start_with_one_line(
    redis_url: str, prefix: str, path: str, said: str
) -> None:
    done = subprocess.run(
        [*PROGRAM, "--url", redis_url, "--prefix", prefix, "worker", "--job", path, "--burst"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(said), done.stderr


def cli(fleet: Fleet, *args: str) -> str:
    """What ``redis-lease ARGS`` prints on the fleet's Redis (it must succeed)."""
    done = subprocess.run(
        [*PROGRAM, "--url", fleet.url, "--prefix", fleet.prefix, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_job_only_a_later_worker_was_given_is_ticked_or_named(fleet: Fleet) -> None:
    """The leader is given one job; a worker started later (a rolling deploy that adds jobs)
    is given two more: one of the leader's own module, which the leader ticks too, and one of
    a module the leader never loaded, which it names: in its log and the later worker's, in
    ``redis-lease workers`` and in the metrics."""
    (leader,) = fleet.start(1)
    assert fleet.leader_after(0, 30) == leader
    wait_for(lambda: f"worker {leader}: tick (token 1)" in fleet.log(leader), 10, "a first tick")
    (later,) = fleet.start(1, (JOB_PATH, OTHER_PATH, WEEKLY_PATH))
    other = f"{fleet.prefix}:job:{{other}}"
    wait_for(
        lambda: fleet.client.hget(other, "path") == OTHER_PATH.encode(),
        30,
        "the leader to tick the job of its module that the later worker declared",
        every=0.2,
    )
    named = (
        f"worker {leader}: job weekly ({WEEKLY_PATH}), declared by worker {later}, is not ticked: "
    )
    told = (
        f"worker {later}: job weekly ({WEEKLY_PATH}), which this worker declared, is not ticked: "
        f"the tick leader {leader}: its module 'tests.declared_jobs' was not loaded"
    )
    wait_for(lambda: named in fleet.log(leader), 10, "the leader to name the job")
    wait_for(lambda: told in fleet.log(later), 10, "the later worker to say it")
    assert f"worker {leader}: ticks job other ({OTHER_PATH}) too, declared by worker {later}" in (
        fleet.log(leader)
    )
    assert fleet.lease() == (leader, 1), "the later worker did not take the lead"
    assert not fleet.client.exists(f"{fleet.prefix}:job:{{weekly}}"), "the leader ticked it"

    rows = {row["name"]: row for row in json.loads(cli(fleet, "workers", "--json"))}
    assert rows[leader]["tick_leader"] and not rows[later]["tick_leader"]
    assert [job["job"] for job in rows[later]["unticked_jobs"]] == ["weekly"]
    assert rows[later]["jobs"] == {
        "other": OTHER_PATH,
        "scheduled": JOB_PATH,
        "weekly": WEEKLY_PATH,
    }
    table = cli(fleet, "workers")
    assert f"danger: job weekly ({WEEKLY_PATH}), declared by worker {later}, is not ticked: " in (
        table
    )
    metrics = cli(fleet, "metrics")
    assert 'redis_lease_declared_job_unticked{job="weekly"} 1.0' in metrics
    assert 'redis_lease_declared_job_unticked{job="other"} 0.0' in metrics
    assert 'redis_lease_declared_job_unticked{job="scheduled"} 0.0' in metrics
