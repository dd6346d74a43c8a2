"""This release's number (``pyproject.toml``'s version; the CHANGELOG's newest heading)."""

__version__ = "0.10.0"
