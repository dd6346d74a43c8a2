"""Redis URLs: their scheme, whether one names a cluster, and the masking of their secrets
in every message (:func:`safe_url`)."""

from __future__ import annotations

import re

from ...errors import InvalidInput
from .cluster import CLUSTER_SCHEMES

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

#: One or more hosts with optional ports, as a URL's authority (no userinfo).
_HOSTS = re.compile(
    r"(?:[\w.-]+|\[[0-9A-Fa-f:.]*\])(?::\d*)?(?:,(?:[\w.-]+|\[[0-9A-Fa-f:.]*\])(?::\d*)?)*"
)

_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;][^=&#;]*(?:pass|pwd|secret|token|auth|credential)[^=&#;]*=)[^&#;]*",
    re.IGNORECASE,
)


def scheme_of(url: str) -> str:
    match = _SCHEME.match(url) if isinstance(url, str) else None
    if match is None:
        raise InvalidInput(
            f"invalid Redis URL {safe_url(str(url))!r}: use redis://HOST:PORT/DB, rediss://..., "
            "unix://PATH or fakeredis://NAME"
        )
    return match.group(1).lower()


def safe_url(url: str) -> str:
    """The URL with its secrets masked: the userinfo password and secret query parameters.

    The userinfo runs from ``//`` to the last ``@`` before the path, or, when what
    comes before the path is not a host (a password with ``/`` or ``?`` in it), to
    the last ``@`` of all; so a password with ``#``, ``?``, ``@`` or ``/`` in it is
    masked whole; a userinfo without ``:`` (a password in
    the user's place) is masked whole too. Regex-free of urlsplit, so it never
    raises, also for URLs that ``urlsplit`` refuses (a bad port, a broken IPv6
    address) and for multi-host (sentinel, cluster) URLs.
    """
    text = str(url)
    start = text.find("//")
    if start >= 0:
        start += 2
        slash = text.find("/", start)
        authority_end = slash if slash >= 0 else len(text)
        at = text.rfind("@", start, authority_end)
        if at < 0 and not _HOSTS.fullmatch(text[start:authority_end]):
            at = text.rfind("@", start)  # not a host: a password with a '/' or '?' in it
        if at >= 0:
            userinfo = text[start:at]
            user, colon, _secret = userinfo.partition(":")
            masked = f"{user}:***" if colon else "***"
            text = f"{text[:start]}{masked}{text[at:]}"
    return _SECRET_PARAM.sub(lambda m: f"{m['name']}***", text)


def where(url: str) -> str:
    return f"Redis at {safe_url(url)}" if url else "Redis"


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES
