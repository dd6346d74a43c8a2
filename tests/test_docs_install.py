"""The install a page gives first is one that works today.

redis-lease is not on the package index yet, so ``pip install redis-lease`` fails for a
reader. Every page of README.md and docs/ that names that form gives an install that
works first (``pip install`` of a clone's path or of a built wheel), and names the
published form only as what will work once it is published. An error line the command
line prints (``error: ... pip install 'redis-lease[dashboard]'``) is quoted, not advised.
"""

from __future__ import annotations

import re

import pytest

from tests.doc_pages import page_paths, pages

#: ``pip install`` of the package by name: the published form.
PUBLISHED = re.compile(r"pip install (?:-U |--upgrade )?['\"]?redis-lease\b")
#: ``pip install`` of a path (a clone) or of a built wheel: what works today.
WORKING = re.compile(r"pip install (?:-e )?['\"]?(?:\.{1,2}/|/|~/|\.\s|\.['\"\[]|\S+\.whl)")
#: How near before a published form the page must say it is for once it is published.
NEAR = 160


def problems(text: str) -> list[str]:
    """Where ``text`` gives the published install as one that works today."""
    found: list[str] = []
    for match in PUBLISHED.finditer(text):
        span_start = text.rfind("`", 0, match.start())  # the code span it is in, if any
        quoted = text[span_start + 1 : match.start()]
        if span_start >= 0 and quoted.startswith("error:") and "\n\n" not in quoted:
            continue  # the command line's own error line, quoted
        line = text.count("\n", 0, match.start()) + 1
        if not WORKING.search(text, 0, match.start()):
            found.append(f"line {line}: {match.group()!r} before any install that works today")
        if "published" not in text[max(0, match.start() - NEAR) : match.start()]:
            found.append(f"line {line}: {match.group()!r} not said to be for once published")
    return found


@pytest.mark.parametrize("path", page_paths())
def test_no_page_leads_with_the_unpublished_install(path: str) -> None:
    assert problems(pages()[path]) == []


def test_the_rule_catches_the_pip_form_first_and_passes_the_clone_first() -> None:
    assert problems("Install it (`pip install redis-lease`).\n") == [
        "line 1: 'pip install redis-lease' before any install that works today",
        "line 1: 'pip install redis-lease' not said to be for once published",
    ]
    fixed = (
        "From a clone: `pip install '../redis-lease[dashboard]'`. Once redis-lease is "
        "published, `pip install 'redis-lease[dashboard]'` will do.\n"
    )
    assert problems(fixed) == []
    assert problems("`git clone ... && cd redis-lease && .venv/bin/pip install -e .`; ") == []
    quoted = "e.g. `error: the dashboard needs the extra 'dashboard': pip install 'redis-lease[x]'`"
    assert problems(quoted) == []


def test_the_tutorial_and_readme_install_from_a_clone() -> None:
    texts = pages()
    assert "pip install '../redis-lease[dashboard]'" in texts["docs/tutorial.md"]
    assert WORKING.search(texts["README.md"])
