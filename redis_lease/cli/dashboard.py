"""``redis-lease dashboard``: the web dashboard, served with waitress."""

from __future__ import annotations

from typing import Annotated

import typer

from .app import app
from .options import open_store

USER_ENV = "REDIS_LEASE_DASHBOARD_USER"
PASSWORD_ENV = "REDIS_LEASE_DASHBOARD_PASSWORD"
SECRET_ENV = "REDIS_LEASE_DASHBOARD_SECRET"


@app.command()
def dashboard(
    ctx: typer.Context,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free one).")
    ] = 8050,
    bind: Annotated[str, typer.Option("--bind", help="Address to listen on.")] = "127.0.0.1",
    read_only: Annotated[
        bool, typer.Option("--read-only", help="No requeue or resume: every POST is refused.")
    ] = False,
    user: Annotated[
        str | None, typer.Option("--user", envvar=USER_ENV, help="Basic auth user.")
    ] = None,
    password: Annotated[
        str | None,
        typer.Option("--password", envvar=PASSWORD_ENV, help="Basic auth password."),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Serve beyond loopback or behind a proxy without a login (not advised).",
        ),
    ] = False,
    behind_proxy: Annotated[
        bool,
        typer.Option(
            "--behind-proxy",
            help="Trust one reverse proxy's X-Forwarded-For/-Proto/-Host/-Prefix headers "
            "(needs --user/--password, or --insecure).",
        ),
    ] = False,
    secret_key: Annotated[
        str | None,
        typer.Option(
            "--secret-key",
            envvar=SECRET_ENV,
            help="Signs sessions and form tokens (default: random, per process).",
        ),
    ] = None,
) -> None:
    """Serve the web dashboard: runs, their items, requeue and resume; RQ's under /rq."""
    from ..errors import InvalidInput

    # Flask and waitress load only for this command, not for every other one.
    from ..operate.dashboard import create_app, serve
    from ..operate.dashboard.server import allowed_hosts, check_exposure

    if (user is None) != (password is None) or user == "" or password == "":
        raise InvalidInput(
            "basic auth needs both --user and --password (or "
            f"{USER_ENV} and {PASSWORD_ENV}), neither empty"
        )
    auth = (user, password) if user is not None and password is not None else None
    check_exposure(bind, auth=auth is not None, insecure=insecure, behind_proxy=behind_proxy)
    store = open_store(ctx, needs_rq=True)
    flask_app = create_app(
        store,
        read_only=read_only,
        auth=auth,
        secret_key=secret_key,
        hosts=allowed_hosts(bind, behind_proxy=behind_proxy),
    )
    serve(flask_app, bind, port, behind_proxy=behind_proxy)
