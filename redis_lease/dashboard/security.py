"""What every response of the dashboard is guarded by: the Host it was asked for, its
security headers (a Content-Security-Policy among them) and cookies that stay on HTTPS.

* Host: a dashboard on loopback answers only requests for a loopback name or its bind
  address (400 otherwise), so a web page whose name an attacker points at 127.0.0.1
  (DNS rebinding) cannot read it. Behind a proxy or beyond loopback there is no
  such check; a login is required there (or ``--insecure``).
* Headers: a Content-Security-Policy (scripts and styles of this origin, the
  dashboard's own inline ones by a per-response nonce; rq-dashboard's pages under
  ``/rq`` also need inline scripts and styles and ``eval``, for their templates),
  framing refused, no MIME sniffing, referrers kept on this origin.
* Cookies: the session cookie (flash messages, the CSRF token) is ``Secure`` when the
  request came over HTTPS, also behind a TLS proxy that says so (X-Forwarded-Proto).
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Callable, Collection

import flask
from flask import g, has_request_context, request
from flask.sessions import SecureCookieSessionInterface

#: The names a dashboard on loopback answers to, besides its bind address.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: The blueprint whose pages need inline scripts, inline styles and eval (rq-dashboard).
RQ_BLUEPRINT = "rq_dashboard"
_COMMON = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; " + (
    "base-uri 'none'; form-action 'self'; object-src 'none'"
)
#: rq-dashboard's templates run inline scripts, set inline styles and compile their row
#: templates with underscore's ``_.template`` (``new Function``); all of it from /rq.
RQ_POLICY = f"{_COMMON}; script-src 'self' 'unsafe-inline' 'unsafe-eval'; " + (
    "style-src 'self' 'unsafe-inline'"
)


def csp_nonce() -> str:
    """This response's nonce for the dashboard's own inline ``<script>`` and ``<style>``."""
    if "csp_nonce" not in g:
        g.csp_nonce = secrets.token_urlsafe(18)
    nonce: str = g.csp_nonce
    return nonce


def page_policy(nonce: str) -> str:
    """The Content-Security-Policy of the dashboard's own pages."""
    return f"{_COMMON}; script-src 'self' 'nonce-{nonce}'; style-src 'self' 'nonce-{nonce}'"


def security_headers(response: flask.Response) -> flask.Response:
    """Adds the Content-Security-Policy and the other security headers to ``response``."""
    policy = RQ_POLICY if request.blueprint == RQ_BLUEPRINT else page_policy(csp_nonce())
    response.headers.setdefault("Content-Security-Policy", policy)
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
