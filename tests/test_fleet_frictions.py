"""The fleet's frictions, each shown through the command line a person uses.

- ``tick``/``worker`` import a job module from the working directory (as ``rq worker``
  does), and say where they looked when it does not import;
- shard jobs that crash are counted on their run with their last error, the tick backs
  off dispatching (a ``backoff`` decision with its reason) and adds no burst capacity,
  and ``worker --burst`` exits 8;
- the worker prints a line at start, per shard job and on SIGTERM;
- ``start`` shows planning progress on a terminal when it takes over a second, and is
  quiet otherwise;
- a run made without a job is ended by ``finalize``;
- ``metrics --serve`` with a bad or taken port is one line and exit 2.
"""

from __future__ import annotations

import importlib
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from redis_lease import LeaseStore
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.open_runs import RATE_WINDOW
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.fleet.transport.shard_job_failures import (
    BACKOFF_BASE,
    FAILURE_STREAK_LIMIT,
    job_failures,
)
from redis_lease.fleet.transport.shard_jobs import live_jobs
from redis_lease.protocol.leases import Item
from tests import fleet_jobs
from tests.fleet_helpers import FLEET_PATH, Processes, fleet_env, wait_for
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

CLI = str(Path(sys.executable).parent / "redis-lease")

#: A job module written to the test's directory; {name}, {queue}, {handler} filled in.
MODULE = """
import time
from datetime import timedelta
from redis_lease.fleet.jobs.job import Job
from redis_lease.protocol.leases import Item

job = Job("{name}", shards=2, queue="{queue}", schedule="0 0 29 2 *",
          deadline_after=timedelta(minutes=10), lease_ttl_seconds=5, max_shard_jobs=8,
          backoff_base_seconds=0.1)

@job.planner
def plan(business_date):
    for n in range({items}):
        if n and n % 500 == 0:
            time.sleep({pause})
        yield Item(f"item-{{n:05d}}", {{"n": n}})

{handler}
"""
HANDLER = """
@job.handler
def handle(item, lease):
    return {"n": item.payload["n"]}
"""


def write_module(
    directory: Path, name: str, queue: str, *, handler: bool, items: int = 6, pause: float = 0
) -> str:
    """Writes ``<name>.py`` with its job (with or without a handler); returns its job path."""
    module = name.replace("-", "_")
    source = MODULE.format(
        name=name, queue=queue, items=items, pause=pause, handler=HANDLER if handler else ""
    )
    (directory / f"{module}.py").write_text(textwrap.dedent(source))
    return f"{module}:job"


def cli(
    redis_url: str, prefix: str, *args: str, cwd: Path, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Runs the installed ``redis-lease`` script (not ``python -m``: that adds the working
    directory to the import path by itself) in ``cwd``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TTY_COMPATIBLE")}
    return subprocess.run(
        [CLI, "--url", redis_url, "--prefix", prefix, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working directory for job modules, importable by this process too."""
    directory = tmp_path / "work"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    yield directory
    for module in [m for m in sys.modules if m.startswith("rltest_")]:
        del sys.modules[module]


def test_tick_and_worker_import_a_job_from_the_working_directory(
    real_store: LeaseStore, redis_url: str, queue_name: str, tmp_path: Path
) -> None:
    directory = tmp_path / "here"
    directory.mkdir()
    name = f"{real_store.prefix}-cwd"
    path = write_module(directory, name, queue_name, handler=True)
    done = cli(redis_url, real_store.prefix, "start", path, cwd=directory)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split(":")[0] + ":" + done.stdout.split(":")[1]
    assert run_id.startswith(name)
    worked = cli(redis_url, real_store.prefix, "worker", "-q", queue_name, "--burst", cwd=directory)
    assert worked.returncode == 0, worked.stdout + worked.stderr
    assert real_store.status(run_id).counts["done"] == 6

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    missing = cli(redis_url, real_store.prefix, "tick", path, cwd=elsewhere)
    assert missing.returncode == 2
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in missing.stderr
    assert f"searched the working directory {elsewhere}" in lines[0]


def test_crashing_shard_jobs_are_counted_backed_off_and_never_burst(
    real_store: LeaseStore, redis_url: str, queue_name: str, workdir: Path
) -> None:
    name = f"{real_store.prefix}-crash"
    path = write_module(workdir, name, queue_name, handler=False, items=40)
    runs = Runs(real_store)
    now = runs.server_now()
    started = cli(redis_url, real_store.prefix, "start", path, cwd=workdir)
    assert started.returncode == 0, started.stderr
    run_id = next(r for r in real_store.run_ids() if r.startswith(name))
    assert sum(map(len, live_jobs(real_store, run_id).values())) == 2

    # A forking worker runs both shard jobs; each fails (the job has no handler).
    first = cli(redis_url, real_store.prefix, "worker", "-q", queue_name, "--burst", cwd=workdir)
    assert first.returncode == 8, first.stdout + first.stderr
    assert first.stdout.count("job failed after") == 2, first.stdout
    assert "has no handler" in first.stdout
    error = first.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: 2 of the 2 shard jobs this worker")
    failures = job_failures(runs.info(run_id))
    assert (failures.count, failures.streak) == (2, 2)
    assert failures.last_error.startswith("shard ")
    assert "has no handler; decorate one with @job.handler" in failures.last_error
    assert failures.last_error_at_ms is not None

    # Below the limit the tick dispatches again, and adds no burst capacity however late.
    kinds: list[str] = []
    moment = now + timedelta(seconds=RATE_WINDOW + 1)
    again = tick(real_store, [path], now=moment)
    kinds += [d.kind for d in again]
    assert [d.kind for d in again] == ["dispatch"]
    second = cli(redis_url, real_store.prefix, "worker", "-q", queue_name, "--burst", cwd=workdir)
    assert second.returncode == 8
    assert job_failures(runs.info(run_id)).streak == 4 >= FAILURE_STREAK_LIMIT

    # Past the limit: a backoff decision with the reason, and nothing dispatched.
    moment += timedelta(seconds=RATE_WINDOW + 1)
    held = tick(real_store, [path], now=moment)
    assert [d.kind for d in held] == ["backoff"], held
    assert "4 shard jobs failed in a row" in held[0].reason
    assert "has no handler" in held[0].reason
    backoff = BACKOFF_BASE * 2 ** (4 - FAILURE_STREAK_LIMIT)
    assert f"dispatching nothing for {backoff:.0f}s" in held[0].reason
    assert live_jobs(real_store, run_id) == {}
    # Within the back-off: nothing dispatched and nothing more logged.
    moment += timedelta(seconds=RATE_WINDOW + 1)
    assert tick(real_store, [path], now=moment) == []
    assert live_jobs(real_store, run_id) == {}
    # After it: one shard job tries again.
    moment += timedelta(seconds=backoff)
    probe = tick(real_store, [path], now=moment)
    assert [d.kind for d in probe] == ["dispatch"]
    assert "trying again after 4 failed shard jobs" in probe[0].reason
    assert sum(map(len, live_jobs(real_store, run_id).values())) == 1
    third = cli(redis_url, real_store.prefix, "worker", "-q", queue_name, "--burst", cwd=workdir)
    assert third.returncode == 8
    moment += timedelta(seconds=RATE_WINDOW + 1)
    longer = tick(real_store, [path], now=moment)
    assert [d.kind for d in longer] == ["backoff"]
    assert f"dispatching nothing for {2 * backoff:.0f}s" in longer[0].reason
    kinds += [e["kind"] for e in runs.decisions(run_id, count=200)]
    assert "burst" not in kinds
    assert job_failures(runs.info(run_id)).count == 5


def test_a_shard_job_that_ends_normally_ends_the_failure_streak(
    real_store: LeaseStore, redis_url: str, queue_name: str, workdir: Path
) -> None:
    name = f"{real_store.prefix}-mend"
    path = write_module(workdir, name, queue_name, handler=False)
    assert cli(redis_url, real_store.prefix, "start", path, cwd=workdir).returncode == 0
    run_id = next(r for r in real_store.run_ids() if r.startswith(name))
    failed = cli(redis_url, real_store.prefix, "worker", "-q", queue_name, "--burst", cwd=workdir)
    assert failed.returncode == 8
    assert job_failures(Runs(real_store).info(run_id)).streak == 2
    # The handler is deployed; the next shard jobs work.
    write_module(workdir, name, queue_name, handler=True)
    tick(real_store, [path])
    mended = cli(redis_url, real_store.prefix, "worker", "-q", queue_name, "--burst", cwd=workdir)
    assert mended.returncode == 0, mended.stdout + mended.stderr
    failures = job_failures(Runs(real_store).info(run_id))
    assert (failures.count, failures.streak) == (2, 0)
    assert real_store.status(run_id).counts["done"] == 6


def test_worker_prints_at_start_per_shard_job_and_on_sigterm(
    real_store: LeaseStore,
    redis_url: str,
    queue_name: str,
    procs: Processes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = fleet_env(queue_name, items=8, shards=2)
    args = [sys.executable, "-m", "redis_lease", "--url", redis_url, "--prefix", real_store.prefix]
    worker = procs.start([*args, "worker", "-q", queue_name, "--concurrency", "2"], env, "w")
    wait_for(lambda: "worker " in procs.log("w"), 30, "the start line")
    start_line = procs.log("w").splitlines()[0]
    assert f"queues {queue_name}, concurrency 2, forking" in start_line, start_line
    assert start_line.endswith(f"Redis {redis_url}")

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    job = importlib.reload(fleet_jobs).fleet
    try:
        runs = Runs(real_store)
        run_id, _ = runs.ensure(job, runs.server_now().date(), runs.server_now())
        tick(real_store, [FLEET_PATH])

        def per_job() -> list[str]:
            log = procs.log("w").splitlines()
            return [line for line in log if line.startswith(f"run {run_id} shard ")]

        lines = wait_for(lambda: len(per_job()) >= 2 and per_job(), 60, "a line per shard job")
        assert {line.split(" shard ")[1].split(":")[0] for line in lines} == {"0", "1"}
        committed = sum(int(line.split("committed ")[1].split(",")[0]) for line in lines)
        assert committed == 8, lines
        assert all(re.search(r", failed 0 in \d+\.\ds$", line) for line in lines), lines
    finally:
        monkeypatch.undo()
        importlib.reload(fleet_jobs)
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=30)
    log = procs.log("w")
    assert "SIGTERM: finishing the current shard job" in log, log
    assert "stopped after 2 shard jobs, 0 failed" in log, log
    assert worker.returncode == 0


def test_worker_start_line_masks_the_password(
    private_redis: Callable[..., RedisServer], queue_name: str, tmp_path: Path
) -> None:
    server = private_redis(requirepass="s3cret-pass")
    assert "s3cret-pass" in server.url
    done = cli(server.url, "rltest-mask", "worker", "-q", queue_name, "--burst", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("worker ") and f"queues {queue_name}, the jobs' concurrency" in first
    assert first.endswith(f"Redis redis://:***@127.0.0.1:{server.port}/0"), first
    assert "s3cret-pass" not in done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.endswith("stopped after 0 shard jobs, 0 failed, 0 leases lost to other workers")


def test_start_shows_planning_progress_on_a_terminal_only(
    real_store: LeaseStore, redis_url: str, queue_name: str, workdir: Path
) -> None:
    path = write_module(
        workdir, f"{real_store.prefix}-slow", queue_name, handler=True, items=1600, pause=0.6
    )
    quiet = cli(redis_url, real_store.prefix, "start", path, "--date", "2031-01-01", cwd=workdir)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""  # a pipe: no progress

    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "FORCE_TERMINAL")}
    process = subprocess.Popen(
        [
            CLI,
            "--url",
            redis_url,
            "--prefix",
            real_store.prefix,
            "start",
            path,
            "--date",
            "2031-01-02",
        ],
        cwd=workdir,
        env={**env, "COLUMNS": "100"},
        stdout=subprocess.DEVNULL,
        stderr=follower,
    )
    os.close(follower)
    shown = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the process closed it
                break
            if not chunk:
                break
            shown += chunk
        elif process.poll() is not None:
            break
    process.wait(timeout=30)
    os.close(leader)
    assert process.returncode == 0
    text = shown.decode(errors="replace")
    assert "planning" in text and "items" in text, text


def test_finalize_ends_a_run_made_without_a_job(
    real_store: LeaseStore, redis_url: str, tmp_path: Path
) -> None:
    run_id = f"{real_store.prefix}-adhoc"
    real_store.add(run_id, [Item("a"), Item("b")])
    for item in ("a", "b"):
        real_store.commit(real_store.claim(run_id, item, worker="w", ttl=30))
    other = f"{real_store.prefix}-adhoc2"
    real_store.add(other, [Item("a"), Item("b")])
    real_store.commit(real_store.claim(other, "a", worker="w", ttl=30))
    done = cli(redis_url, real_store.prefix, "finalize", run_id, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip() == f"{run_id}: succeeded: finalized by an operator: 2 done of 2 planned"
    )
    runs = Runs(real_store)
    assert runs.info(run_id)["state"] == "succeeded"
    partial = cli(redis_url, real_store.prefix, "finalize", other, "--json", cwd=tmp_path)
    assert partial.stdout.strip() == f'{{"run": "{other}", "state": "partial", "changed": true}}'
    again = cli(redis_url, real_store.prefix, "finalize", run_id, cwd=tmp_path)
    assert again.returncode == 0
    assert again.stdout.strip() == f"{run_id}: succeeded; not open, nothing changed"
    missing = cli(redis_url, real_store.prefix, "finalize", f"{run_id}-nope", cwd=tmp_path)
    assert missing.returncode == 5
    assert len(missing.stderr.strip().splitlines()) == 1


def test_metrics_serve_with_a_bad_or_taken_port_is_one_line(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    bad = cli(redis_url, prefix, "metrics", "--serve", "99999", cwd=tmp_path)
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "99999" in lines[0] and "--serve" in lines[0], bad.stderr
    assert "unexpected" not in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = cli(redis_url, prefix, "metrics", "--serve", str(port), cwd=tmp_path)
    assert busy.returncode == 2
    assert busy.stderr.strip() == (
        f"error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    )


def test_a_shard_job_whose_work_horse_dies_is_counted_by_the_tick(
    real_store: LeaseStore, redis_url: str, queue_name: str, workdir: Path
) -> None:
    name = f"{real_store.prefix}-dies"
    path = write_module(workdir, name, queue_name, handler=True)
    module = workdir / f"{path.split(':')[0]}.py"
    dying = "\n@job.handler\ndef handle(item, lease):\n    import os\n    os._exit(3)\n"
    module.write_text(module.read_text() + dying)
    assert cli(redis_url, real_store.prefix, "start", path, cwd=workdir).returncode == 0
    run_id = next(r for r in real_store.run_ids() if r.startswith(name))
    died = cli(redis_url, real_store.prefix, "worker", "-q", queue_name, "--burst", cwd=workdir)
    assert died.returncode == 8, died.stdout + died.stderr
    assert died.stdout.count("job failed after") == 2, died.stdout
    runs = Runs(real_store)
    # The horse could not say so itself: the tick (or the worker's watch, had the worker
    # lived on past the jobs' last beats) counts each job, once.
    tick(real_store, [path])
    failures = job_failures(runs.info(run_id))
    assert (failures.count, failures.streak) == (2, 2)
    assert failures.last_error.split(": ", 1)[1].startswith("work horse died: ")
    tick(real_store, [path])  # counted once: the failed jobs are forgotten
    assert job_failures(runs.info(run_id)).count == 2


def test_a_shard_job_whose_job_does_not_import_is_counted_once(
    real_store: LeaseStore, redis_url: str, queue_name: str, workdir: Path
) -> None:
    name = f"{real_store.prefix}-gone"
    path = write_module(workdir, name, queue_name, handler=True)
    module = workdir / f"{path.split(':')[0]}.py"
    good = module.read_text()
    assert cli(redis_url, real_store.prefix, "start", path, cwd=workdir).returncode == 0
    run_id = next(r for r in real_store.run_ids() if r.startswith(name))
    # A bad deploy: the module no longer imports when the shard jobs run.
    module.write_text("raise RuntimeError('half-deployed')\n")
    broken = cli(redis_url, real_store.prefix, "worker", "-q", queue_name, "--burst", cwd=workdir)
    assert broken.returncode == 8, broken.stdout + broken.stderr
    assert broken.stdout.count("job failed after") == 2, broken.stdout
    runs = Runs(real_store)
    failures = job_failures(runs.info(run_id))
    assert (failures.count, failures.streak) == (2, 2)
    assert "half-deployed" in failures.last_error
    assert real_store.client.hlen(real_store.keys.run_jobs(run_id)) == 0
    # The fix is deployed; one tick counts nothing again and dispatches anew.
    module.write_text(good)
    ticked = tick(real_store, [path])
    assert [d.kind for d in ticked] == ["dispatch"], ticked
    assert job_failures(runs.info(run_id)).count == 2
