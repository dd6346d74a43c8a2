"""The protocol the data under a prefix is in: stamped in Redis, checked at start.

While a fleet is upgraded one worker at a time, workers of two releases (and the Node.js
client) share runs. They can as long as they speak the same protocol: the scripts of
``lua/``, the key layout of :mod:`redis_lease.protocol.keys` and the records and entries kept
under those keys. The protocol has a number of its own, apart from the package's
version: it changes only when a release changes what it keeps in Redis in a way an
earlier release would misread (docs/upgrading.md).

The number is stamped under the prefix (``<prefix>:protocol``, a decimal string) by the
first worker that starts (``redis-lease worker``, the Node.js client's first call, or a
program calling :func:`check_protocol`), and read at start by every worker and every
command: one that does not speak it is refused with
:class:`~redis_lease.errors.ProtocolMismatch` (exit 9) before it writes anything.
"""

from __future__ import annotations

from ...errors import ProtocolMismatch
from ...version import __version__
from .store_client import StoreBase

#: The protocol this release stamps on data that has no stamp yet.
PROTOCOL = 1
#: Every protocol this release reads and writes (a release that changes the protocol
#: speaks the old number and the new one, so that a fleet can move over without stopping).
SPOKEN: frozenset[int] = frozenset({PROTOCOL})
#: The longest stamp read as a number.
_DIGITS_MAX = 9
#: Characters of an unreadable stamp shown in the error.
_SHOWN_MAX = 40


def numbers_text(numbers: frozenset[int] | tuple[int, ...]) -> str:
    """``1``, ``1 and 2``, ``1, 2 and 3``: protocol numbers for a message."""
    texts = [str(n) for n in sorted(numbers)]
    return texts[0] if len(texts) == 1 else f"{', '.join(texts[:-1])} and {texts[-1]}"


def read_stamp(store: StoreBase) -> str | None:
    """The stamp under the store's prefix as stored, None when there is none yet.

    Raises:
        RedisUnavailable: Redis cannot be reached (or the ACL refuses GET).
    """
    with store.translating_errors():
        raw = store.client.get(store.keys.protocol)
    if raw is None:
        return None
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def check_protocol(store: StoreBase, *, stamp: bool = True) -> int | None:
    """Refuses data in a protocol this release does not speak; stamps :data:`PROTOCOL`
    where there is no stamp yet (``stamp=False``: only reads).

    Call it once at start, before anything is written: ``redis-lease worker`` and every
    other command do, and so does the Node.js client before its first script.

    Returns:
        The protocol the data is in; None when there is no stamp and ``stamp`` is False.

    Raises:
        ProtocolMismatch: the stamp names a protocol this release does not speak, or is
            not a protocol number (exit 9); nothing was written.
        RedisUnavailable: Redis cannot be reached, or the ACL refuses GET or SET.
    """
    found = read_stamp(store)
    if found is None and stamp:
        with store.translating_errors():
            stamped = store.client.set(store.keys.protocol, str(PROTOCOL), nx=True)
        found = str(PROTOCOL) if stamped else read_stamp(store)  # else another stamped first
    if found is None:
        return None
    number = protocol_number(found)
    if number is None or number not in SPOKEN:
        raise mismatch(store, found, number)
    return number


def protocol_number(text: str) -> int | None:
    """The protocol number a stamp's text holds (ASCII digits), None when it holds none."""
    if text.isascii() and text.isdigit() and len(text) <= _DIGITS_MAX:
        return int(text)
    return None


def mismatch(store: StoreBase, found: str, number: int | None) -> ProtocolMismatch:
    """The one-line refusal: which protocol the data is in and which this release speaks."""
    speaks = tuple(sorted(SPOKEN))
    release = f"redis-lease {__version__} speaks protocol {numbers_text(SPOKEN)}"
    key = store.keys.protocol
    if number is None:
        shown = found if len(found) <= _SHOWN_MAX else found[:_SHOWN_MAX] + "..."
        message = (
            f"the protocol stamp {key} holds {shown!r}, not a protocol number, and {release}: "
            "find what wrote it (docs/upgrading.md); nothing was written"
        )
    else:
        message = (
            f"the data under prefix {store.prefix!r} is in protocol {number} (stamp {key}), and "
            f"{release}: run a release that speaks protocol {number} (docs/upgrading.md), or "
            "use another prefix; nothing was written"
        )
    return ProtocolMismatch(message, found=found, speaks=speaks)
