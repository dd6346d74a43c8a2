"""Serving the dashboard: waitress, behind a reverse proxy or not, and who may listen where."""

from __future__ import annotations

import ipaddress
import sys
from typing import Any

import flask
from waitress.server import create_server
from werkzeug.middleware.proxy_fix import ProxyFix

from ...errors import InvalidInput
from .security import loopback_hosts

#: Threads answering requests (each page is a few Redis round trips).
THREADS = 8


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable only from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any address


def check_exposure(host: str, *, auth: bool, insecure: bool, behind_proxy: bool = False) -> None:
    """Refuses to serve beyond loopback, or behind a proxy, without auth, unless
    ``insecure`` says so.

    Behind a proxy the dashboard answers whoever the proxy lets through, for any Host
    name (no DNS-rebinding check), so it needs a login even on loopback.

    Raises:
        InvalidInput: a non-loopback ``host``, or ``behind_proxy``, with neither auth
            nor ``insecure``.
    """
    if auth or insecure:
        return
    if behind_proxy:
        raise InvalidInput(
            "--behind-proxy serves whoever the proxy lets through and no login is set: "
            "pass --user and --password (or REDIS_LEASE_DASHBOARD_USER/_PASSWORD), "
            "or --insecure to serve it open"
        )
    if not is_loopback(host):
        raise InvalidInput(
            f"--bind {host} is reachable from other machines and no login is set: "
            "pass --user and --password (or REDIS_LEASE_DASHBOARD_USER/_PASSWORD), "
            "or --insecure to serve it open"
        )


def allowed_hosts(host: str, *, behind_proxy: bool) -> tuple[str, ...] | None:
    """The Host names the dashboard answers to: on loopback, the loopback names and
    ``host``; None (any) behind a proxy or beyond loopback, where a login is required."""
    if behind_proxy or not is_loopback(host):
        return None
    return loopback_hosts(host)


def wsgi_app(app: flask.Flask, *, behind_proxy: bool = False) -> Any:
    """The WSGI callable to serve; behind a proxy it trusts one hop's X-Forwarded-* headers
    (For, Proto, Host and Prefix, so links keep the path the proxy mounts it under)."""
    if behind_proxy:
        return ProxyFix(app.wsgi_app, x_for=1, x_proto=1, x_host=1, x_prefix=1)
    return app.wsgi_app


def serve(app: flask.Flask, host: str, port: int, *, behind_proxy: bool = False) -> None:
    """Serves ``app`` with waitress until interrupted; says where on stderr once it listens.

    Port 0 picks a free port (the line names it).

    Raises:
        InvalidInput: the address cannot be listened on (in use, not this machine's).
    """
    try:
        server = create_server(
            wsgi_app(app, behind_proxy=behind_proxy),
            host=host,
            port=port,
            threads=THREADS,
            ident="redis-lease",
            clear_untrusted_proxy_headers=not behind_proxy,
        )
    except OSError as error:
        raise InvalidInput(
            f"cannot listen on {host}:{port}: {error.strerror or error}; "
            "pick another --port or --bind"
        ) from None
    shown = f"[{host}]" if ":" in host else host
    port_now = getattr(server, "effective_port", port)
    print(f"serving the dashboard on http://{shown}:{port_now}/", file=sys.stderr, flush=True)
    server.run()
