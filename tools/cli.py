"""What every taso command-line tool does around its work: one line on stderr and a non-zero exit
for errors, never a traceback (``TASO_DEBUG=1`` shows one for internal errors)."""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional

EXIT_ERROR = 1
EXIT_INTERNAL = 2


def die(prog: str, msg: str, code: int = EXIT_ERROR) -> int:
    sys.stderr.write(f"{prog}: error: {msg}\n")
    return code


def run(prog: str, body: Callable[[list[str]], int], argv: Optional[list[str]] = None) -> int:
    """Run ``body(argv)`` and turn what it raises into the tool's exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return body(argv)
    except KeyboardInterrupt:
        return die(prog, "interrupted", 130)
    except BrokenPipeError:
        return 0
    except Exception as e:  # last resort: never a traceback for users
        from taso_mlir.dialect.errors import TasoError, one_line

        if isinstance(e, TasoError):
            return die(prog, str(e))
        if os.environ.get("TASO_DEBUG"):
            raise
        return die(prog, f"internal error: {type(e).__name__}: {one_line(e)} (set TASO_DEBUG=1 for a traceback)",
                   EXIT_INTERNAL)
