"""A page's snippets and markers, read from its Markdown.

The convention: a fenced block whose info string is
``python`` or ``bash`` runs; ``text`` shows output; other languages show files. An HTML
comment on the line right before a fence marks it:

- ``<!-- file: NAME -->``: the block is written to NAME in the page's directory, not run;
- ``<!-- run: background -->``: the command runs in the background until the page ends;
- ``<!-- run: skip REASON -->``: the block is not run (reported with its reason);

``<!-- run: setup NAME -->`` on a page's first line names a setup that runs first, and
``<!-- expect: TEXT -->`` right after a block's closing fence is a text its output shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

RUN_LANGUAGES = ("python", "bash")
#: Info strings that look like a command or code but would not run: a page must not use them.
NOT_RUN = {
    "sh": "bash",
    "shell": "bash",
    "console": "bash (and the output in a text block)",
    "shell-session": "bash (and the output in a text block)",
    "zsh": "bash",
    "py": "python",
    "python3": "python",
    "pycon": "python (and the output in a text block)",
}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>file|run|expect):\s*(?P<value>.*?)\s*-->\s*$")


@dataclass
class Snippet:
    """One fenced block that the runner writes or runs."""

    line: int  # the fence's line number (1-based)
    language: str
    code: str
    file: str | None = None  # written to this file, not run
    background: bool = False
    skip: str | None = None  # not run, for this reason
    expect: list[str] = field(default_factory=list)


@dataclass
class Page:
    """A page's setup, its snippets in order, and the problems of its markers."""

    path: str
    setup: str | None = None
    snippets: list[Snippet] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def fleet(self) -> bool:
        """Whether a snippet runs in the background (a worker, the dashboard)."""
        return any(s.background and not s.skip for s in self.snippets)

    @property
    def skips(self) -> list[tuple[int, str]]:
        """(line, reason) of each skipped snippet."""
        return [(s.line, s.skip) for s in self.snippets if s.skip]


def parse(path: str, text: str) -> Page:
    """Reads the page at ``path`` (its text): its setup, snippets and marker problems."""
    page = Page(path)
    lines = text.splitlines()
    pending: list[tuple[int, str, str]] = []  # markers waiting for their fence
    last: Snippet | None = None  # the block just closed (for expect markers)
    index = 0
    while index < len(lines):
        number, line = index + 1, lines[index]
        marker = MARKER.match(line)
        fence = FENCE.match(line)
        if marker:
            kind, value = marker["kind"], marker["value"]
            if kind == "expect":
                if last is None:
                    page.problems.append(f"line {number}: an expect marker must follow a block")
                else:
                    last.expect.append(value)
            elif kind == "run" and value.startswith("setup"):
                if number != 1:
                    page.problems.append(f"line {number}: a setup marker goes on the first line")
                page.setup = value.removeprefix("setup").strip() or None
            else:
                pending.append((number, kind, value))
            index += 1
            continue
        last = None
        if fence:
            index, block = _read_block(lines, index, fence)
            snippet = _snippet(page, number, fence["info"].lower(), block, pending)
            pending = []
            if snippet is not None:
                page.snippets.append(snippet)
                last = snippet
            continue
        _orphans(page, pending)
        pending = []
        index += 1
    _orphans(page, pending)
    return page


def _read_block(lines: list[str], start: int, fence: re.Match[str]) -> tuple[int, str]:
    """The index after the block opened at ``start``, and its text (indent removed)."""
    indent, mark = len(fence["indent"]), fence["fence"]
    body: list[str] = []
    index = start + 1
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        if stripped.startswith(mark[0] * len(mark)) and set(stripped) == {mark[0]}:
            return index + 1, "".join(f"{b}\n" for b in body)
        body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
        index += 1
    return index, "".join(f"{b}\n" for b in body)


def _snippet(
    page: Page, number: int, language: str, code: str, markers: list[tuple[int, str, str]]
) -> Snippet | None:
    """The snippet of a block with the markers right above it (None for a shown block)."""
    snippet = Snippet(number, language, code)
    for at, kind, value in markers:
        if kind == "file":
            if not value or value.startswith("/") or ".." in Path(value).parts:
                page.problems.append(f"line {at}: a file marker names a file in the page's dir")
            snippet.file = value
        elif value == "background":
            snippet.background = True
        elif value.startswith("skip"):
            snippet.skip = value.removeprefix("skip").strip()
            if not snippet.skip:
                page.problems.append(f"line {at}: a skip marker gives its reason")
        else:
            page.problems.append(f"line {at}: unknown marker 'run: {value}'")
    if snippet.file is not None:
        if snippet.background or snippet.skip:
            page.problems.append(f"line {number}: a file block is not run: no run marker")
        return snippet
    if language in NOT_RUN:
        page.problems.append(
            f"line {number}: a ```{language} block is neither run nor output: write "
            f"```{NOT_RUN[language]}"
        )
        return None
    if language not in RUN_LANGUAGES:
        if markers:
            page.problems.append(f"line {number}: a ```{language} block is not run: no marker")
        return None
    if snippet.background and language != "bash":
        page.problems.append(f"line {number}: only a bash block runs in the background")
    return snippet


def _orphans(page: Page, markers: list[tuple[int, str, str]]) -> None:
    """Markers not right above a fence are mistakes."""
    for at, kind, value in markers:
        page.problems.append(f"line {at}: marker '{kind}: {value}' is not right above a block")


def read_page(root: Path, relative: str) -> Page:
    """The page at ``root / relative``."""
    return parse(relative, (root / relative).read_text())
