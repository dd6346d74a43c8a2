"""Job and fleet commands: tick, start, worker, resume, cancel, finalize, demo, metrics.

The schedule commands (``schedule ...``, ``backfill``) are in :mod:`.schedules`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ..fleet.runs.run_states import RESUMABLE_STATES, SUCCEEDED, in_words
from ..limits import METRICS_RUNS, TICK_EVERY
from .app import app
from .options import (
    JOBS_FAILED_EXIT,
    JsonOpt,
    RunArg,
    Settings,
    exit_if_failed,
    open_store,
    parse_date,
    planning_progress,
)

JobArg = Annotated[str, typer.Argument(help="A job's import path, package.module:attr.")]


@app.command()
def tick(
    ctx: typer.Context,
    jobs: Annotated[
        list[str] | None, typer.Argument(help="Job import paths (default: every known job).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create due runs, plan them, dispatch shard work, add burst capacity, finalize.

    A failure in one run or job is printed and the others are still ticked; the
    exit code is then 7.
    """
    from ..errors import InvalidInput
    from ..fleet.jobs.job import load_job
    from ..fleet.tick.schedule import job_paths
    from ..fleet.tick.scheduler_tick import tick as run_tick
    from ..operate.cli_printing import print_json, print_table, same_times

    for path in jobs or []:  # named paths must import: a typo is a usage error
        load_job(path)
    paths = jobs or job_paths(open_store(ctx))
    if not paths:
        raise InvalidInput(
            "no jobs known yet: name a job path, e.g. redis-lease tick app.jobs:nightly"
        )
    with planning_progress() as progress:
        decisions = run_tick(open_store(ctx, needs_rq=True), paths, progress=progress)
    if as_json:
        print_json([{"kind": d.kind, "run": d.run_id, "reason": d.reason} for d in decisions])
    elif decisions:
        print_table(
            ("decision", "run", "reason"),
            [(d.kind, d.run_id, same_times(d.reason)) for d in decisions],
        )
    else:
        typer.echo("nothing to do")
    exit_if_failed(decisions)


@app.command()
def start(
    ctx: typer.Context,
    job_path: JobArg,
    business_date: Annotated[
        str | None, typer.Option("--date", help="Business date YYYY-MM-DD (default: today).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create (once) and plan a job's run for a business date now, outside its schedule.

    A date whose deadline has passed (a past date) gets its full window from now, as
    with backfill. Exit 7 as for tick, and when the run it made failed at once.
    """
    from ..fleet.jobs.job import load_job
    from ..fleet.runs.lifecycle import Runs
    from ..fleet.tick.backfill import deadline_starting_now
    from ..fleet.tick.scheduler_tick import tick as run_tick
    from ..operate.cli_printing import print_json

    job = load_job(job_path)
    store = open_store(ctx, needs_rq=True)
    runs = Runs(store)
    now = runs.server_now()
    day = parse_date(business_date, "--date") if business_date else now.astimezone(job.zone).date()
    deadline, moved = deadline_starting_now(job, day, now)
    run_id, created = runs.ensure(job, day, now, deadline)
    if created:
        reason = "started by an operator"
        if moved:
            reason += "; the date's deadline had passed: its full window from now, as backfill"
        runs.record_decision(run_id, "create", reason)
    with planning_progress() as progress:
        decisions = run_tick(store, [job_path], progress=progress)
    data = {"run": run_id, "created": created, "decisions": [str(d) for d in decisions]}
    if as_json:
        print_json(data)
    else:
        typer.echo(f"{run_id}: {'created' if created else 'exists'}")
        for decision in decisions:
            typer.echo(f"  {decision}")
    exit_if_failed(decisions, made=[run_id] if created else [])


@app.command()
def worker(
    ctx: typer.Context,
    queues: Annotated[
        list[str] | None, typer.Option("--queue", "-q", help="Queues to work (repeatable).")
    ] = None,
    burst: Annotated[bool, typer.Option("--burst", help="Quit when the queues are empty.")] = False,
    simple: Annotated[
        bool, typer.Option("--simple", help="Run jobs in this process (no fork per job).")
    ] = False,
    name: Annotated[str | None, typer.Option("--name", help="The RQ worker's name.")] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="Log every RQ job, and failed jobs' tracebacks.")
    ] = False,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            help="Handlers each shard job runs at once (overrides the jobs' concurrency).",
        ),
    ] = None,
    jobs: Annotated[
        list[str] | None,
        typer.Option(
            "--job",
            help="Also tick this job (package.module:attr, repeatable) while this worker is "
            "the fleet's tick leader.",
        ),
    ] = None,
    tick_every: Annotated[
        float,
        typer.Option("--tick-every", min=1.0, help="Seconds between two ticks of the leader."),
    ] = TICK_EVERY,
    wait_replicas: Annotated[
        int | None,
        typer.Option(
            "--wait-replicas",
            help="Hand out a claim, and record an effect's intent, only once this many "
            "replicas have it (WAIT); 0 does not wait. Overrides the URL's wait_replicas.",
        ),
    ] = None,
    wait_timeout_ms: Annotated[
        int | None,
        typer.Option(
            "--wait-timeout-ms",
            help="How long a claim waits for those replicas, in ms (default 1000); then "
            "it is given back. Overrides the URL's wait_timeout_ms.",
        ),
    ] = None,
) -> None:
    """Start an RQ worker set up for redis-lease shard jobs (JSON serializer).

    With --job (repeatable) it also runs the scheduler's tick for those jobs, every
    --tick-every seconds (60), while it holds the fleet's tick leader lease: one
    worker process of the fleet ticks; another takes over within 12 s of its death or
    pause. It declares its jobs too: the leader also ticks the jobs other workers were
    given that it finds in its own code, and names the others (both logs, workers).
    Each job must import and be well formed, or the worker does not start (exit 2).

    Prints one line once started (a command the Redis user may not run is one error
    line and exit 6 instead), one per shard job (its run, shard, items committed and
    failed, leases lost, seconds), one per shard job it takes over from a worker that
    stopped sending heartbeats, and one on SIGTERM. A job it cannot run (unreadable, e.g. pickled,
    or its function does not import) fails alone with one line and the worker goes on.
    With --burst it exits 8 when shard jobs it ran failed or jobs it took could not run.
    Jobs import from the working directory, as with rq worker.
    With --wait-replicas N (or wait_replicas=N in the URL) its claims and effect intents
    wait until N replicas have them, so a failover cannot hand their tokens out again
    (docs/durability.md).
    Plain RQ works too: rq worker -u URL --serializer rq.serializers.JSONSerializer
    --job-class redis_lease.dispatch.JsonJob redis-lease
    """
    from ..fleet.tick.leader import check_jobs
    from ..fleet.worker.rq_worker import (
        DEFAULT_QUEUE,
        LeaseWorker,
        SimpleLeaseWorker,
        WorkerSettings,
    )
    from ..operate.cli_printing import error_line
    from ..protocol.connection.replica_wait import replica_wait
    from ..protocol.connection.urls import safe_url
    from ..runner import serve

    check_jobs(jobs or [])  # before anything starts: a bad path is one line, exit 2
    settings = ctx.obj if isinstance(ctx.obj, Settings) else Settings()
    waits = replica_wait(settings.url, wait_replicas, wait_timeout_ms)  # bad values: exit 2
    wanted = WorkerSettings(
        queues=tuple(queues or [DEFAULT_QUEUE]),
        simple=simple,
        name=name,
        tracebacks=verbose,
        concurrency=concurrency,
        lease_url=settings.url if settings.queue_url else None,
        say=typer.echo,
    )
    store = open_store(ctx, needs_rq=True)
    store.replica_wait = waits
    handlers = f"concurrency {concurrency}" if concurrency is not None else "the jobs' concurrency"

    def started(rq_worker: LeaseWorker | SimpleLeaseWorker) -> None:
        """Prints the start line, once RQ registered the worker and its first heartbeat went out."""
        typer.echo(
            f"worker {rq_worker.name}: queues {', '.join(wanted.queues)}, {handlers}, "
            f"{'in-process' if simple else 'forking'}{', burst' if burst else ''}, "
            f"Redis {safe_url(settings.url)}"
            + (f", queues on {safe_url(settings.queue_url)}" if settings.queue_url else "")
            + (
                f"; claims wait for {waits.replicas} replica(s), {waits.timeout_ms} ms at most"
                if waits
                else ""
            )
            + (f"; ticks {', '.join(jobs)} while the tick leader" if jobs else "")
        )

    # a refusal: one line, exit 6
    rq_worker = serve(
        store, wanted, jobs or [], burst=burst, tick_every=tick_every, started=started
    )
    done, failed, bad = rq_worker.shard_jobs, rq_worker.failed_shard_jobs, rq_worker.bad_jobs
    lost = rq_worker.lost_leases
    typer.echo(
        f"worker {rq_worker.name}: stopped after {done} shard jobs, {failed} failed, "
        f"{lost} leases lost to other workers"
        + (f"; {bad} bad job{'s' if bad != 1 else ''} failed without running" if bad else "")
    )
    if burst and failed:
        error_line(
            f"{failed} of the {done} shard jobs this worker ran failed (last: "
            f"{rq_worker.last_failure}); each is counted on its run: redis-lease status RUN"
        )
    if burst and bad:
        error_line(
            f"{bad} job{'s' if bad != 1 else ''} this worker took could not run and failed "
            "(lines above): see RQ's failed registry and redis_lease_bad_jobs_total"
        )
    if burst and (failed or bad):
        raise typer.Exit(JOBS_FAILED_EXIT)


@app.command(
    help=f"Reopen a {in_words(RESUMABLE_STATES)} run; the next tick dispatches its remaining items."
)
def resume(
    ctx: typer.Context,
    run: RunArg,
    deadline: Annotated[
        str | None,
        typer.Option("--deadline", help="New deadline: ISO 8601 time, or a duration (2h, 30m)."),
    ] = None,
) -> None:
    from ..fleet.runs.lifecycle import Runs
    from ..fleet.runs.run_control import new_deadline
    from ..operate.cli_printing import same_times
    from ..protocol.validation import check_id

    check_id(run, "run id")
    runs = Runs(open_store(ctx))
    moment = new_deadline(deadline, runs.server_now()) if deadline else None
    decision = runs.resume(run, moment)
    typer.echo(f"{run}: {runs.info(run)['state']} ({same_times(decision.reason)})")


@app.command()
def finalize(ctx: typer.Context, run: RunArg, as_json: JsonOpt = False) -> None:
    """Close an open run now as succeeded, partial or failed, from its accounting.

    For runs no tick finalizes: those made through LeaseStore or `add`, with no
    job. Its items are no longer claimable; a run already final is left alone.
    """
    from ..fleet.runs.lifecycle import Runs
    from ..fleet.runs.run_control import finalize_if_open
    from ..operate.cli_printing import print_json, same_times
    from ..protocol.validation import check_id

    check_id(run, "run id")
    state, decision = finalize_if_open(Runs(open_store(ctx)), run, "finalized by an operator")
    if as_json:
        print_json({"run": run, "state": state, "changed": decision is not None})
    elif decision is not None:
        typer.echo(f"{run}: {same_times(decision.reason)}")
    else:
        typer.echo(f"{run}: {state}; not open, nothing changed")


@app.command()
def cancel(ctx: typer.Context, run: RunArg) -> None:
    """Close an open run as canceled; its items are no longer claimable."""
    from ..fleet.runs.lifecycle import Runs
    from ..protocol.validation import check_id

    check_id(run, "run id")
    changed = Runs(open_store(ctx)).cancel(run)
    typer.echo(f"{run}: {'canceled' if changed else 'not open; nothing changed'}")


@app.command()
def demo(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    items: Annotated[int, typer.Option("--items", min=10, max=100_000)] = 2000,
    workers: Annotated[int, typer.Option("--workers", min=2, max=32)] = 4,
    backend: Annotated[
        str,
        typer.Option(
            "--backend",
            help="auto (--url or REDIS_URL when given, else a private redis-server when "
            "installed, else embedded), redis-server (a private one) or embedded (fakeredis). "
            "An explicit choice wins over REDIS_URL.",
        ),
    ] = "auto",
    faults: Annotated[
        bool, typer.Option("--faults/--no-faults", help="Pause and kill workers.")
    ] = True,
) -> None:
    """Run a nightly payment reconciliation end to end on real worker processes, with faults."""
    from ..extras import require

    require("demo", "the demo")  # its embedded backend: one line naming the extra
    from ..demo.report import print_report, progress_bar
    from ..demo.runner import DemoConfig, run_demo
    from ..errors import InvalidInput
    from ..operate.cli_printing import print_json

    if backend not in ("auto", "redis-server", "embedded"):
        raise InvalidInput(f"unknown backend {backend!r}: use auto, redis-server or embedded")
    root = ctx.find_root()
    source = root.get_parameter_source("url")
    on_line = source is not None and source.name == "COMMANDLINE"
    from_env = source is not None and source.name == "ENVIRONMENT"
    if backend != "auto" and on_line:
        raise InvalidInput(
            f"--url and --backend {backend} name two Redis servers: give one of them"
        )
    # An explicit choice wins over the environment: a REDIS_URL set for an application
    # does not send the demo's writes there when --backend says where they go.
    given = on_line or (from_env and backend == "auto")
    if from_env and not given:
        typer.echo(
            f"note: --backend {backend} given: the Redis URL of the environment is not used",
            err=True,
        )
    settings = ctx.obj if isinstance(ctx.obj, Settings) else Settings()
    config = DemoConfig(
        url=settings.url if given else None,
        queue_url=settings.queue_url if given else None,
        backend=backend,
        items=items,
        workers=workers,
        faults=faults,
    )
    if as_json:
        report = run_demo(config, on_backend=lambda text: typer.echo(f"backend: {text}", err=True))
        print_json(report)
    else:
        with progress_bar() as (on_backend, on_progress):
            report = run_demo(config, on_progress=on_progress, on_backend=on_backend)
        print_report(report)
    # The demo's promise: every item done, no effect applied twice.
    if report["duplicate_effects"] or report["state"] != SUCCEEDED:
        raise typer.Exit(1)


@app.command()
def metrics(
    ctx: typer.Context,
    serve: Annotated[
        int | None,
        typer.Option("--serve", help="Serve /metrics on this port (1-65535)."),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to serve on.")] = "127.0.0.1",
    max_runs: Annotated[
        int,
        typer.Option(
            "--max-runs", min=1, help="Newest final runs exported (open runs always are)."
        ),
    ] = METRICS_RUNS,
) -> None:
    """Print Prometheus metrics of runs, jobs and providers, or serve them for scraping.

    Served, one collector lives as long as the server: the processing-duration and
    queue-age histograms it builds from the attempt logs accumulate across scrapes.
    """
    from ..errors import InvalidInput
    from ..extras import require

    require("metrics", "redis-lease metrics")
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server

    from ..operate.metrics.collector import LeaseCollector

    if serve is not None and not 1 <= serve <= 65535:
        raise InvalidInput(f"--serve {serve} is not a port: use a number from 1 to 65535")
    registry = CollectorRegistry()
    registry.register(LeaseCollector(open_store(ctx), max_runs))
    if serve is None:
        typer.echo(generate_latest(registry).decode(), nl=False)
        return
    try:
        start_http_server(serve, addr=host, registry=registry)
    except OSError as error:  # in use, not allowed, or a host that is not here
        raise InvalidInput(
            f"cannot serve metrics on {host}:{serve}: {error.strerror or error}"
        ) from None
    typer.echo(f"serving metrics on http://{host}:{serve}/metrics", err=True)
    import threading

    threading.Event().wait()
