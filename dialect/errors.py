"""User-facing errors: one line saying what, where, and what to do."""

from __future__ import annotations

import re

#: the longest TasoError message: longer ones lose their middle (``shorten``)
MESSAGE_LIMIT = 2000


class TasoError(Exception):
    """An error meant for people. ``str(e)`` is a single line; tools print it and exit non-zero.

    A message of several lines is joined into one (the reason may be on any line: a library's message
    often puts it last), and one longer than ``MESSAGE_LIMIT`` loses its middle, never its end."""

    def __init__(self, message: str):
        super().__init__(shorten(" ".join(str(message).split()), MESSAGE_LIMIT))


def one_line(exc: BaseException, limit: int = 300) -> str:
    """A library exception's message squeezed into one line of at most ``limit`` characters.

    Native libraries put where in their sources the error was raised before the reason
    (onnxruntime: ``/onnxruntime_src/.../model.cc:256 onnxruntime::Model::Model(<arguments>) Unsupported
    model IR version: 14, max supported IR version: 13``): that source location and function signature
    are dropped. What is still too long is shortened in the middle (``shorten``): the start says what
    failed, the end usually why."""
    text = " ".join(str(exc).split())
    if not text:
        text = type(exc).__name__
    return shorten(_drop_native_locations(text), limit)


def shorten(text: str, limit: int) -> str:
    """``text`` where it has at most ``limit`` characters, else its start and its end joined by
    `` ... `` (the middle, e.g. a long list, goes; the end, which says why, stays), cut between words
    where one is near."""
    if len(text) <= limit:
        return text
    marker = " ... "
    room = max(limit - len(marker), 2)
    n_head = room * 2 // 5
    n_tail = room - n_head
    head, tail = text[:n_head], text[len(text) - n_tail:]
    cut = head.rfind(" ")
    if cut > n_head * 3 // 4:
        head = head[:cut]
    cut = tail.find(" ")
    if 0 <= cut < n_tail // 4:
        tail = tail[cut + 1:]
    return head.rstrip() + marker + tail.lstrip()


# a C/C++ source location (``/onnxruntime_src/onnxruntime/core/graph/model.cc:256``), then, optionally,
# the signature of the function that raised (``void ns::Class::f(`` ... its arguments ... ``)``)
_SOURCE_LOCATION = re.compile(r"/?(?:[\w.+-]+/)+[\w.+-]+\.(?:cc|cpp|cxx|c|h|hpp):\d+\s*")
_SIGNATURE_START = re.compile(r"(?:[\w:<>*&]+ ){0,3}~?\w+(?:<[^()]*?>)?(?:::~?\w+(?:<[^()]*?>)?)+\(")


def _drop_native_locations(text: str) -> str:
    out, pos = [], 0
    for m in _SOURCE_LOCATION.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos:m.start()])
        end = m.end()
        sig = _SIGNATURE_START.match(text, end)
        if sig:
            depth, i = 1, sig.end()
            while i < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            if depth == 0:
                end = i
        pos = end
        out.append(" ")
    out.append(text[pos:])
    joined = " ".join("".join(out).split())
    return joined or text
