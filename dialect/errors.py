"""User-facing errors: one line saying what, where, and what to do."""

from __future__ import annotations


class TasoError(Exception):
    """An error meant for people. ``str(e)`` is a single line; tools print it and exit non-zero."""

    def __init__(self, message: str):
        # Keep it to one line whatever the underlying library said.
        first = " ".join(str(message).split("\n")[0].split())
        super().__init__(first)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """A library exception's message squeezed into one line."""
    text = " ".join(str(exc).split())
    if not text:
        text = type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
