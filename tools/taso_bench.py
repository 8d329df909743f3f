"""taso-bench: the TASO/TENSAT benchmark models through taso-mlir, measured side by side with the peers.

    taso-bench                                   # the full suite (benchmarks/suite.py) through taso-search,
                                                 # report in taso-bench-out/
    taso-bench --quick --out bench-quick         # tiny variants (the smoke test; latencies noise-dominated)
    taso-bench --optimizer identity              # the round trip alone (import, taso-dce, export): the baseline
    taso-bench --models bert-b1,nasrnn           # some models
    taso-bench --pipeline 'builtin.module(taso-dce,cse)'   # any pass pipeline as the optimizer
    taso-bench --list                            # the models and their configurations

The optimizer is taso-search by default (``builtin.module(taso-search,taso-dce)``, the pass's default target:
TASO_TARGET, else this machine's CPU, measured); ``--quick`` runs it with the analytic target unless
``--cost-model`` or TASO_TARGET names one, so that the smoke test times no ops. A latency ratio whose
interquartile range over the rounds spans 1.0 is reported as unresolved (``~1.0x (unresolved: IQR a-b)``),
not as a speedup.

The command line only: the runner (``benchmarks/runner.py``) says what is measured and how.
Errors are one line with a non-zero exit (1; 2 for internal errors, ``TASO_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Optional

from taso_mlir.benchmarks.runner import (COST_MODELS, COST_UNAVAILABLE, DEFAULT_OPTIMIZER, DEFAULT_OUT,
                                         IDENTITY_PIPELINE, OPTIMIZERS, QUICK_COST_MODEL_NOTE, check_peers,
                                         load_baseline, quick_cost_model, resolve_optimizer, run)

from . import cli

__all__ = ["main", "IDENTITY_PIPELINE", "COST_UNAVAILABLE"]


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        from taso_mlir.dialect.errors import TasoError

        raise TasoError(f"{message} (see taso-bench --help)")


def _build_parser() -> argparse.ArgumentParser:
    ap = _ArgumentParser(
        prog="taso-bench", description="benchmark taso-mlir on TASO's and TENSAT's models against the peers",
        epilog="optimizers:\n" + "\n".join(f"  {k:<12} {v}" for k, v in OPTIMIZERS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    ap.add_argument("--quick", action="store_true",
                    help="tiny variants of the models (the smoke test, under a minute; its 0.5 s latency budget is "
                         "noise-dominated, so many ratios come out unresolved); the search's target is analytic "
                         "unless --cost-model or TASO_TARGET names one")
    ap.add_argument("--models", action="append", default=[], metavar="A,B",
                    help="models to run (comma-separated, repeatable; default: all; see --list)")
    ap.add_argument("--list", action="store_true", help="list the models and their configurations, then exit")
    ap.add_argument("--strategies", action="store_true",
                    help="compare taso-search's strategies instead: backtracking vs eqsat per model (cost, search "
                         "time, memory, e-graph size, the extraction's bound), with --cost-model as the target "
                         "(default analytic:t4); a markdown table on stdout (benchmarks/strategies.py)")
    ap.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                    help=f"folder for report.md, results.json and the charts (default: {DEFAULT_OUT})")
    ap.add_argument("--optimizer", default=DEFAULT_OPTIMIZER, choices=sorted(OPTIMIZERS),
                    help=f"optimizer preset (default: {DEFAULT_OPTIMIZER}, the search; identity: the round trip "
                         "alone, the baseline)")
    ap.add_argument("--pipeline", metavar="PIPELINE",
                    help="the optimizer as a pass pipeline on the imported module, "
                         "'builtin.module(...)' (taso and upstream passes); overrides --optimizer")
    ap.add_argument("--cost-model", choices=COST_MODELS,
                    help="cost oracle for the search and for model costs (analytic[:<device>]: a roofline "
                         "estimate for a device profile, fitted to the device's measured table where one is "
                         "shipped, analytic:<device>:datasheet the hand-set one; cuda:<gpu>: per-op times "
                         "measured on that GPU, read from its shipped table; cuda: per-op times measured on this "
                         "machine's GPU, cached per device; cpu: measured in onnxruntime on "
                         "this machine; default: the pass's, TASO_TARGET else this machine measured; --quick: "
                         "analytic)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where latency is measured: cpu (onnxruntime on this machine, the default) or cuda "
                         "(the original and optimized models on this machine's NVIDIA GPU with the project's "
                         "cuDNN/cuBLAS/NVRTC executor and a PyTorch one, interleaved rounds; "
                         "benchmarks/gpu/prepare.py, speedup.py and report.py, docs/gpu-speedups.md)")
    ap.add_argument("--rounds", type=int, default=None, metavar="N",
                    help="latency: at most N interleaved rounds per model (default 51; quick: 5)")
    ap.add_argument("--min-rounds", type=int, default=None, metavar="N",
                    help="latency: at least N rounds, even past the time budget (default 15; quick: 3)")
    ap.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                    help="latency: stop adding rounds after this long per model (default 45; quick: 0.5)")
    ap.add_argument("--epochs", type=int, default=None, metavar="N",
                    help="latency: spread the rounds over N sets of freshly created sessions (default 5; quick: 2)")
    ap.add_argument("--threads", type=int, default=1, metavar="N",
                    help="onnxruntime intra-op threads (default 1: ratios that a shared machine does not skew; "
                         "0: onnxruntime's choice, one per core)")
    ap.add_argument("--tolerance", type=float, default=1e-4, metavar="REL",
                    help="largest accepted |optimized - original| relative to the output scale (default 1e-4)")
    ap.add_argument("--baseline", metavar="RESULTS_JSON",
                    help="a previous run's results.json: the report compares this run's ratios with it")
    ap.add_argument("--keep-models", action="store_true",
                    help="also write each model's original, optimized and onnxslim ONNX files under DIR/models/")
    ap.add_argument("--in-process", action="store_true",
                    help="run the models in this process instead of one worker process each (debugging)")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    return cli.run("taso-bench", _main, argv)


def _settings(args) -> dict:
    from taso_mlir.dialect.errors import TasoError

    quick = args.quick
    s = {
        "rounds": args.rounds if args.rounds is not None else (5 if quick else 51),
        "min_rounds": args.min_rounds if args.min_rounds is not None else (3 if quick else 15),
        "budget_s": args.budget if args.budget is not None else (0.5 if quick else 45.0),
        "warmup": 1 if quick else 2,
        "epochs": args.epochs if args.epochs is not None else (2 if quick else 5),
        "min_sample_s": 0.001 if quick else 0.02,  # repeat fast models inside a sample to reach this
        "threads": args.threads,
        "tolerance": args.tolerance,
        "numeric_trials": 2,
    }
    if s["rounds"] < 1:
        raise TasoError("--rounds must be at least 1")
    if s["min_rounds"] < 1:
        raise TasoError("--min-rounds must be at least 1")
    if s["epochs"] < 1:
        raise TasoError("--epochs must be at least 1")
    s["min_rounds"] = min(s["min_rounds"], s["rounds"])
    if not (s["budget_s"] >= 0 and math.isfinite(s["budget_s"])):
        raise TasoError("--budget must be a non-negative number of seconds")
    if s["threads"] < 0:
        raise TasoError("--threads must be 0 (onnxruntime's choice) or more")
    if not (s["tolerance"] >= 0 and math.isfinite(s["tolerance"])):
        raise TasoError("--tolerance must be a non-negative number")
    return s


def _selected(args):
    from taso_mlir.benchmarks.suite import suite
    from taso_mlir.dialect.errors import TasoError

    models = suite(args.quick)
    if not args.models:
        return models
    by_name = {m.name: m for m in models}
    chosen = []
    for group in args.models:
        for n in group.split(","):
            n = n.strip()
            if not n:
                continue
            if n not in by_name:
                raise TasoError(f"unknown model '{n}' (models: {', '.join(by_name)})")
            if by_name[n] not in chosen:
                chosen.append(by_name[n])
    if not chosen:
        raise TasoError("--models names no model")
    return chosen


def _prepare_out(path: str) -> str:
    from taso_mlir.dialect.errors import TasoError

    if os.path.exists(path) and not os.path.isdir(path):
        raise TasoError(f"--out {path}: exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise TasoError(f"--out {path}: cannot create the directory ({e.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise TasoError(f"--out {path}: directory is not writable")
    return path


def _main(argv: list[str]) -> int:
    args = _build_parser().parse_args(argv)
    models = _selected(args)
    if args.list:
        for m in models:
            sys.stdout.write(f"{m.name:<12} {m.title:<13} {m.config}\n")
        return 0
    if args.device == "cuda":
        return _cuda(args, models)
    if args.strategies:
        from taso_mlir.benchmarks import strategies

        return strategies.main((["--quick"] if args.quick else []) + ["--models", ",".join(m.name for m in models),
                                "--target", args.cost_model or "analytic:t4"])
    settings = _settings(args)
    baseline = load_baseline(args.baseline) if args.baseline else None
    cost_model = quick_cost_model(args.quick, args.optimizer, args.pipeline, args.cost_model)
    opt_name, pipeline = resolve_optimizer(args.optimizer, args.pipeline, cost_model)
    check_peers()
    out = _prepare_out(args.out)
    cfg = {"quick": args.quick, "pipeline": pipeline, "cost_model": args.cost_model, "settings": settings,
           "cost_model_default": QUICK_COST_MODEL_NOTE if cost_model != args.cost_model else None,
           "out": out, "keep_dir": os.path.join(os.path.abspath(out), "models") if args.keep_models else None}
    return run(models, cfg, opt_name, argv, baseline, args.baseline or "", args.in_process)


def _cuda(args, models) -> int:
    """``--device cuda``: the suite prepared here (optimized per target, predicted costs, a manifest), then
    timed on this machine's GPU, then the report; each step a script of benchmarks/gpu/ in its own process
    (the GPU side needs no MLIR bindings: the prepared run of docs/gpu-speedups.md runs it alone)."""
    import subprocess

    from taso_mlir import benchmarks
    from taso_mlir.dialect.errors import TasoError

    if args.strategies or args.pipeline or args.optimizer != DEFAULT_OPTIMIZER or args.baseline:
        raise TasoError("--device cuda times taso-search's results per target: it takes --models, --quick, "
                        "--cost-model (a cuda:<gpu> table adds its search) and --out, not --strategies, "
                        "--pipeline, --optimizer or --baseline")
    gpu = os.path.join(os.path.dirname(os.path.abspath(benchmarks.__file__)), "gpu")
    out = os.path.abspath(_prepare_out(args.out))
    which = "quick" if args.quick else "full"
    prep = [sys.executable, os.path.join(gpu, "prepare.py"), "--out", os.path.join(out, "gpu-models"),
            "--sets", which, "--models", ",".join(m.name for m in models)]
    if args.cost_model and args.cost_model.startswith("cuda:"):
        prep += ["--targets", f"analytic:t4,analytic:h100,{args.cost_model}"]
    steps = [
        ("prepare", prep),
        ("speedup", [sys.executable, os.path.join(gpu, "speedup.py"), "--manifest",
                     os.path.join(out, "gpu-models", which, "manifest.json"), "--out",
                     os.path.join(out, "speedup.json"), "--markdown", os.path.join(out, "report-gpu.md")]),
        ("report", [sys.executable, os.path.join(gpu, "report.py"), os.path.join(out, "speedup.json"),
                    "--md", os.path.join(out, "report-gpu.md")]),
    ]
    for name, cmd in steps:
        r = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
            raise TasoError(f"--device cuda: {name} failed (exit {r.returncode}): "
                            f"{lines[-1] if lines else 'no message'}")
        if r.stderr:
            sys.stderr.write(r.stderr)
    sys.stdout.write(f"taso-bench: GPU speedups in {os.path.join(out, 'report-gpu.md')}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
