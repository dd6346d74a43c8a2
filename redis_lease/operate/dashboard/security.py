"""What every response of the dashboard is guarded by: the Host it was asked for, its
security headers (a Content-Security-Policy among them) and cookies that stay on HTTPS.

* Host: a dashboard on loopback answers only requests for a loopback name or its bind
  address (400 otherwise), so a web page whose name an attacker points at 127.0.0.1
  (DNS rebinding) cannot read it. Behind a proxy or beyond loopback there is no
  such check; a login is required there (or ``--insecure``).
* Headers: a Content-Security-Policy that allows scripts and styles from this origin's
  files only (no inline script or style, no ``eval``: every page, ``/rq`` too, is
  rendered on the server and its one script and stylesheet are static files), framing
  refused, no MIME sniffing, referrers kept on this origin.
* Cookies: the session cookie (flash messages, the CSRF token) is ``Secure`` when the
  request came over HTTPS, also behind a TLS proxy that says so (X-Forwarded-Proto).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection

import flask
from flask import has_request_context, request
from flask.sessions import SecureCookieSessionInterface

#: The names a dashboard on loopback answers to, besides its bind address.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: The Content-Security-Policy of every response: nothing inline, nothing evaluated.
POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)


def security_headers(response: flask.Response) -> flask.Response:
    """Adds the Content-Security-Policy and the other security headers to ``response``."""
    response.headers.setdefault("Content-Security-Policy", POLICY)
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


def host_name(host: str) -> str:
    """The name or address of a ``Host`` value, without its port: ``[::1]`` for ``[::1]:80``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.partition(":")[0]


def loopback_hosts(bind: str) -> tuple[str, ...]:
    """The Host names a dashboard bound to loopback address ``bind`` answers to."""
    return (*LOOPBACK_HOSTS, bind) if bind not in LOOPBACK_HOSTS else LOOPBACK_HOSTS


def _bracketed(name: str) -> str:
    """An IPv6 address as a Host header writes it (``[::1]``); other names as they are."""
    try:
        return f"[{name}]" if ipaddress.ip_address(name.strip("[]")).version == 6 else name
    except ValueError:
        return name.lower()


def host_check(hosts: Collection[str] | None) -> Callable[[], None]:
    """The before-request check that the request's Host is one of ``hosts`` (None: any).

    Flask's TRUSTED_HOSTS cannot name an IPv6 address (Werkzeug 3.1 cuts ``[::1]`` at
    its first ``:``), so the check is made here.
    """
    allowed = None if hosts is None else frozenset(_bracketed(h) for h in hosts)
    shown = "" if allowed is None else ", ".join(sorted(allowed))

    def check() -> None:
        if allowed is None:
            return
        given = request.environ.get("HTTP_HOST") or request.environ.get("SERVER_NAME", "")
        if host_name(given) not in allowed:
            flask.abort(
                400,
                f"Host {given[:80]!r} is not one this dashboard answers to: open it as "
                f"http://<host>:<port>/ with <host> one of {shown} "
                "(behind a proxy, start it with --behind-proxy)",
            )

    return check


class HttpsAwareSessions(SecureCookieSessionInterface):
    """The signed-cookie session, its cookie ``Secure`` on a request that came over HTTPS."""

    def get_cookie_secure(self, app: flask.Flask) -> bool:
        """SESSION_COOKIE_SECURE, or whether this request is HTTPS."""
        configured = bool(app.config["SESSION_COOKIE_SECURE"])
        return configured or (has_request_context() and request.is_secure)
