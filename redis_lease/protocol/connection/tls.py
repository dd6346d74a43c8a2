"""TLS for ``rediss://`` URLs: the CLI's TLS files as URL parameters, the checks of a URL's
TLS parameters, verified defaults, and a connection whose handshake is bounded.

Every ``rediss://`` client verifies the server's certificate and its hostname
(:data:`VERIFIED`), whatever the redis-py version's defaults. A URL parameter that
turns verification off is refused unless insecure TLS is allowed explicitly
(``--tls-insecure`` or ``REDIS_LEASE_TLS_INSECURE=1``); then it warns once per process.
"""

from __future__ import annotations

import os
import re
import socket
import warnings
from typing import Any
from urllib.parse import parse_qsl, quote

import redis

from ...errors import InvalidInput, TLSFailed
from ...limits import INSECURE_ENV as INSECURE_ENV  # read where Redis is not imported
from .urls import safe_url

#: The URL parameters naming TLS files (redis-py's), and the CLI option that sets each.
TLS_FILE_PARAMS = {
    "ssl_ca_certs": "--tls-ca",
    "ssl_certfile": "--tls-cert",
    "ssl_keyfile": "--tls-key",
}
#: The options every rediss:// client gets unless its URL says otherwise.
VERIFIED: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
#: Every TLS URL parameter redis-py reads; on a redis:// URL each is a mistake.
_TLS_PARAM = re.compile(r"ssl_\w+")
#: How redis-py reads a false ``ssl_check_hostname`` (its ``to_bool``).
_FALSE = ("0", "F", "FALSE", "N", "NO")
_warned_insecure = False


class InsecureTLSWarning(UserWarning):
    """A URL parameter turned TLS verification off, and ``--tls-insecure`` allowed it."""


class TLSConnection(redis.SSLConnection):
    """An SSL connection whose TLS handshake is bounded by the connect timeout.

    redis-py runs the handshake under the socket (read) timeout; against a
    server that does not speak TLS it would wait that long. A failed handshake
    raises :class:`~...errors.TLSFailed`, which is not retried.
    """

    def _wrap_socket_with_ssl(self, sock: socket.socket) -> Any:
        sock.settimeout(self.socket_connect_timeout)
        try:
            wrapped = super()._wrap_socket_with_ssl(sock)  # type: ignore[no-untyped-call]
        except OSError as error:  # ssl.SSLError and socket timeouts are OSErrors
            where = f"{self.host}:{self.port}"
            raise TLSFailed(tls_message(where, self._detail(error))) from error
        wrapped.settimeout(self.socket_timeout)
        return wrapped

    def _detail(self, error: OSError) -> str:
        if isinstance(error, TimeoutError):
            return f"no TLS answer within {self.socket_connect_timeout}s"
        reason = getattr(error, "reason", None) or str(error)
        verify = getattr(error, "verify_message", None)  # e.g. "IP address mismatch, ..."
        return f"{reason}: {verify}" if verify else str(reason)


def tls_message(where: str, detail: str) -> str:
    """The one line of a failed TLS handshake with ``where``."""
    return (
        f"TLS handshake with {where} failed ({detail}): is the server TLS-enabled? "
        "check the CA, certificate and key (and that the URL's host is in the certificate)"
    )


def insecure_allowed() -> bool:
    """Whether URL parameters may turn verification off (``REDIS_LEASE_TLS_INSECURE=1``)."""
    return os.environ.get(INSECURE_ENV, "").strip().lower() in ("1", "true", "yes")


def allow_insecure() -> None:
    """Allows insecure TLS parameters here and in the processes started from here."""
    os.environ[INSECURE_ENV] = "1"


def with_tls(url: str, ca: str | None, cert: str | None, key: str | None) -> str:
    """``url`` with the TLS files of ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` as its
    ``ssl_ca_certs``, ``ssl_certfile`` and ``ssl_keyfile`` parameters (replacing the URL's own).

    Every client made from the URL then uses them: the CLI's, a worker's and its RQ
    connection's, the tick's and the dashboard's.

    Raises:
        InvalidInput: a file is given for a URL that is not ``rediss://``, a key without a
            certificate, a file that cannot be read, or a parameter turning verification off.
    """
    given = {"ssl_ca_certs": ca, "ssl_certfile": cert, "ssl_keyfile": key}
    files = {name: path for name, path in given.items() if path}
    if not files:
        return url
    options = " ".join(TLS_FILE_PARAMS[name] for name in files)
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in ("rediss", "rediss+cluster"):
        raise InvalidInput(
            f"{options} {'applies' if len(files) == 1 else 'apply'} to TLS only, and "
            f"{_safe(url)!r} is not a rediss:// URL: use rediss://HOST:PORT/DB"
        )
    base, _, fragment = url.partition("#")
    path, _, query = base.partition("?")
    kept = [(n, v) for n, v in parse_qsl(query, keep_blank_values=True) if n not in files]
    pairs = [*kept, *files.items()]
    url = path + "?" + "&".join(f"{quote(n, safe='')}={quote(v, safe='')}" for n, v in pairs)
    url += f"#{fragment}" if fragment else ""
    check_tls_params(url, "rediss")
    return url


def check_tls_params(url: str, scheme: str) -> None:
    """Refuses TLS parameters on a URL without TLS, a key without a certificate, TLS files
    that cannot be read, and parameters turning verification off (unless allowed).

    Raises:
        InvalidInput: one line naming the parameter and the fix.
    """
    query = url.partition("#")[0].partition("?")[2]
    params = parse_qsl(query, keep_blank_values=True)
    if scheme != "rediss":
        names = [name for name, _ in params if _TLS_PARAM.fullmatch(name)]
        if names:
            raise InvalidInput(
                f"{', '.join(names)} in {_safe(url)!r} "
                f"{'applies' if len(names) == 1 else 'apply'} to TLS only: use rediss://, "
                "or drop them"
            )
        return
    given = {name for name, _ in params}
    if "ssl_keyfile" in given and "ssl_certfile" not in given:
        raise InvalidInput(
            "ssl_keyfile needs ssl_certfile (--tls-key needs --tls-cert): give the client "
            "certificate too"
        )
    for name, value in params:
        if name in TLS_FILE_PARAMS:
            try:
                with open(value, "rb"):
                    pass
            except OSError as error:
                raise InvalidInput(
                    f"TLS file {value!r} ({name}, {TLS_FILE_PARAMS[name]}) cannot be read: "
                    f"{error.strerror or error}"
                ) from None
    _check_verification(params)


def _check_verification(params: list[tuple[str, str]]) -> None:
    for name, value in params:
        if name == "ssl_cert_reqs" and value not in ("none", "optional", "required"):
            raise InvalidInput(
                f"ssl_cert_reqs={value} is not a TLS requirement: use ssl_cert_reqs=required "
                "(the default)"
            )
    weakened = [
        f"{name}={value}"
        for name, value in params
        if (name == "ssl_cert_reqs" and value != "required")
        or (name == "ssl_check_hostname" and value.strip().upper() in _FALSE)
    ]
    if not weakened:
        return
    what = ", ".join(weakened)
    if not insecure_allowed():
        raise InvalidInput(
            f"{what} turns off TLS verification (anyone on the path could pose as the server): "
            f"drop it, or give --tls-insecure ({INSECURE_ENV}=1) to accept the risk"
        )
    global _warned_insecure
    if not _warned_insecure:
        _warned_insecure = True
        warnings.warn(
            f"TLS verification is off ({what}, allowed by --tls-insecure): the server is "
            "not authenticated",
            InsecureTLSWarning,
            stacklevel=3,
        )


def _safe(url: str) -> str:
    return safe_url(url)
