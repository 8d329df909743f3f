"""Prepare the GPU speedup run on the CPU (issue 25): the suite's models, optimized, weights stripped, with the
costs the project's cost models predict for them, under ``benchmarks/gpu/models/``.

This half needs taso_mlir (the MLIR bindings); the GPU machine has none, so everything that needs them is done
here and committed: per suite model (``benchmarks/suite.py``) the original ONNX graph and the graph taso-search
exports for each target (``analytic:t4``, ``analytic:h100``, and ``cuda:<gpu>`` for every measured table
shipped in ``passes/cost/tables``), the optimized graph checked against the original in onnxruntime with the
real weights, and the predicted whole-graph cost of every file (the sum of its ops' costs, the file
imported as the search sees a model) under each of those cost models, with the op signature keys and their
counts so that a calibration table measured in the same GPU session can price the files there too.

Weights: every float initializer of 1,024 elements or more is stripped (its data cleared) and its
``doc_string`` records its statistics (``execute.WEIGHTS_KEY``: mean, standard deviation, min, max), from which
``execute.fill_weights`` draws values on the GPU machine; the full suite is 2 GB of weights and 3 MB without.
Identical optimized graphs (the t4 and h100 searches often agree) are written once; the manifest says which
variants share a file.

    python benchmarks/gpu/prepare.py                           # the full suite and the quick set (~3 minutes)
    python benchmarks/gpu/prepare.py --sets quick --models nasrnn,squeezenet
"""

from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import execute as E  # noqa: E402

MANIFEST_FORMAT = "taso-mlir gpu speedup manifest 1"
DEFAULT_DIR = os.path.join(HERE, "models")
TARGETS = ("analytic:t4", "analytic:h100")
#: initializers at least this many elements are stripped
STRIP_MIN = 1024


def measured_targets() -> list[str]:
    """``cuda:<gpu>`` for every measured table shipped (none until a calibration is committed)."""
    try:
        from taso_mlir.passes.cost import cuda_table

        return [f"cuda:{os.path.splitext(os.path.basename(p))[0]}" for p in cuda_table.shipped_tables()]
    except Exception:
        return []


def optimize(model, where: str, target: str):
    """taso-search (then taso-dce) with ``target``, latency check off; (exported ONNX, the search's report)."""
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_export import export_onnx
    from taso_mlir.dialect.onnx_import import import_onnx
    from taso_mlir.passes.registry import build_pass_manager, run_pass_manager
    from taso_mlir.passes.search import taso_search

    ctx = make_context()
    module = import_onnx(model, ctx, where=where)
    pm = build_pass_manager(f"builtin.module(taso-search{{target={target} latency-check=false}},taso-dce)", ctx)
    taso_search.LAST_REPORT = None
    t = time.perf_counter()
    run_pass_manager(pm, module.operation)
    secs = time.perf_counter() - t
    rep = taso_search.LAST_REPORT or {}
    return export_onnx(module), {"target": target, "search_s": round(secs, 3),
                                 "cost_before_ms": rep.get("cost_before_ms"), "cost_after_ms": rep.get("cost_after_ms"),
                                 "applied": rep.get("applied", {}), "estimated_costs": rep.get("estimated_costs", 0)}


def predicted(model, where: str, cost_models: list[str]) -> dict:
    """The file's predicted whole-graph cost under each cost model (ms: the sum over its ops, as the search
    prices a function as written), and its op signatures: [[key, kind, count, {model: ms}], ...]."""
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_import import import_onnx
    from taso_mlir.dialect.ops import function_bodies
    from taso_mlir.passes.cost.oracle import OpSig, get_cost_model
    from taso_mlir.passes.search import tgraph as T

    ctx = make_context()
    module = import_onnx(model, ctx, where=where)
    with module.context:
        funcs = function_bodies(module.operation)
        out = {"total_ms": {}, "ops": []}
        per_key: dict = {}
        for spec in cost_models:
            cm = get_cost_model(spec)
            total = 0.0
            try:
                for f in funcs:
                    g, _ = T.from_function(f, T.Builder(cm, split_trees=False))
                    total += g.cost
                    for nid, n in g.nodes.items():
                        if n.kind == "arg" or n.weight:
                            continue
                        ins = tuple(g.nodes[v[0]].shapes[v[1]] or () for v in n.operands)
                        sig = OpSig(n.kind.removeprefix("other:"), n.attrs, ins, tuple(s or () for s in n.shapes),
                                    n.dtype, n.weight, tuple(g.nodes[v[0]].weight for v in n.operands))
                        k = sig.key()
                        e = per_key.setdefault(k, {"kind": sig.kind, "count": 0, "ms": {}})
                        if spec == cost_models[0]:
                            e["count"] += 1
                        e["ms"][spec] = cm.cost(sig)
            finally:
                cm.close()
            out["total_ms"][spec] = total
            if getattr(cm, "estimated", 0):
                out.setdefault("estimated", {})[spec] = cm.estimated
        out["ops"] = [[k, e["kind"], e["count"], e["ms"]] for k, e in sorted(per_key.items())]
    return out


def strip_weights(model, min_elems: int = STRIP_MIN) -> dict:
    """Clear the data of every float initializer of at least ``min_elems`` elements (in place), recording its
    statistics in its doc_string; {stripped, kept, bytes_stripped}."""
    from onnx import TensorProto, numpy_helper

    n, kept, nbytes = 0, 0, 0
    for t in model.graph.initializer:
        if t.data_type != TensorProto.FLOAT or int(np.prod(t.dims, dtype=np.int64)) < min_elems:
            kept += 1
            continue
        a = numpy_helper.to_array(t).astype(np.float64)
        st = {"mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()), "max": float(a.max())}
        nbytes += a.size * 4
        dims, name = list(t.dims), t.name
        t.Clear()
        t.name, t.data_type = name, TensorProto.FLOAT
        t.dims.extend(dims)
        t.doc_string = f"{E.WEIGHTS_KEY} {json.dumps(st)}"
        n += 1
    return {"stripped": n, "kept": kept, "bytes_stripped": nbytes}


def graph_digest(model) -> str:
    """A digest of the graph's structure and constants as stored (names apart from values' ops are part of
    it): equal digests mean the same file."""
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()[:16]


def prepare_model(name: str, build, out_dir: str, targets: list[str], cost_models: list[str], progress) -> dict:
    import onnx

    from taso_mlir.dialect.onnx_export import save_onnx

    t0 = time.perf_counter()
    model = build()
    feeds = E.random_feeds(model, seed=1)
    ref = E.ort_outputs(model, feeds)
    entry = {"name": name, "variants": {}, "files": {}}
    files: dict = {}  # digest -> file name
    variants = [("original", model, None)]
    for target in targets:
        opt, rep = optimize(model, name, target)
        got = E.ort_outputs(opt, feeds)
        errs = [E.rel_error(got[k], v) for k, v in ref.items()]
        rep["rel_err_vs_original"] = max(errs) if errs else None
        variants.append((f"opt-{target.replace(':', '-')}", opt, rep))
    for vname, m, rep in variants:
        pred = predicted(m, f"{name}:{vname}", cost_models)
        m2 = onnx.ModelProto()
        m2.CopyFrom(m)
        strip = strip_weights(m2)
        dig = graph_digest(m2)
        if dig not in files:
            fname = f"{name}.{vname}.onnx"
            save_onnx(m2, os.path.join(out_dir, fname))
            files[dig] = fname
            entry["files"][fname] = {"digest": dig, "bytes": os.path.getsize(os.path.join(out_dir, fname)),
                                     "nodes": len(m.graph.node),
                                     "op_types": dict(collections.Counter(n.op_type for n in m.graph.node)
                                                      .most_common()),
                                     "predicted": pred, "weights": strip}
        entry["variants"][vname] = {"file": files[dig], "search": rep}
    entry["prepare_s"] = round(time.perf_counter() - t0, 2)
    progress(f"{name}: " + ", ".join(f"{v}: {e['file']} ({entry['files'][e['file']]['predicted']['total_ms'].get('analytic:h100', 0):.4g} ms h100)"
                                     for v, e in entry["variants"].items()) + f"; {entry['prepare_s']} s")
    return entry


def _git_commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="prepare the GPU speedup run: optimized suite models, weights "
                                             "stripped, predicted costs, a manifest")
    ap.add_argument("--out", default=DEFAULT_DIR, help="the folder (default: benchmarks/gpu/models)")
    ap.add_argument("--sets", default="full,quick", help="full, quick or both (default)")
    ap.add_argument("--models", default="", help="comma-separated suite models (default: all)")
    ap.add_argument("--targets", default="", help="the searches' targets (default: analytic:t4, analytic:h100 and "
                                                  "cuda:<gpu> for every shipped table)")
    a = ap.parse_args(argv)
    from taso_mlir.benchmarks.suite import model_names, suite
    from taso_mlir.dialect.errors import TasoError, one_line

    names = [n for n in a.models.split(",") if n] or model_names()
    bad = [n for n in names if n not in model_names()]
    if bad:
        print(f"prepare: error: unknown model(s) {', '.join(bad)} (models: {', '.join(model_names())})",
              file=sys.stderr)
        return 2
    targets = [t for t in a.targets.split(",") if t] or list(TARGETS) + measured_targets()
    cost_models = list(dict.fromkeys(["analytic:h100", "analytic:t4"] + [t for t in targets if t.startswith("cuda:")]))
    sets = [s for s in a.sets.split(",") if s]
    if not set(sets) <= {"full", "quick"}:
        print("prepare: error: --sets takes full, quick or both", file=sys.stderr)
        return 2

    def progress(msg):
        print(f"prepare: {msg}", file=sys.stderr, flush=True)
    for s in sets:
        d = os.path.join(a.out, s)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f.endswith(".onnx") and (not a.models or f.split(".")[0] in names):
                os.remove(os.path.join(d, f))
        man_path = os.path.join(d, "manifest.json")
        old = {}
        if a.models and os.path.exists(man_path):
            with open(man_path, encoding="utf-8") as f:
                old = {m["name"]: m for m in json.load(f).get("models", [])}
        models = []
        for m in suite(s == "quick"):
            if m.name not in names:
                if m.name in old:
                    models.append(old[m.name])
                continue
            try:
                e = prepare_model(m.name, m.build, d, targets, cost_models, progress)
            except TasoError as ex:
                progress(f"{m.name}: error: {one_line(ex, 200)}")
                e = {"name": m.name, "error": one_line(ex, 300)}
            e.update(title=m.title, config=m.config)
            models.append(e)
        man = {"format": MANIFEST_FORMAT, "set": s, "commit": _git_commit(),
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "targets": targets, "cost_models": cost_models,
               "weights": f"float initializers of {STRIP_MIN} elements or more stripped; drawn on the GPU machine "
                          "from their recorded mean, deviation and range (execute.fill_weights, seed 0)",
               "models": models}
        with open(man_path, "w", encoding="utf-8") as f:
            json.dump(man, f, indent=1)
            f.write("\n")
        total = sum(x["bytes"] for mm in models for x in mm.get("files", {}).values())
        progress(f"{s}: {len(models)} models, {sum(len(mm.get('files', {})) for mm in models)} files, "
                 f"{total / 1e6:.1f} MB -> {man_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
