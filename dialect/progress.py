"""Progress for people: what a long run is doing, on stderr. Silent unless a tool turns it on.

The code that works calls ``phase(name)`` when a step begins (import, a pass pipeline, export, the numeric
check, writing) and ``update(text)`` as it goes within one (the pass that runs, the search's window).
Both do nothing until ``enable`` is called, so library users and tests see nothing; ``taso-opt`` enables
it (``--progress``, or by default where stderr is a terminal) and calls ``disable`` when it is done.

Where the stream is a terminal, progress is one line rewritten in place (``\\r``), cut to the terminal's
width and erased before anything else is written to ``sys.stderr`` (``enable`` puts a wrapper there that
does so) and when progress ends. Elsewhere (a log file, a pipe) it is plain lines: one per phase, and
updates at most one a second, never ``\\r``.

Imports nothing of taso-mlir: every package may use it.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from typing import Optional, TextIO

#: seconds between two plain (not terminal) update lines, and between two redraws of the terminal line
PLAIN_INTERVAL = 1.0
TTY_INTERVAL = 0.1


class Reporter:
    """Progress on ``stream``: one line rewritten in place where ``tty``, else plain lines."""

    def __init__(self, stream: TextIO, tty: bool, prog: str = "taso-opt", width: Optional[int] = None,
                 clock=time.monotonic):
        self.stream, self.tty, self.prog, self.clock = stream, tty, prog, clock
        self.width = width
        self.start = clock()
        self.current = ""  # the phase
        self.shown = False  # a terminal line is on screen
        self.last = float("-inf")  # when an update was last written

    def _line(self, text: str) -> str:
        return f"{self.prog}: [{self.clock() - self.start:5.1f} s] {text}"

    def _text(self, detail: str) -> str:
        return f"{self.current}: {detail}" if self.current and detail else (self.current or detail)

    def _draw(self, text: str) -> None:
        line = self._line(text)
        width = self.width or shutil.get_terminal_size((100, 24)).columns
        if len(line) > width - 1:  # (a wrapped line cannot be rewritten in place)
            line = line[:max(0, width - 4)] + "..."
        self.stream.write("\r" + line + "\x1b[K")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        """Erase the terminal line (before other output)."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False

    def phase(self, name: str) -> None:
        self.current = name
        self.last = self.clock()
        if self.tty:
            self._draw(name)
        else:
            self.stream.write(self._line(name) + "\n")
            self.stream.flush()

    def update(self, text: str) -> None:
        now = self.clock()
        if now - self.last < (TTY_INTERVAL if self.tty else PLAIN_INTERVAL):
            return
        self.last = now
        if self.tty:
            self._draw(self._text(text))
        else:
            self.stream.write(self._line(self._text(text)) + "\n")
            self.stream.flush()


class _Erasing:
    """``sys.stderr`` while a terminal line is shown: erases that line before anything else is written."""

    def __init__(self, inner, reporter: Reporter):
        self._inner, self._reporter = inner, reporter

    def write(self, s):
        if s:
            self._reporter.clear()
        return self._inner.write(s)

    def writelines(self, lines):
        for s in lines:
            self.write(s)

    def __getattr__(self, name):
        return getattr(self._inner, name)


_reporter: Optional[Reporter] = None
_wrapped = None  # (the sys.stderr that enable replaced)


def enable(stream: Optional[TextIO] = None, tty: Optional[bool] = None, prog: str = "taso-opt",
           width: Optional[int] = None, clock=time.monotonic) -> Reporter:
    """Show progress on ``stream`` (default ``sys.stderr``): rewritten in place where ``tty`` (default:
    whether the stream is a terminal; ``width``: its columns, default the terminal's), else plain lines.
    Replaces any earlier reporter."""
    global _reporter, _wrapped
    disable()
    stream = sys.stderr if stream is None else stream
    if tty is None:
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
    _reporter = Reporter(stream, tty, prog, width, clock)
    if tty and stream is sys.stderr:
        _wrapped = sys.stderr
        sys.stderr = _Erasing(stream, _reporter)
    return _reporter


def disable() -> None:
    """Stop showing progress (the terminal line is erased)."""
    global _reporter, _wrapped
    if _reporter is not None:
        _reporter.clear()
    if _wrapped is not None and isinstance(sys.stderr, _Erasing):
        sys.stderr = _wrapped
    _reporter, _wrapped = None, None


def active() -> bool:
    """Whether progress is shown (callers may skip building their text where it is not)."""
    return _reporter is not None


def phase(name: str) -> None:
    """A step begins (shown at once: a line of its own where not on a terminal)."""
    if _reporter is not None:
        _reporter.phase(name)


def update(text: str) -> None:
    """Where a step is (shown as ``<phase>: <text>``, at most one a second where not on a terminal)."""
    if _reporter is not None:
        _reporter.update(text)


def clear() -> None:
    """Erase the terminal line, if one is shown (before writing to the stream other than via sys.stderr)."""
    if _reporter is not None:
        _reporter.clear()


@contextlib.contextmanager
def shown_if(wanted: bool, prog: str = "taso-search"):
    """Progress on stderr for the duration where ``wanted`` and no tool has turned it on already (a
    pass's own ``progress`` option, run from Python or another driver)."""
    if not wanted or _reporter is not None:
        yield
        return
    enable(prog=prog)
    try:
        yield
    finally:
        disable()
