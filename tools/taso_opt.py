"""taso-opt: an mlir-opt-style driver for taso-mlir.

    taso-opt model.onnx -o model.mlir                      # import (into the taso dialect)
    taso-opt model.mlir --convert-onnx-to-taso --taso-dce  # our passes as flags, in order
    taso-opt in.mlir --pass-pipeline='builtin.module(canonicalize,convert-onnx-to-taso{opset=17})'
    taso-opt model.onnx -o out.onnx                        # round trip back to ONNX

Input: ``.onnx``, ``.mlir``, ``.mlirbc`` or ``-`` (MLIR text or bytecode on stdin). Output format from
the ``-o`` suffix: ``.onnx``, ``.mlirbc`` (bytecode), otherwise MLIR text (``--emit-bytecode`` forces
bytecode). Unknown ``--<name>`` flags are tried as upstream MLIR passes (``--canonicalize``, ``--cse``).
Errors are one line on stderr with a non-zero exit; outputs are written atomically. A taso-search run ends
with one summary line on stderr (target, cost and ops before and after, rewrites, time; the details are in
``--taso-report``). ``--progress`` shows each phase on stderr (``dialect/progress.py``), by default where
stderr is a terminal.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
from typing import Optional

from . import cli



class _ArgumentParser(argparse.ArgumentParser):
    """A bad command line is one line and exit 1 like any other error (argparse prints its usage and
    exits 2, the status taso-opt keeps for internal errors)."""

    def error(self, message):
        from taso_mlir.dialect.errors import TasoError

        raise TasoError(f"{message} (see taso-opt --help)")


def _build_parser() -> argparse.ArgumentParser:
    from taso_mlir.passes.registry import REGISTRY

    epilog = "taso passes (flags or --pass-pipeline elements):\n" + "\n".join(
        f"  --{p.argument:<24} {p.summary}" + "".join(
            f"\n      {{{o.name}={o.default}}}  {o.help}" for o in p.options)
        for p in REGISTRY.values()) + \
        "\n\nAny other --<pass> flag is parsed as an upstream MLIR pass (e.g. --canonicalize, --cse)."
    ap = _ArgumentParser(
        prog="taso-opt", description="mlir-opt-style driver for the taso dialect and passes",
        epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    ap.add_argument("input", nargs="?", default="-", help="input file (.onnx, .mlir, .mlirbc) or - for stdin")
    ap.add_argument("-o", dest="output", default="-", help="output file (.onnx, .mlirbc, .mlir) or - for stdout")
    ap.add_argument("--pass-pipeline", help="textual pipeline: 'builtin.module(pass1,pass2{opt=v},...)'")
    for p in REGISTRY.values():
        ap.add_argument(f"--{p.argument}", dest="passes", action="append_const", const=p.argument, help=p.summary)
    ap.add_argument("--mlir-print-ir-after-all", action="store_true", help="print the IR after every pass (stderr)")
    ap.add_argument("--mlir-timing", action="store_true", help="report pass timing (stderr)")
    ap.add_argument("--mlir-pass-statistics", action="store_true",
                    help="print the statistics each taso pass counted (also the passes inside taso-search) to stderr")
    ap.add_argument("--split-input-file", action="store_true",
                    help="split MLIR input at '// -----' and process each chunk independently")
    ap.add_argument("--mlir-elide-elementsattrs-if-larger", type=int, metavar="N",
                    help="print elements attributes with more than N elements elided")
    ap.add_argument("--allow-unregistered-dialect", action="store_true",
                    help="allow operations of unregistered dialects besides onnx.* (always allowed)")
    ap.add_argument("--mlir-print-debuginfo", action="store_true",
                    help="print locations (keeps ONNX node names through MLIR text)")
    ap.add_argument("--emit-bytecode", action="store_true", help="write MLIR bytecode")
    ap.add_argument("--emit-irdl", action="store_true", help="print the taso dialect's IRDL definition and exit")
    ap.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0xD1x...",
                    help="static shape for a graph input of an ONNX model (repeatable)")
    ap.add_argument("--verify-numerics", action="store_true",
                    help="ONNX in and out: run both models in onnxruntime on random inputs and refuse to write "
                         "an output that differs by more than 1e-5 x the output scale (float16: 4 units "
                         "in the last place) unless it is as close to a float64 evaluation of the input "
                         "as the input is (+ that tolerance)")
    ap.add_argument("--no-verify-numerics", action="store_true",
                    help="with --taso-search on ONNX in and out: skip the default onnxruntime check")
    ap.add_argument("--taso-report", nargs="?", const="-", metavar="FILE",
                    help="print what taso-search did (graphs explored, rules applied, cost before/after, "
                         "time) to stderr, or write it to FILE (.json for JSON)")
    ap.add_argument("--emit-pdl", action="store_true",
                    help="write the rule library as PDL patterns (mlir-opt parses them with the IRDL file) and exit")
    ap.add_argument("--summary", action="store_true",
                    help="print a one-line census of the result (taso ops, generic onnx ops, weights) to stderr")
    ap.add_argument("--no-verify-each", action="store_true", help="do not run the verifier after each pass")
    ap.add_argument("--dump-pass-pipeline", action="store_true",
                    help="print the pass pipeline (taso-search expanded into the passes it runs) to stderr, "
                         "then run it on the input file; without an input file, only print it")
    ap.add_argument("--progress", dest="progress", action="store_const", const=True, default=None,
                    help="show progress on stderr: each phase (import, each pass, the search's windows, export, "
                         "the numeric check, writing); one updating line on a terminal, else a plain line per "
                         "phase and at most one a second (default: on where stderr is a terminal)")
    ap.add_argument("--no-progress", dest="progress", action="store_const", const=False, help="no progress")
    ap.add_argument("--version", action="store_true", help="print taso-opt's version and exit")
    return ap


def main(argv: Optional[list[str]] = None, contain: Optional[bool] = None) -> int:
    """The taso-opt command. As a command (no ``argv``: the console script, ``python -m``) the work runs
    in a forked child process (``cli.run_contained``, forked before anything heavy is imported), so
    that nothing, MLIR's C++ code included, kills taso-opt by a signal: a crash is one line, exit
    status 2 and no output (the child's half-written temporaries are removed). Called with an argument
    list (the tests, the fuzzer's worker, the benchmarks' round trips, which measure their own
    process), it runs in the calling process unless ``contain``."""
    if contain is None:
        contain = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    if not contain or cli.asks_version(argv):
        return cli.run("taso-opt", _main, argv)
    in_path, out_path, others = _io_paths(argv)
    written = [out_path] if out_path != "-" else []
    before = {p: _stat_id(p) for p in written}

    def cleanup(pid: int) -> bool:
        from taso_mlir.dialect.onnx_export import remove_temporaries

        remove_temporaries(pid, written + others)
        return any(_stat_id(p) != before[p] for p in written)

    return cli.run_contained("taso-opt", _main, argv, "<stdin>" if in_path == "-" else in_path, cleanup)


class _PathsParser(argparse.ArgumentParser):
    def error(self, message):
        raise ValueError(message)


def _io_paths(argv: list[str]) -> tuple[str, str, list[str]]:
    """(input, output, reports written) as ``argv`` names them, for the parent of the contained child:
    the options of ``_build_parser`` that take a value, without importing the passes (which would load
    MLIR and numpy's threads into the process that forks)."""
    ap = _PathsParser(add_help=False, allow_abbrev=False)
    ap.add_argument("input", nargs="?", default="-")
    ap.add_argument("-o", dest="output", default="-")
    for opt in ("--pass-pipeline", "--mlir-elide-elementsattrs-if-larger", "--input-shape"):
        ap.add_argument(opt, action="append", default=[])
    ap.add_argument("--taso-report", nargs="?", const="-")
    try:
        a, _ = ap.parse_known_args(argv)
    except (ValueError, SystemExit):
        return "-", "-", []
    reports = [a.taso_report] if a.taso_report and a.taso_report != "-" else []
    for pipeline in a.pass_pipeline:
        reports += [r for r in re.findall(r"\breport=([^\s,}]+)", pipeline) if r != "-"]
    return a.input, a.output, reports


def _stat_id(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def _test_crash() -> None:
    """Test hook: ``TASO_OPT_TEST_CRASH=SIGSEGV`` (any signal name) in the environment makes the
    contained child of the taso-opt command (never a process that called ``main(argv)`` itself) kill
    itself with that signal as it writes its output, once the temporary file is complete and before
    it is renamed into place, so that a test can show that a crash is contained."""
    name = os.environ.get("TASO_OPT_TEST_CRASH")
    if name and cli.in_contained_child():
        import signal

        os.kill(os.getpid(), getattr(signal, name))


def _main(argv: list[str]) -> int:
    ap = _build_parser()
    args, extra = ap.parse_known_args(argv)
    from taso_mlir.dialect import progress
    from taso_mlir.dialect.errors import TasoError

    if args.version:  # (cli.run answers --version first; this is for a caller of _main)
        sys.stdout.write(cli.version("taso-opt") + "\n")
        return 0
    if args.emit_irdl and args.emit_pdl:
        raise TasoError("--emit-pdl and --emit-irdl each write a whole output: give one of them")
    show = args.progress
    if show is None:
        try:
            show = sys.stderr.isatty()
        except (AttributeError, ValueError):
            show = False
    if show:
        progress.enable(prog="taso-opt")
    try:
        return _main_body(args, argv, extra)
    finally:
        progress.disable()


def _main_body(args, argv: list[str], extra: list[str]) -> int:
    from taso_mlir.dialect import progress
    from taso_mlir.dialect.errors import TasoError

    if args.emit_irdl:
        from taso_mlir.dialect.irdl_gen import taso_irdl_text

        _write_text(args.output, taso_irdl_text())
        return 0

    if args.emit_pdl:
        from taso_mlir.dialect.context import make_context
        from taso_mlir.passes.search.pdl import emit_text
        from taso_mlir.passes.search.taso_search import rewrites

        with make_context():
            text = emit_text(rewrites())
        _write_text(args.output, text)
        return 0

    # the pass list, in command-line order: our flags and upstream --<pass> flags
    steps: list[str] = []
    ours = set(args.passes or [])
    for a in argv:
        if a.startswith("--") and a[2:] in ours:
            steps.append(a[2:])
        elif a in extra:
            if not a.startswith("--") or a == "--":
                raise TasoError(f"unexpected argument '{a}'")
            steps.append(a[2:])
    if args.pass_pipeline and steps:
        raise TasoError("use either --pass-pipeline or pass flags, not both")
    pipeline = args.pass_pipeline or (f"builtin.module({','.join(steps)})" if steps else None)
    searching = bool(pipeline) and re.search(r"(^|[(,])\s*taso-search\b", pipeline) is not None
    if args.dump_pass_pipeline:
        _dump_pipeline(pipeline)
        if args.input == "-":
            return 0
    if args.taso_report and not searching:
        raise TasoError("--taso-report needs the taso-search pass")
    if searching:
        extra_opts = []
        if args.taso_report:
            extra_opts.append(f"report={args.taso_report}")
        if extra_opts:
            pipeline = _add_search_options(pipeline, extra_opts)
    if searching and not args.no_verify_numerics and _in_kind(args.input) == "onnx" \
            and _out_kind(args.output, args.emit_bytecode) == "onnx":
        args.verify_numerics = True  # an optimized model is checked against its input by default

    in_path, out_path = args.input, args.output
    if out_path != "-" and in_path != "-" and os.path.exists(out_path) and os.path.exists(in_path) \
            and os.path.samefile(in_path, out_path):
        raise TasoError(f"{out_path}: refusing to overwrite the input file")
    out_kind = _out_kind(out_path, args.emit_bytecode)
    in_kind = _in_kind(in_path)
    if in_kind == "onnx" and out_kind == "onnx" and out_path != "-" and in_path != "-":
        _check_data_file(in_path, out_path)
    if in_kind == "onnx" and args.split_input_file:
        raise TasoError("--split-input-file applies to MLIR text input only")
    if args.input_shape and in_kind != "onnx":
        raise TasoError("--input-shape applies to ONNX input only")

    if in_kind == "onnx":
        shapes = {}
        for spec in args.input_shape:
            if "=" not in spec:
                raise TasoError(f"--input-shape expects NAME=D0xD1x..., got '{spec}'")
            k, v = spec.split("=", 1)
            shapes[k] = v
        chunks = [None]
    else:
        data = _read_input(in_path)
        if isinstance(data, str) and not _mlir_content(data):
            raise TasoError(f"{'<stdin>' if in_path == '-' else in_path}: empty input: no module")
        if args.split_input_file:
            if isinstance(data, bytes):
                raise TasoError("--split-input-file applies to MLIR text input only")
            chunks = data.split("// -----")
        else:
            chunks = [data]
    if out_kind == "onnx" and len(chunks) != 1:
        raise TasoError("ONNX output needs a single module (drop --split-input-file)")

    outputs: list = []
    args.summary_lines = []
    failures = 0
    for i, chunk in enumerate(chunks):
        try:
            outputs.append(_process(args, pipeline, in_kind, in_path, chunk, out_kind,
                                    shapes if in_kind == "onnx" else None, offset=_line_offset(chunks, i)))
        except TasoError as e:
            if len(chunks) == 1:
                raise
            sys.stderr.write(f"taso-opt: error: {e}\n")
            failures += 1
    from taso_mlir.dialect.irdl_gen import release_unused_contexts

    release_unused_contexts()  # (the contexts' copies of the weights, before the numeric check's sessions)
    check = None
    if args.verify_numerics:
        if in_kind != "onnx" or out_kind != "onnx":
            raise TasoError("--verify-numerics needs an .onnx input and an .onnx output")
        check = _numeric_check(args, in_path, outputs[0])
    progress.phase("write" + ("" if out_path == "-" else f" {out_path}"))
    if out_kind == "onnx":
        from taso_mlir.dialect.onnx_export import output_target, save_onnx

        if out_path == "-" or output_target(out_path)[1]:  # stdout, a device: checked before any byte goes out
            if check is not None:
                check(outputs[0])
            _test_crash()
            if out_path == "-":
                sys.stdout.buffer.write(outputs[0].SerializeToString())
            else:
                save_onnx(outputs[0], out_path)
        else:  # the written file is checked before it is renamed into place
            save_onnx(outputs[0], out_path, check=check or (lambda _: _test_crash()))
    elif out_kind == "bytecode":
        _write_bytes(out_path, b"".join(outputs))
    else:
        _write_text(out_path, "// -----\n".join(outputs))
    for line in args.summary_lines:
        sys.stderr.write(line)
    if args.mlir_pass_statistics:
        from taso_mlir.passes.pipeline import statistics_text, take_statistics
        from taso_mlir.passes.search.taso_search import FUNCTION_PASSES

        sys.stderr.write(statistics_text(take_statistics(), FUNCTION_PASSES))
    return cli.EXIT_ERROR if failures else 0


def _dump_pipeline(pipeline) -> None:
    """Print the pipeline to stderr, each taso-search element expanded into the passes it runs."""
    from taso_mlir.dialect.errors import TasoError
    from taso_mlir.passes.registry import parse_element, split_top_level
    from taso_mlir.passes.search.taso_search import dump_pipeline

    if not pipeline:
        raise TasoError("--dump-pass-pipeline: no passes given")
    sys.stderr.write(f"Pass Manager with {pipeline}\n")
    name, _, inner = parse_element(pipeline)
    for elem in split_top_level(inner or ""):
        ename, opts, _nested = parse_element(elem)
        if ename == "taso-search":
            sys.stderr.write(dump_pipeline({k: v for k, v in opts.items() if k not in ("report", "progress")}) + "\n")


def _check_data_file(in_path: str, out_path: str) -> None:
    """A model over 2 GB is written with its weights in ``<output>.data``: refuse an output path whose
    ``.data`` file holds the input's own external data (writing would replace the input's weights)."""
    import onnx

    from taso_mlir.dialect.errors import TasoError

    data = out_path + ".data"
    if not os.path.isfile(data):
        return
    try:
        model = onnx.load(in_path, load_external_data=False)
    except Exception:
        return  # (the import reports an unreadable input)
    base = os.path.dirname(os.path.abspath(in_path))
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((e.value for e in t.external_data if e.key == "location"), None)
            if loc and os.path.exists(os.path.join(base, loc)) and os.path.samefile(os.path.join(base, loc), data):
                raise TasoError(f"{out_path}: refusing to write here: {data} holds the input's external data, "
                                "and an output over 2 GB writes its weights there")


def _numeric_check(args, in_path: str, output):
    """The check of the optimized model against the input in onnxruntime: a function of the output (a
    ModelProto, or the path of the written file). The input runs from its file (ONNX input is always a
    file), so that its weights are not held twice; one-line TasoError where they disagree."""
    import onnx

    from taso_mlir.dialect import progress
    from taso_mlir.dialect.errors import TasoError
    from taso_mlir.dialect.numerics import compare_models, input_shapes

    like = input_shapes(output)

    def check(out) -> None:
        if not isinstance(out, onnx.ModelProto):  # (the temporary file)
            _test_crash()
        progress.phase("numeric check (onnxruntime, the input against the output)")
        rep = compare_models(in_path, out, bounds=args.index_bounds, like=like)
        line = (f"numerics: max |difference| {rep.max_abs:.3g} (output scale {rep.scale:.3g}) over "
                f"{rep.outputs} output(s), {rep.trials} random input sets, onnxruntime")
        if rep.no_reference:  # (the float32 runs differ by more than the tolerance, and no float64 judges)
            line += f", float32 only (no float64 reference: {rep.no_reference})"
        against = (f"a float64 reference ({rep.reference}): {rep.ref_error:.3g} from it, the input "
                   f"{rep.input_ref_error:.3g}")
        if not rep.ok:
            what = ("has other non-finite, integer or boolean values" if rep.worst == float("inf")
                    else f"exceeds {rep.tolerance:.3g} x scale" + (
                        f", and is farther than the input (+ that) from {against}"
                        if rep.reference and not rep.no_reference else ""))
            raise TasoError(line + f": output '{rep.worst_output}' {what}; nothing written")
        if rep.reference:  # (only built where the float32 runs differ by more than the tolerance)
            line += f"; beyond {rep.tolerance:.3g} x scale, but no farther than the input (+ that) from {against}"
        args.summary_lines.append(f"taso-opt: {line}: ok\n")  # (with the census, once the output is written)

    return check


def _add_search_options(pipeline: str, opts: list) -> str:
    """Add options to every taso-search element of a textual pipeline (keeping its own)."""
    def sub(m):
        inner = m.group(2)
        return m.group(1) + "taso-search{" + " ".join(([inner] if inner else []) + opts) + "}"

    return re.sub(r"(^|[(,]\s*)taso-search(?:\{([^}]*)\})?", sub, pipeline)


def _line_offset(chunks, i) -> int:
    if chunks[0] is None:
        return 0
    return sum(c.count("\n") for c in chunks[:i])


def _in_kind(path: str) -> str:
    low = path.lower()
    if low.endswith(".onnx"):
        return "onnx"
    if low.endswith(".mlirbc"):
        return "bytecode"
    return "mlir"


def _out_kind(path: str, emit_bytecode: bool) -> str:
    low = path.lower()
    if low.endswith(".onnx"):
        return "onnx"
    if emit_bytecode or low.endswith(".mlirbc"):
        return "bytecode"
    return "text"


def _read_input(path: str):
    from taso_mlir.dialect.errors import TasoError

    try:
        if path == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                raw = f.read()
    except FileNotFoundError:
        raise TasoError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TasoError(f"{path}: is a directory") from None
    except OSError as e:
        raise TasoError(f"{path}: cannot read ({e.strerror})") from None
    if raw.startswith(b"ML\xefR"):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TasoError(f"{path}: not MLIR text or bytecode (is it an ONNX file without the .onnx suffix?)") from None


#: Deepest nesting of regions, attributes and types accepted: MLIR's parser and printer recurse once per
#: level and overflow the C stack (a segfault) at a few thousand levels (regions: between 2,000 and 5,000).
MAX_NESTING = 1000
_OPENERS, _CLOSERS = b"([{<", b")]}>"


def _nesting(text) -> tuple[int, int]:
    """(deepest bracket nesting, line where it is first passed MAX_NESTING or 0) of MLIR text, not
    counting string literals, comments and the ``->`` of function types. Chunked with numpy, so a
    text of hundreds of MB (weights in hex) costs a fraction of a second, not a Python loop."""
    import re

    import numpy as np

    raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    raw = re.sub(rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"', b'""', raw)  # (unrolled: 30x faster on long hex strings)
    raw = re.sub(rb"//[^\n]*", b"", raw).replace(b"->", b"  ")
    step = np.zeros(256, np.int8)
    step[list(_OPENERS)] = 1
    step[list(_CLOSERS)] = -1
    depth = deepest = 0
    chunk = 1 << 24
    for start in range(0, len(raw), chunk):
        part = np.frombuffer(raw, np.uint8, count=min(chunk, len(raw) - start), offset=start)
        levels = np.cumsum(step[part], dtype=np.int64) + depth
        if levels.size:
            deepest = max(deepest, int(levels.max()))
            if deepest > MAX_NESTING:
                at = start + int(np.argmax(levels > MAX_NESTING))
                return deepest, raw.count(b"\n", 0, at) + 1
            depth = int(levels[-1])
    return deepest, 0


def _check_nesting(text, name: str, offset: int = 0) -> None:
    from taso_mlir.dialect.errors import TasoError

    deepest, line = _nesting(text)
    if line:
        raise TasoError(f"{name}:{line + offset}: brackets nested deeper than {MAX_NESTING} levels (regions, "
                        f"attributes or types) are not supported")


def _check_bytecode_reader(data: bytes, name: str) -> None:
    """MLIR's bytecode reader crashes the process (segfault) on some corrupt files: parse in a child
    process first (``cli.in_child``, as the taso-opt command runs its work), so that a corrupt file is an
    error message rather than an internal error. The bytecode reader does not recurse, the printer
    does: the child prints the module too (a crash is reported) and measures its nesting."""
    from taso_mlir.dialect.errors import TasoError

    def probe() -> int:
        null = os.open(os.devnull, os.O_WRONLY)  # (MLIR's own messages: the caller reports the parse)
        os.dup2(null, 1)
        os.dup2(null, 2)
        from taso_mlir.dialect.mlir import ir
        from taso_mlir.dialect.context import make_context

        ctx = make_context()
        try:
            with ctx:
                m = ir.Module.parse(data, ctx)
        except Exception:
            return 0  # a clean parse error: the caller reports it
        text = m.operation.get_asm(binary=True, large_elements_limit=16, large_resource_limit=16,
                                   print_generic_op_form=True, assume_verified=True)
        return 4 if _nesting(text)[0] > MAX_NESTING else 0

    import signal

    child = cli.in_child(probe)
    if signal.SIGINT in child.received:
        raise KeyboardInterrupt
    if child.status < 0:
        raise TasoError(f"{name}: corrupt MLIR bytecode (MLIR crashed reading it: {cli.signal_name(-child.status)})")
    if child.status == 4:
        raise TasoError(f"{name}: brackets nested deeper than {MAX_NESTING} levels (regions, attributes or types) "
                        f"are not supported")


class _Diagnostics:
    """Collects MLIR diagnostics so that they come out as our one-line errors, not library noise."""

    def __init__(self, ctx):
        self.messages: list[str] = []
        self.handle = ctx.attach_diagnostic_handler(self)

    def __call__(self, d) -> bool:
        # an exception must not leave a diagnostic handler (it would cross C++ frames)
        try:
            if str(d.severity).endswith("ERROR"):
                try:
                    msg = d.message
                except Exception:  # a message quoting bytes that are not UTF-8
                    msg = "error (its message is not UTF-8 text)"
                self.messages.append(f"{d.location}: {msg}")  # _fix_locs maps it to file:line
        except Exception:
            pass
        return True

    def first(self) -> Optional[str]:
        return self.messages[0] if self.messages else None

    def detach(self):
        self.handle.detach()


def _fix_locs(msg: str, name: str, offset: int) -> str:
    """Point MLIR's ``loc("-":L:C)`` / ``"-":L:C`` at the real file and line (split chunks included)."""
    import re

    def sub(m):
        return f"{name}:{int(m.group(1)) + offset}:{m.group(2)}"

    msg = re.sub(r'loc\("-":(\d+):(\d+)\)', sub, msg)
    return re.sub(r'"-":(\d+):(\d+)', sub, msg)


def _process(args, pipeline, in_kind, in_path, chunk, out_kind, shapes, offset=0):
    from taso_mlir.dialect.errors import TasoError

    name = "<stdin>" if in_path == "-" else in_path
    try:
        return _process_inner(args, pipeline, in_kind, in_path, chunk, out_kind, shapes, offset)
    except TasoError as e:
        raise TasoError(_fix_locs(str(e), name, offset)) from None


def _process_inner(args, pipeline, in_kind, in_path, chunk, out_kind, shapes, offset=0):
    from taso_mlir.dialect import progress
    from taso_mlir.dialect.errors import TasoError, one_line
    from taso_mlir.dialect.mlir import ir
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.ops import check_readable, verify_module
    from taso_mlir.passes.registry import build_pass_manager, run_pass_manager

    ctx = make_context()
    diags = _Diagnostics(ctx)
    try:
        if in_kind == "onnx":
            from taso_mlir.dialect.onnx_import import import_onnx, load_onnx

            progress.phase(f"import {in_path}")
            progress.update("load")
            model = load_onnx(in_path)
            if shapes:
                _check_input_shapes(model, shapes, in_path)
            progress.update("import and convert to the taso dialect")
            module = import_onnx(model, ctx, input_shapes=shapes, where=in_path)
            if args.verify_numerics:  # (what the numeric check needs of the input, before it is let go)
                from taso_mlir.dialect.numerics import index_bounds

                args.index_bounds = index_bounds(model)
            if model.ir_version >= 4:  # (before IR 4 every initializer is listed as an input, and stays listed)
                consts = {t.name for t in model.graph.initializer}
                shadowed = [vi.name for vi in model.graph.input if vi.name in consts]
                if shadowed:
                    more = f" and {len(shadowed) - 3} more" if len(shadowed) > 3 else ""
                    args.summary_lines.append(
                        f"taso-opt: note: {len(shadowed)} graph input(s) with an initializer "
                        f"({', '.join(repr(n) for n in shadowed[:3])}{more}) are taken as constants; the output "
                        f"lists only the other inputs\n")
            del model
        else:
            name = "<stdin>" if in_path == "-" else in_path
            progress.phase(f"parse {name}")
            if isinstance(chunk, bytes):
                _check_bytecode_reader(chunk, name)
            else:
                _check_nesting(chunk, name, offset)
            try:
                with ctx:
                    module = ir.Module.parse(chunk, ctx)
            except ir.MLIRError as e:
                msg = (diags.first() or one_line(e)).replace("Unable to parse module assembly: error: ", "")
                raise TasoError(f"cannot parse MLIR: {msg.split(' note: ')[0]}") from None
            except Exception as e:
                raise TasoError(f"cannot parse MLIR: {diags.first() or one_line(e)}") from None
            check_readable(module.operation, name)
            _check_unregistered(module, args.allow_unregistered_dialect)
            verify_module(module.operation)
            if pipeline:
                _check_importer_form(module, pipeline, name)
        if pipeline:
            from taso_mlir.passes.search import taso_search

            pm = build_pass_manager(pipeline, ctx)
            if args.mlir_print_ir_after_all:
                pm.enable_ir_printing(print_after_all=True,
                                      large_elements_limit=args.mlir_elide_elementsattrs_if_larger)
            if args.mlir_timing:
                pm.enable_timing()
            if args.no_verify_each:
                pm.enable_verifier(False)
            taso_search.LAST_REPORT = None
            progress.phase(_pipeline_names(pipeline))
            run_pass_manager(pm, module.operation)
            verify_module(module.operation)
            if taso_search.LAST_REPORT is not None:  # a taso-search ran: one line of what it did
                args.summary_lines.append(f"taso-opt: {search_summary(taso_search.LAST_REPORT)}\n")
                note = _dynamic_inputs_note(module)
                if note:
                    args.summary_lines.append(f"taso-opt: note: {note}\n")
        if args.summary:  # printed once the output is written (a failing run prints only its error)
            args.summary_lines.append(f"taso-opt: {_census(module)}\n")
        if out_kind == "onnx":
            from taso_mlir.dialect.onnx_export import export_onnx

            progress.phase("export to ONNX")
            try:
                return export_onnx(module)
            except TasoError as e:
                if shapes and "would not be valid" in str(e):  # (shapes the import's inference could not relate)
                    raise TasoError(f"{e} (do the --input-shape sizes agree with each other?)") from None
                raise
        if out_kind == "bytecode":
            buf = io.BytesIO()
            module.operation.write_bytecode(buf)
            return buf.getvalue()
        buf = io.StringIO()
        module.operation.print(file=buf, large_elements_limit=args.mlir_elide_elementsattrs_if_larger,
                               enable_debug_info=args.mlir_print_debuginfo, assume_verified=True)
        text = buf.getvalue()
        return text if text.endswith("\n") else text + "\n"
    except TasoError:
        raise
    except ir.MLIRError as e:
        raise TasoError(diags.first() or one_line(e)) from None
    finally:
        diags.detach()


def _census(module) -> str:
    """'41 taso ops (conv2d 20, ...), 3 generic onnx ops (Gemm 1, ...), 21 weights (0.1 MB)'."""
    import collections
    import re

    import numpy as np

    from taso_mlir.dialect.mlir import ir

    taso, generic = collections.Counter(), collections.Counter()
    weights, nbytes = 0, 0
    for f in module.body.operations:
        if f.operation.name != "func.func" or len(f.operation.regions[0].blocks) == 0:
            continue
        for op in f.operation.regions[0].blocks[0].operations:
            name = op.operation.name
            if name == "taso.weight":
                weights += 1
                # from the type: reading the value would copy it (and not every element type reads back)
                st = ir.ShapedType(op.operation.results[0].type)
                bits = re.search(r"\d+", str(st.element_type))
                nbytes += int(np.prod(st.shape, dtype=object)) * max(1, int(bits.group()) // 8 if bits else 1)
            elif name.startswith("taso."):
                taso[name[5:]] += 1
            elif name.startswith("onnx.") and name != "onnx.NoValue":
                generic[name[5:]] += 1

    def fmt(c):
        return ", ".join(f"{k} {v}" for k, v in c.most_common())

    return (f"{sum(taso.values())} taso ops ({fmt(taso)}); {sum(generic.values())} generic onnx ops "
            f"({fmt(generic) or 'none'}); {weights} weights ({nbytes / 1e6:.1f} MB)")


def search_summary(rep: dict) -> str:
    """One line (at most about 120 characters) of what a taso-search run did, from its report
    (``taso_search.LAST_REPORT``): 'target cpu (measured): cost 0.139 -> 0.114 ms, ops 64 -> 31, 13 rewrites,
    latency 1.00x, 2.9 s'. The ops are those that compute (weights not counted); the details are in
    ``--taso-report``."""
    fr = rep.get("functions", [])
    n = sum(x.get("rewrites_applied", 0) for x in fr)
    parts = [f"cost {rep['cost_before_ms']:.3g} -> {rep['cost_after_ms']:.3g} ms",
             f"ops {rep['compute_ops_before']} -> {rep['compute_ops_after']}"]
    eq = [x["eqsat"] for x in fr if x.get("eqsat") and (x.get("strategies") or {}).get("kept", "taso-eqsat-search")
          == "taso-eqsat-search"]
    if eq:  # (the extracted graph has no rewrite sequence: its size and the solver's gap say what it is)
        gaps = [q["gap"] for q in eq if q.get("gap") is not None]
        parts.append(f"eqsat {sum(q['enodes'] for q in eq)} e-nodes"
                     + (f", gap {100 * max(gaps):.0f}%" if len(gaps) == len(eq) else ", no bound"))
    else:
        parts.append(f"{n} rewrite{'' if n == 1 else 's'}")
    for x in fr:
        lc = x.get("latency_check") or {}
        tried = {t["what"]: t for t in lc.get("tried", ())}
        if lc.get("kept") in tried:
            parts.append(f"latency {tried[lc['kept']]['speedup']:.2f}x"
                         + (" without splits" if lc["kept"] == "search without splits" else ""))
        elif lc.get("kept") == "input" and tried:
            parts.append("slower when timed: input kept")
        if x.get("input_kept"):
            parts.append("dearer than the input as priced: input kept")
    parts.append(f"{rep['time_s']:.1f} s")
    return f"target {rep['target']} ({'measured' if rep['measured'] else 'estimated'}): " + ", ".join(parts)


def _pipeline_names(pipeline: str) -> str:
    """'taso-search' or 'convert-onnx-to-taso, taso-search': the passes of a pipeline, for progress."""
    from taso_mlir.passes.registry import parse_element, split_top_level

    try:
        names = [parse_element(e)[0] for e in split_top_level(parse_element(pipeline)[2] or "")]
    except Exception:
        return pipeline
    text = ", ".join(names)
    return text if len(text) <= 60 else f"{len(names)} passes"


def _mlir_content(text: str) -> bool:
    """Whether MLIR text has anything but whitespace and ``//`` comments."""
    return any(line.split("//", 1)[0].strip() for line in text.splitlines())


def _check_input_shapes(model, shapes: dict, where: str) -> None:
    """Each ``--input-shape NAME=D0xD1x...`` against the model before it is imported: NAME is a graph input
    (not a weight), every dimension is positive, and the rank is the input's where the model states one."""
    from taso_mlir.dialect.errors import TasoError

    weights = {t.name for t in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in weights}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        known = ", ".join(repr(n) for n in list(inputs)[:8]) + (", ..." if len(inputs) > 8 else "")
        of_weights = [n for n in unknown if n in weights]
        raise TasoError(f"{where}: --input-shape names unknown graph input(s): {', '.join(unknown)} ("
                        + (f"{', '.join(repr(n) for n in of_weights)}: a weight, not an input; " if of_weights else "")
                        + f"the graph inputs: {known or 'none'})")
    for name, text in shapes.items():
        spec = f"--input-shape {name}={text}"
        try:
            dims = [int(d) for d in text.lower().split("x")] if text else []
        except ValueError:
            raise TasoError(f"{where}: {spec}: expected NAME=D0xD1x... with integer dimensions, e.g. "
                            f"{name}=1x3x224x224") from None
        bad = [d for d in dims if d <= 0]
        if bad:
            raise TasoError(f"{where}: {spec}: every dimension must be at least 1, got {bad[0]}")
        t = inputs[name].type
        if t.WhichOneof("value") == "tensor_type" and t.tensor_type.HasField("shape"):
            stated = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                      for d in t.tensor_type.shape.dim]
            if len(stated) != len(dims):
                raise TasoError(f"{where}: {spec}: graph input '{name}' has rank {len(stated)} "
                                f"({'x'.join(stated) or 'a scalar'}), the shape given has rank {len(dims)}")


def _check_importer_form(module, pipeline: str, name: str) -> None:
    """A taso pass before ``convert-onnx-to-taso`` on the ONNX importer's form (``torch.operator "onnx.X"``
    ops, as ``torch-mlir-import-onnx`` writes them) finds nothing it knows (taso-search fails on its types):
    a one-line error saying to convert first. The pipeline runs as written (as mlir-opt's does): the
    conversion is not inserted behind the user's back."""
    from taso_mlir.dialect.errors import TasoError
    from taso_mlir.passes.registry import REGISTRY, parse_element, split_top_level

    first = None
    for elem in split_top_level(parse_element(pipeline)[2] or ""):
        ename = parse_element(elem)[0]
        if ename == "convert-onnx-to-taso":
            return
        if ename in REGISTRY:
            first = ename
            break
    if first is None:
        return
    if _first_op(module, lambda op: op.name == "torch.operator") is not None:
        raise TasoError(f"{name}: the input is the ONNX importer's form (torch.operator \"onnx.*\" ops): add "
                        f"--convert-onnx-to-taso before --{first} (or give taso-opt the .onnx model itself)")


def _dynamic_inputs_note(module) -> Optional[str]:
    """Where a searched function has inputs of dynamic shape (MLIR from torch-mlir-import-onnx of a model
    with a symbolic batch: its ops stay generic onnx ops, which the search does not rewrite), a note that
    names them and says how to give static shapes; else None."""
    from taso_mlir.dialect.mlir import ir

    found = []
    for f in module.body.operations:
        op = f.operation
        if op.name != "func.func" or len(op.regions[0].blocks) == 0:
            continue
        names = []
        if "taso.input_names" in op.attributes:
            try:
                names = [ir.StringAttr(a).value for a in ir.ArrayAttr(op.attributes["taso.input_names"])]
            except (ValueError, TypeError):
                names = []
        for i, a in enumerate(op.regions[0].blocks[0].arguments):
            try:
                t = ir.ShapedType(a.type)
            except (ValueError, TypeError):
                continue
            if not t.has_rank:
                shape = "unranked"
            elif not t.has_static_shape:
                shape = "x".join("?" if t.is_dynamic_dim(k) else str(t.get_dim_size(k)) for k in range(t.rank))
            else:
                continue
            found.append((names[i] if i < len(names) else f"%arg{i}", shape))
    if not found:
        return None
    listed = ", ".join(f"'{n}' ({s})" for n, s in found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    return (f"graph input(s) {listed} have dynamic shapes: the ops on them stay generic onnx ops, which "
            f"taso-search does not rewrite; give static shapes on import: taso-opt model.onnx "
            f"--input-shape NAME=D0xD1x... --taso-search")


def _check_unregistered(module, allowed: bool) -> None:
    """Only onnx.* (and the importer's torch.*) may be unregistered unless the flag says otherwise."""
    from taso_mlir.dialect.errors import TasoError

    if allowed:
        return
    bad = _first_op(module, lambda op: op.name.split(".", 1)[0] not in ("onnx", "taso", "torch", "builtin", "func")
                    and not op.context.is_registered_operation(op.name))
    if bad is not None:
        raise TasoError(f"{bad.location}: unregistered operation '{bad.name}' (pass --allow-unregistered-dialect "
                        f"to allow it)")


def _first_op(module, pred):
    """The first op of the module, in walk order, for which ``pred(op)`` holds, or None. (An exception cannot
    cross MLIR's walk callback: the walk only finds the op, the caller acts on it.)"""
    from taso_mlir.dialect.mlir import ir

    found = []

    def visit(op):
        if pred(op):
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found[0] if found else None


def _write_text(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        from taso_mlir.dialect.onnx_export import write_atomic

        write_atomic(path, lambda f: f.write(text.encode("utf-8")), check=lambda _: _test_crash())


def _write_bytes(path: str, data: bytes) -> None:
    if path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        from taso_mlir.dialect.onnx_export import write_atomic

        write_atomic(path, lambda f: f.write(data), check=lambda _: _test_crash())


if __name__ == "__main__":
    sys.exit(main())
