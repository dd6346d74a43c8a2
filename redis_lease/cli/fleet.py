"""Job and fleet commands: tick, start, worker, resume, cancel, schedule, demo, metrics."""

from __future__ import annotations

import os
import re
from datetime import date, datetime
from typing import Annotated

import typer

from ..connection import as_text, client_from_url
from ..errors import InvalidInput
from ..jobs import check_concurrency, load_job, parse_duration
from ..output import error_line, print_json, print_table
from ..runs import Runs
from ..tick import TickResult
from ..tick import tick as run_tick
from ..validation import check_id
from ..worker import CONCURRENCY_ENV
from .app import JsonOpt, RunArg, Settings, app, open_store

JobArg = Annotated[str, typer.Argument(help="A job's import path, package.module:attr.")]
#: Exit code of ``tick`` and ``start`` when the tick ran but some of its work failed.
TICK_FAILED_EXIT = 7


def _known_job_paths(ctx: typer.Context) -> list[str]:
    store = open_store(ctx)
    with store.errors():
        names = sorted(as_text(n) for n in store.client.smembers(store.keys.jobs))
        paths = [store.client.hget(store.keys.job(name), "path") for name in names]
    return [as_text(p) for p in paths if p]


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
    for path in jobs or []:  # named paths must import: a typo is a usage error
        load_job(path)
    paths = jobs or _known_job_paths(ctx)
    if not paths:
        raise InvalidInput(
            "no jobs known yet: name a job path, e.g. redis-lease tick app.jobs:nightly"
        )
    decisions = run_tick(open_store(ctx), paths)
    if as_json:
        print_json([{"kind": d.kind, "run": d.run_id, "reason": d.reason} for d in decisions])
    elif decisions:
        print_table(
            ("decision", "run", "reason"), [(d.kind, d.run_id, d.reason) for d in decisions]
        )
    else:
        typer.echo("nothing to do")
    _exit_if_failed(decisions)


def _exit_if_failed(result: TickResult) -> None:
    """Exits 7, after one line saying so, when some of the tick's work failed."""
    if result.failures:
        error_line(
            f"{len(result.failures)} of the tick's runs or jobs failed (decisions error and "
            "drop above; each is in its run's log: redis-lease status RUN)"
        )
        raise typer.Exit(TICK_FAILED_EXIT)


@app.command()
def start(
    ctx: typer.Context,
    job_path: JobArg,
    business_date: Annotated[
        str | None, typer.Option("--date", help="Business date YYYY-MM-DD (default: today).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create (once) and plan a job's run for a business date now, outside its schedule."""
    job = load_job(job_path)
    store = open_store(ctx)
    runs = Runs(store)
    now = runs.server_now()
    day = _parse_date(business_date) if business_date else now.astimezone(job.zone).date()
    run_id, created = runs.ensure(job, day, now)
    if created:
        runs.event(run_id, "create", "started by an operator")
    decisions = run_tick(store, [job_path])
    data = {"run": run_id, "created": created, "decisions": [str(d) for d in decisions]}
    if as_json:
        print_json(data)
    else:
        typer.echo(f"{run_id}: {'created' if created else 'exists'}")
        for decision in decisions:
            typer.echo(f"  {decision}")
    _exit_if_failed(decisions)


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
    verbose: Annotated[bool, typer.Option("--verbose", help="Log every RQ job.")] = False,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            help="Handlers each shard job runs at once (overrides the jobs' concurrency).",
        ),
    ] = None,
) -> None:
    """Start an RQ worker set up for redis-lease shard jobs (JSON serializer).

    Plain RQ works too: rq worker -u URL --serializer rq.serializers.JSONSerializer
    --job-class redis_lease.dispatch.JsonJob redis-lease
    """
    from rq.serializers import JSONSerializer

    from ..dispatch import JsonJob, LeaseWorker, SimpleLeaseWorker, queue

    settings = ctx.obj if isinstance(ctx.obj, Settings) else Settings()
    names = queues or ["redis-lease"]
    for queue_name in names:
        check_id(queue_name, "queue")
    if concurrency is not None:  # read by the shard jobs, forked or not
        os.environ[CONCURRENCY_ENV] = str(check_concurrency(concurrency))
    client = client_from_url(settings.url)
    store = open_store(ctx)
    with store.errors():
        store.client.ping()
    worker_class = SimpleLeaseWorker if simple else LeaseWorker
    rq_worker = worker_class(
        [queue(client, n) for n in names],
        connection=client,
        serializer=JSONSerializer,
        job_class=JsonJob,
        name=name,
    )
    rq_worker.work(burst=burst, logging_level="INFO" if verbose else "WARNING")


@app.command()
def resume(
    ctx: typer.Context,
    run: RunArg,
    deadline: Annotated[
        str | None,
        typer.Option("--deadline", help="New deadline: ISO 8601 time, or a duration (2h, 30m)."),
    ] = None,
) -> None:
    """Reopen a partial or failed run; the next tick dispatches its remaining items."""
    check_id(run, "run id")
    runs = Runs(open_store(ctx))
    moment = _parse_deadline(deadline, runs.server_now()) if deadline else None
    decision = runs.resume(run, moment)
    typer.echo(f"{run}: {runs.info(run)['state']} ({decision.reason})")


@app.command()
def cancel(ctx: typer.Context, run: RunArg) -> None:
    """Close an open run as canceled; its items are no longer claimable."""
    check_id(run, "run id")
    changed = Runs(open_store(ctx)).cancel(run)
    typer.echo(f"{run}: {'canceled' if changed else 'not open; nothing changed'}")


schedule_app = typer.Typer(help="Register the tick with rq-scheduler.", no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")


@schedule_app.command("install")
def schedule_install(
    ctx: typer.Context,
    job_path: JobArg,
    interval: Annotated[
        int, typer.Option("--interval", min=10, help="Seconds between ticks.")
    ] = 60,
) -> None:
    """Register the job's tick: on its cron schedule and every INTERVAL seconds.

    Run the scheduler with: rqscheduler --url URL -j redis_lease.dispatch.JsonJob
    """
    from ..schedule import install

    job = load_job(job_path)
    ids = install(open_store(ctx), job_path, job, interval)
    typer.echo(f"installed {', '.join(ids)} on queue {job.options.queue}")


@schedule_app.command("show")
def schedule_show(ctx: typer.Context, job_path: JobArg, as_json: JsonOpt = False) -> None:
    """List the job's registered tick entries."""
    from ..schedule import entries

    rows = entries(open_store(ctx), load_job(job_path))
    if as_json:
        print_json(rows)
    else:
        print_table(("id", "next", "cron", "interval"), [tuple(r.values()) for r in rows])


@schedule_app.command("remove")
def schedule_remove(ctx: typer.Context, job_path: JobArg) -> None:
    """Remove the job's tick entries."""
    from ..schedule import remove

    removed = remove(open_store(ctx), load_job(job_path))
    typer.echo(f"removed {removed} entries")


@app.command()
def demo(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    items: Annotated[int, typer.Option("--items", min=10, max=100_000)] = 2000,
    workers: Annotated[int, typer.Option("--workers", min=2, max=32)] = 4,
    backend: Annotated[
        str,
        typer.Option("--backend", help="auto, redis-server or embedded (when --url is not given)."),
    ] = "auto",
    faults: Annotated[
        bool, typer.Option("--faults/--no-faults", help="Pause and kill workers.")
    ] = True,
) -> None:
    """Run a nightly payment reconciliation end to end on real worker processes, with faults."""
    from ..demo.report import print_report, progress_bar
    from ..demo.runner import DemoConfig, run_demo

    if backend not in ("auto", "redis-server", "embedded"):
        raise InvalidInput(f"unknown backend {backend!r}: use auto, redis-server or embedded")
    root = ctx.find_root()
    source = root.get_parameter_source("url")
    given = source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")
    settings = ctx.obj if isinstance(ctx.obj, Settings) else Settings()
    config = DemoConfig(
        url=settings.url if given else None,
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
    if report["duplicate_effects"] or report["state"] != "succeeded":
        raise typer.Exit(1)


@app.command()
def metrics(
    ctx: typer.Context,
    serve: Annotated[
        int | None, typer.Option("--serve", help="Serve /metrics on this port (loopback).")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to serve on.")] = "127.0.0.1",
    max_runs: Annotated[int, typer.Option("--max-runs", min=1, help="Newest runs exported.")] = 50,
) -> None:
    """Print Prometheus metrics of runs and providers, or serve them for scraping."""
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server

    from ..metrics import LeaseCollector

    registry = CollectorRegistry()
    registry.register(LeaseCollector(open_store(ctx), max_runs))
    if serve is None:
        typer.echo(generate_latest(registry).decode(), nl=False)
        return
    start_http_server(serve, addr=host, registry=registry)
    typer.echo(f"serving metrics on http://{host}:{serve}/metrics", err=True)
    import threading

    threading.Event().wait()


def _parse_date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"invalid date {text!r}: use YYYY-MM-DD") from None


def _parse_deadline(text: str, now: datetime) -> datetime:
    if re.fullmatch(r"\d+(\.\d+)?[smhd]", text):
        try:
            return now + parse_duration(text)
        except OverflowError:
            raise InvalidInput(f"deadline {text!r} is too far ahead") from None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"invalid deadline {text!r}: use ISO 8601 or a duration like 2h"
        ) from None
    if moment.tzinfo is None:
        raise InvalidInput(f"deadline {text!r} needs a timezone, e.g. {text}+00:00")
    if moment <= now:
        raise InvalidInput(f"deadline {text!r} is in the past")
    return moment
