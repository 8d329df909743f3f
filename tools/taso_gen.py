"""taso-gen: enumerate small graphs, find equivalent pairs, prune them, write the rules file.

    taso-gen --max-ops 3 --jobs 2 -o rules.jsonl
    taso-verify rules.jsonl --in-place            # then prove them
    taso-gen --family base-n4 --derive-from rules.jsonl -o rules-n4.jsonl
    taso-gen --family conv-bias -o rules-conv-bias.jsonl
    taso-gen --family base-n4 --cluster ray --checkpoint ck/ -o rules-n4.jsonl   # on Ray, resumable
    taso-gen --max-ops 5 --ops matmul,ewadd,transpose --cluster ray --verify -o r5.jsonl   # and prove on Ray
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from . import cli
from ..generator.enumerate import ENUMERATED_OPS, FAMILIES

#: TASO's published stage counts (SOSP'19, N = 4), printed beside ours for scale
TASO_COUNTS = {"candidates": 28744, "after_renaming": 17346, "after_common_subgraph": 743}

STAGES = [
    ("graphs", "graphs enumerated"),
    ("candidates", "candidate pairs (equal fingerprints, outputs matched)"),
    ("after_common_subgraph", "after common-subgraph pruning"),
    ("after_transitivity", "after transitivity pruning"),
    ("after_renaming", "after input-renaming pruning"),
    ("after_float_test", "after the floating-point test"),
    ("beyond_base", "with a side beyond the base library's N"),
    ("after_derivability", "not derivable from the derive-from library"),
    ("usable", "usable rules"),
]


def summary_table(counts: dict, times: dict) -> str:
    w = max(len(s[1]) for s in STAGES)
    lines = [f"{'stage':<{w}}  {'count':>9}  {'TASO (N=4)':>10}"]
    for key, label in STAGES:
        if key in counts:
            taso = TASO_COUNTS.get(key)
            lines.append(f"{label:<{w}}  {counts[key]:>9}  {taso if taso is not None else '':>10}")
    lines.append("times: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    return cli.run("taso-gen", _main, argv)


def _main(argv) -> int:
    from ..dialect.errors import TasoError
    ap = argparse.ArgumentParser(prog="taso-gen", description=__doc__.strip().splitlines()[0])
    ap.add_argument("--family", default="base", choices=sorted(FAMILIES),
                    help="the configuration: base (TASO's operators and inputs, N=3: the shipped rules.jsonl), "
                         "base-n4 (the same at N=4, as in TASO's paper, less what base has or derives: "
                         "rules-n4.jsonl), conv-bias (convolutions with a bias operand: rules-conv-bias.jsonl) or "
                         "matmul-bias (matmuls with a bias operand: rules-matmul-bias.jsonl)")
    ap.add_argument("--max-ops", type=int, default=None,
                    help="most operators per graph (default: the family's: 3 for base, 4 for base-n4, "
                         "3 for conv-bias and matmul-bias)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    ap.add_argument("-o", "--output", required=True, help="rules file to write (JSON Lines)")
    ap.add_argument("--seed", type=int, default=None, help="random seed for the fingerprint inputs")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--verify", action="store_true",
                    help="then prove the rules written (taso-verify OUTPUT --in-place, with the same --jobs and "
                         "--cluster: on Ray, the proofs and the shape fuzzing are Ray tasks too)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="with --verify: seconds per rule for Z3 (taso-verify's --timeout; default 2)")
    ap.add_argument("--ops", metavar="OP[,OP...]", default=None,
                    help="enumerate only these operators (e.g. matmul,ewadd,transpose,concat,split; default: the "
                         "family's)")
    ap.add_argument("--derive-from", metavar="RULES", default=None,
                    help="drop candidates that the rules of these rules files (comma-separated; 'shipped': "
                         "the packaged libraries; 'none': nothing) derive by equality saturation, with concat "
                         "associativity (default for base-n4: the packaged base library, rules.jsonl)")
    ap.add_argument("--id-prefix", metavar="P", default=None,
                    help="the rule ids' prefix (default: the family's: R, F, B, M); ids must differ from those of "
                         "the libraries a search loads beside this one")
    dist = ap.add_argument_group("distributed generation (Ray: pip install 'taso-mlir[distributed]')")
    dist.add_argument("--cluster", metavar="ray|ray://HOST:PORT", default=None,
                      help="run the stages as Ray tasks: 'ray' starts a local Ray runtime of --jobs workers, "
                           "ray://HOST:PORT uses a running cluster (its Ray Client port; every node needs "
                           "taso-mlir[distributed] of the same version); the rules file is the same byte for byte "
                           "for any number of workers and shards (its header has no times or job counts)")
    dist.add_argument("--shards", type=int, default=None,
                      help="enumeration shards, split by each graph's first op (default 32)")
    dist.add_argument("--buckets", type=int, default=None,
                      help="fingerprint-range buckets the fingerprint tables and candidate pairing are split into "
                           "(default 16)")
    dist.add_argument("--checkpoint", metavar="DIR", default=None,
                      help="keep every task's result in DIR; a run interrupted and started again with the same "
                           "settings resumes from what is there (default: a temporary folder)")
    dist.add_argument("--task-timeout", type=float, default=None, metavar="S",
                      help="cancel a task that runs longer than S seconds and submit it again (3 times at most)")
    args = ap.parse_args(argv)
    if args.cluster is None and any(v is not None for v in (args.shards, args.buckets, args.checkpoint,
                                                            args.task_timeout)):
        raise TasoError("--shards, --buckets, --checkpoint and --task-timeout need --cluster")
    if args.cluster is not None and not (args.cluster == "ray" or args.cluster.startswith("ray://")):
        raise TasoError(f"--cluster {args.cluster}: give 'ray' (a local Ray runtime) or ray://HOST:PORT")
    if args.task_timeout is not None and args.task_timeout <= 0:
        raise TasoError("--task-timeout must be positive")
    if args.timeout is not None and not args.verify:
        raise TasoError("--timeout needs --verify")
    if args.timeout is not None and args.timeout <= 0:
        raise TasoError("--timeout must be positive")
    family = FAMILIES[args.family]
    if args.max_ops is None:
        args.max_ops = family.max_ops
    if not 1 <= args.max_ops <= 6:
        raise TasoError("--max-ops must be between 1 and 6")
    if args.jobs < 1:
        raise TasoError("--jobs must be at least 1")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        raise TasoError(f"{args.output}: the folder does not exist")
    from ..generator import library, pipeline
    derive_from = args.derive_from
    if derive_from is None and args.family in library.DERIVE_FROM:
        derive_from = str(library.default_path(library.DERIVE_FROM[args.family]))
    if derive_from == "none":
        derive_from = None
    if derive_from == "shipped":
        derive_from = ",".join(str(p) for p in library.shipped_paths())
    if derive_from:
        from ..passes.search import rulebook
        try:  # before the enumeration: a bad file is a one-line error now, not after minutes
            rulebook.load(derive_from)
        except library.LibraryError as e:
            raise TasoError(str(e)) from None
    cfg = dataclasses.replace(family, max_ops=args.max_ops,
                              **({} if args.seed is None else {"seed": args.seed}))
    if args.id_prefix is not None:
        if not args.id_prefix.isalnum() or not args.id_prefix.isascii():
            raise TasoError(f"--id-prefix {args.id_prefix!r}: give letters and digits")
        cfg = dataclasses.replace(cfg, id_prefix=args.id_prefix)
    if args.ops is not None:
        ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
        bad = [o for o in ops if o not in ENUMERATED_OPS or family.ops and o not in family.ops]
        if not ops or bad:
            raise TasoError("--ops: " + (f"not an operator of the family: {', '.join(bad)} (choose from "
                                         f"{', '.join(family.ops or ENUMERATED_OPS)})" if bad else "give operators"))
        cfg = dataclasses.replace(cfg, ops=ops)
    if args.cluster is not None:
        from ..generator import distributed
        try:  # one runtime for the generation and, with --verify, the proofs
            ray, owned = distributed.connect(None if args.cluster == "ray" else args.cluster, args.jobs)
        except distributed.DistributedError as e:
            raise TasoError(str(e)) from None
        try:
            _run_ray(args, cfg, derive_from)
            return _verify(args)
        finally:
            if owned:
                ray.shutdown()
    total = pipeline.base_op_count(cfg)
    bar = None
    if not args.no_progress:
        from tqdm import tqdm
        bar = tqdm(total=total, desc=f"enumerating (N={args.max_ops}, {args.jobs} jobs)", unit="root op",
                   file=sys.stderr)
    log = (bar.write if bar else lambda m: print(m, file=sys.stderr))
    bars = [bar]

    def derive_progress(n):
        if bar is None:
            return None
        bar.close()
        from tqdm import tqdm
        bars.append(tqdm(total=n, desc="derivability (e-graph)", unit="rule", file=sys.stderr))
        return bars[-1].update
    header, records = pipeline.generate(cfg, jobs=args.jobs, progress=bar.update if bar else None, log=log,
                                        derive_from=derive_from, derive_progress=derive_progress)
    for b in bars:
        if b is not None:
            b.close()
    library.write(args.output, header, records)
    print(summary_table(header["counts"], header["times_s"]))
    print(f"wrote {len(records)} rules to {args.output}" + ("" if args.verify else " (unverified: run taso-verify)"))
    return _verify(args)


def _verify(args) -> int:
    """--verify: taso-verify on the file just written, in place, with the run's --jobs and --cluster (on
    the Ray runtime the generation ran on)."""
    if not args.verify:
        return 0
    from . import taso_verify
    argv = [args.output, "--in-place", "--jobs", str(args.jobs), "--timeout", str(args.timeout or 2.0)]
    argv += ["--cluster", args.cluster] if args.cluster is not None else []
    argv += ["--no-progress"] if args.no_progress else []
    return taso_verify.main(argv)


def _run_ray(args, cfg, derive_from) -> int:
    """taso-gen --cluster: the stages as Ray tasks (``generator.distributed``)."""
    from ..dialect.errors import TasoError
    from ..generator import distributed, library
    if args.shards is not None and args.shards < 1 or args.buckets is not None and args.buckets < 1:
        raise TasoError("--shards and --buckets must be at least 1")
    if args.checkpoint and os.path.exists(args.checkpoint) and not os.path.isdir(args.checkpoint):
        raise TasoError(f"--checkpoint {args.checkpoint}: not a folder")
    from tqdm import tqdm
    try:
        header, records, report = distributed.generate(
            cfg, cluster=None if args.cluster == "ray" else args.cluster, cpus=args.jobs,
            shards=args.shards or distributed.DEFAULT_SHARDS, buckets=args.buckets or distributed.DEFAULT_BUCKETS,
            checkpoint=args.checkpoint, task_timeout=args.task_timeout, derive_from=derive_from,
            progress=not args.no_progress, log=lambda m: tqdm.write(m, file=sys.stderr))
    except distributed.DistributedError as e:
        raise TasoError(str(e)) from None
    library.write(args.output, header, records)
    print(summary_table(header["counts"], report["times_s"]))
    en = report["enumerate"]
    print(f"cluster: {report['workers']} workers, {report['shards']} shards, {report['buckets']} buckets; "
          f"{report['tasks_resumed']} tasks resumed from the checkpoint, {report['tasks_timed_out']} timed out, "
          f"{report['shards_rebuilt_from_table']} shards rebuilt from their op tables; "
          f"enumeration {en['graphs_per_worker_second'] or 0} graphs per worker-second "
          f"(slowest shard {en['shard_seconds_max']:.1f} s); worker peak RSS {report['worker_max_rss_mb']} MB")
    print(f"wrote {len(records)} rules to {args.output}" + ("" if args.verify else " (unverified: run taso-verify)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
