"""A long-lived child process that runs ``taso-opt`` (its ``main()``, exactly as the command line does)
on one model after another, so that taso_mlir is imported once, not once per model.

Protocol (one JSON object a line): it writes ``{"ready": true}`` once imported; then for each request
``{"argv": [...], "log": PATH}`` on stdin it runs ``main(argv)`` with its stdout and stderr (the file
descriptors, so MLIR's own messages too) sent to ``PATH`` and answers ``{"rc": STATUS}``. A crash kills
only this process (``faulthandler`` writes the Python stack to the log first); the parent sees the
signal and starts another. EOF on stdin ends it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time


def main() -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)  # answers go here; fd 1 and 2 go to each request's log
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    from taso_mlir.tools.taso_opt import main as taso_opt_main

    faulthandler.enable(file=sys.stderr, all_threads=False)  # (fd 2: the current request's log)
    proto.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        try:
            if "selftest" in req:  # the fuzzer's own tests: a crash or a hang where taso-opt would run
                if req["selftest"] == "segfault":
                    import ctypes

                    ctypes.string_at(0)
                time.sleep(float(req["selftest"]))
            rc = taso_opt_main(list(req["argv"]))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:  # (main() turns exceptions into statuses; anything past it is a crash)
            import traceback

            traceback.print_exc()
            rc = 3
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(null, 1)
        os.dup2(null, 2)
        proto.write(json.dumps({"rc": rc}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
