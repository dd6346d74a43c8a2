"""How messages word what they hold: a count with its noun, another's text on one line."""

from __future__ import annotations


def count_of(number: int, noun: str, nouns: str = "") -> str:
    """``number`` and ``noun``, plural unless it is one (``1 item``, ``2 items``; ``nouns``
    for an irregular plural)."""
    return f"{number} {noun if number == 1 else nouns or noun + 's'}"


def one_line(text: str, most: int = 500) -> str:
    """``text`` on one line (runs of white space made one space), cut to ``most`` characters:
    how a message of user code is shown in one of ours."""
    joined = " ".join(text.split())
    return joined if len(joined) <= most else joined[: most - 3] + "..."
