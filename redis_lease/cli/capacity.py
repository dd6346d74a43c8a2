"""The ``plan-capacity`` command: workers that hold an SLO on a burst, step by step.

:mod:`.app` registers :func:`plan_capacity`; this module does not import the app
at import time (the store comes from :func:`.options.open_store` when ``--from-run``
needs one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..limits import MAX_RETRY_RATE
from .app import app
from .options import open_store

if TYPE_CHECKING:
    from ..fleet.capacity.model import CapacityPlan
    from ..fleet.capacity.run_capacity import Measured


@app.command("plan-capacity")
def plan_capacity(
    ctx: typer.Context,
    eligible: Annotated[
        int, typer.Option("--eligible", min=1, help="Items that become eligible in the burst.")
    ],
    window: Annotated[
        str, typer.Option("--window", help="Time over which they become eligible: 5m, 90s.")
    ],
    slo: Annotated[
        str, typer.Option("--slo", help="The oldest eligible item's age must stay within: 10m.")
    ],
    per_worker: Annotated[
        str | None,
        typer.Option(
            "--per-worker", help="Items one handler slot finishes: 20/s, 1200/m (or --handler)."
        ),
    ] = None,
    handler: Annotated[
        str | None,
        typer.Option("--handler", help="One handler call's duration: 0.05s (rate = 1/duration)."),
    ] = None,
    retry_rate: Annotated[
        float | None,
        typer.Option(
            "--retry-rate",
            help=f"Share of attempts that do not finish their item: 0 to {MAX_RETRY_RATE}.",
        ),
    ] = None,
    spare_nodes: Annotated[
        int, typer.Option("--spare-nodes", min=0, help="Nodes that may disappear.")
    ] = 0,
    workers_per_node: Annotated[
        int, typer.Option("--workers-per-node", min=1, help="Workers on one node.")
    ] = 1,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", min=1, help="Handler slots per worker (default 1)."),
    ] = None,
    from_run: Annotated[
        str | None,
        typer.Option("--from-run", help="Take the rates and retry rate measured on this run."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """Workers that keep the oldest eligible item within the SLO during a burst.

    A worker runs --concurrency handler slots, each finishing --per-worker items
    (1/--handler). Prints the arithmetic: nominal demand, retry headroom, the
    burst at K workers, the spares, the answer. Explicit figures win over those
    of --from-run.
    """
    from ..fleet.capacity.capacity_ask import CapacityAsk, measured_run

    ask = CapacityAsk(
        eligible,
        window,
        slo,
        per_worker=per_worker,
        handler=handler,
        retry_rate=retry_rate,
        spare_nodes=spare_nodes,
        workers_per_node=workers_per_node,
        concurrency=concurrency,
    )
    measure = measured_run(open_store(ctx), from_run) if from_run is not None else None
    result = ask.plan(measure)
    _print(result, measure, from_run, as_json)


def _print(result: CapacityPlan, measure: Measured | None, run: str | None, as_json: bool) -> None:
    from ..operate.cli_printing import print_json, print_table

    if as_json:
        data: dict[str, Any] = result.to_dict()
        if measure is not None:
            data["measured"] = {"run": run, **measure.to_dict()}
        print_json(data)
        return
    rows = list(result.steps)
    if measure is not None:
        rows.insert(
            0,
            (
                f"measured on {run}",
                f"{measure.handled:,} items in {measure.busy_seconds:.1f} worker-seconds = "
                f"{measure.per_worker:.2f}/s per worker; handler {measure.handler_duration:.3f}s; "
                f"retry rate {measure.retry_rate:.4f}",
            ),
        )
    print_table(("step", "arithmetic"), rows)
    typer.echo(
        f"workers: {result.workers} ({result.workers_for_slo} hold the SLO, nominal "
        f"{result.nominal_workers}); load-test the burst: watch "
        "redis_lease_oldest_eligible_age_seconds, not only throughput"
    )
