"""What every taso command-line tool does around its work: one line on stderr and a non-zero exit
for errors, never a traceback (``TASO_DEBUG=1`` shows one for internal errors), and never a death by
a signal where the work runs contained (``run_contained``: in a forked child process)."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Callable, NamedTuple, Optional

EXIT_ERROR = 1
EXIT_INTERNAL = 2


def die(prog: str, msg: str, code: int = EXIT_ERROR) -> int:
    sys.stderr.write(f"{prog}: error: {msg}\n")
    return code


def version(prog: str) -> str:
    """``<prog> <version of the installed taso-mlir>`` (what ``--version`` prints)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        v = package_version("taso-mlir")
    except PackageNotFoundError:
        v = "(not installed)"
    return f"{prog} {v}"


def asks_version(argv: list[str]) -> bool:
    """Whether the command line asks for ``--version`` (before a ``--``)."""
    argv = [str(a) for a in argv]
    return "--version" in (argv[:argv.index("--")] if "--" in argv else argv)


def run(prog: str, body: Callable[[list[str]], int], argv: Optional[list[str]] = None) -> int:
    """Run ``body(argv)`` and turn what it raises into the tool's exit status. ``--version`` prints
    ``version(prog)`` on stdout instead, for every tool."""
    argv = sys.argv[1:] if argv is None else argv
    if asks_version(argv):
        sys.stdout.write(version(prog) + "\n")
        return 0
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


#: signals by which a process dies of a bug of its own (MLIR's C++ included): a crash
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGTRAP", "SIGSYS"})
#: signals a waiting parent passes on to its child (and then dies of, where the child did)
_PASSED_ON = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
_in_child = False
_last_interrupt = float("-inf")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def in_contained_child() -> bool:
    """Whether this process is the child ``in_child`` forked (test hooks act only there)."""
    return _in_child


def _interrupt_once(signum, frame) -> None:
    """The child's SIGINT handler: KeyboardInterrupt, once for a Ctrl-C that reaches it twice (from the
    terminal, which signals the whole process group, and passed on by the parent)."""
    global _last_interrupt
    now = time.monotonic()
    if now - _last_interrupt < 1.0:
        return
    _last_interrupt = now
    raise KeyboardInterrupt


class ChildExit(NamedTuple):
    status: int  # the child's exit status, or minus the number of the signal it died of
    received: frozenset  # the signals this process received while waiting (and passed on to the child)
    pid: int


def in_child(work: Callable[[], int]) -> ChildExit:
    """Run ``work()`` in a forked child process and wait for it. The child shares stdin, stdout and
    stderr, so what it reads and writes is unchanged; it exits with what ``work`` returns (or raises as
    SystemExit) without running this process's exit handlers, and dies if this process is killed
    (Linux). SIGINT, SIGTERM, SIGHUP and SIGQUIT that reach this process meanwhile are passed on to the
    child (a Ctrl-C that reaches both counts once in the child). Fork before MLIR contexts, onnxruntime
    sessions or other threads exist: the child must not need a lock another thread held."""
    import threading

    sys.stdout.flush()
    sys.stderr.flush()
    # (handlers can only be set from the main thread: called from another, signals are not passed on; a
    # signal this process was started with ignored, as a shell starts a background job's SIGINT, stays
    # ignored, in the child too)
    sigs = [getattr(signal, n) for n in _PASSED_ON] if threading.current_thread() is threading.main_thread() else []
    sigs = [s for s in sigs if signal.getsignal(s) is not signal.SIG_IGN]
    received: list = []
    pid = 0

    def pass_on(signum, frame):
        received.append(signum)
        if pid:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    # (blocked across the fork: a signal in between reaches the child's handlers or the parent's, not both)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    handlers = {}
    try:
        handlers = {s: signal.signal(s, pass_on) for s in sigs}
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            _child(work, handlers, mask, parent)  # (does not return)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _, status = os.waitpid(pid, 0)  # (retried after a handler runs: PEP 475)
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
        for s, h in handlers.items():
            signal.signal(s, h)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return ChildExit(os.waitstatus_to_exitcode(status), frozenset(received), pid)


def _child(work, handlers: dict, mask, parent: int) -> None:
    global _in_child
    code = EXIT_INTERNAL
    try:
        _in_child = True
        for s, h in handlers.items():
            signal.signal(s, _interrupt_once if h is signal.default_int_handler else h)
        try:  # die with the parent (a killed taso-opt leaves no orphan working on)
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:  # (it died before the prctl)
            os._exit(EXIT_INTERNAL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        code = work()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            sys.stderr.write(f"{e.code}\n")
            code = EXIT_ERROR
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:  # never back into the parent's code: no Ctrl-C from here to the exit
        signal.pthread_sigmask(signal.SIG_BLOCK, [getattr(signal, n) for n in _PASSED_ON])
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        os._exit(code if isinstance(code, int) else EXIT_INTERNAL)


def run_contained(prog: str, body: Callable[[list[str]], int], argv: list[str], subject: str,
                  cleanup: Optional[Callable[[int], bool]] = None) -> int:
    """``run(prog, body, argv)`` in a forked child (``in_child``), so that a crash of the work (MLIR's
    C++ code, a native library) is one line and an exit status, never the tool's own death by a signal:
    ``prog: error: internal error: the optimizer crashed (SIGSEGV) on SUBJECT; nothing written; please
    report this with the input`` (exit status 2), or ``... was killed (SIGKILL; out of memory?) ...``
    (status 1) for a child killed from outside. ``cleanup(child pid)`` removes what the child left
    half-written and says whether its output had been written all the same. A signal that stops the
    tool (Ctrl-C, SIGTERM) is passed on to the child; where the child dies of it, the tool dies of it
    too (Ctrl-C: "interrupted", status 130, as in ``run``, whatever signal the interrupted child died
    of). A signal the tool was started with ignored stays ignored. The exit status of a child that
    exits is the tool's."""
    if not hasattr(os, "fork"):
        return run(prog, body, argv)
    try:
        child = in_child(lambda: run(prog, body, argv))
    except KeyboardInterrupt:  # (a Ctrl-C just as the child ended)
        return die(prog, "interrupted", 130)
    if child.status >= 0:
        return child.status
    signum = -child.status
    written = False
    if cleanup is not None:
        try:
            written = cleanup(child.pid)
        except Exception:
            pass
    if signal.SIGINT in child.received:
        # interrupted, whatever the child died of: a Ctrl-C that lands while the child is still loading
        # its native libraries can leave it to die of SIGSEGV instead (seen once in 40 under load)
        return die(prog, "interrupted", 130)
    if signum in child.received:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + signum
    name = signal_name(signum)
    done = "after writing its output" if written else "nothing written"
    if name in CRASH_SIGNALS:
        return die(prog, f"internal error: the optimizer crashed ({name}) on {subject}; {done}; please report "
                         f"this with the input", EXIT_INTERNAL)
    why = "; out of memory?" if name == "SIGKILL" else ""
    return die(prog, f"the optimizer was killed ({name}{why}) on {subject}; {done}")
