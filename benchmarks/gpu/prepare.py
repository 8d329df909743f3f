"""Prepare the GPU speedup run on the CPU (issue 25): the suite's models, optimized, weights stripped, with the
costs the project's cost models predict for them, under ``benchmarks/gpu/models/``.

This half needs taso_mlir (the MLIR bindings); the GPU machine has none, so everything that needs them is done
here and committed: per suite model (``benchmarks/suite.py``) the original ONNX graph and the graph taso-search
exports for each target (``analytic:t4``, ``analytic:h100``, then ``cuda:<gpu>`` for every measured table
shipped in ``passes/cost/tables``: ``cuda:h200`` today, ``cuda:h100`` as soon as ``h100.json`` is there), the
optimized graph checked against the original in onnxruntime with the real weights, and the predicted
whole-graph cost of every file under each of those cost models: the sum of its kernels' costs, the file priced
as the project's executor runs it (``predicted``: a Relu that ``execute.plan_graph`` fuses into its Conv or
biased Gemm priced with it as one conv2d or matmul with ``activation = "relu"``, as the search prices it; what
the executor folds on the host priced 0), with the kernels' signature keys and their counts so that a
calibration table measured in the same GPU session can price the files there too.

The analytic targets are the hand-set profiles (``analytic:<gpu>:datasheet``, ``SEARCH_SPECS``) whatever tables
are shipped: once ``h100.json`` exists, ``analytic:h100`` alone would name the roofline fitted to it, and the
column "analytic H100" would silently change meaning.

Weights: every float initializer of 1,024 elements or more is stripped (its data cleared) and its
``doc_string`` records its statistics (``execute.WEIGHTS_KEY``: mean, standard deviation, min, max), from which
``execute.fill_weights`` draws values on the GPU machine; the full suite is 2 GB of weights and 4 MB without.
Optimized graphs that are the same (the searches often agree) are written once: the same bytes, or the same
structure with other value and node names (``structure_digest``); the manifest says which variants share a
file and why (``same_graph_as``), and speedup.py times each file once.

    python benchmarks/gpu/prepare.py                           # the full suite and the quick set (~3 minutes)
    python benchmarks/gpu/prepare.py --sets quick --models nasrnn,squeezenet
    python benchmarks/gpu/prepare.py --reprice                 # the committed files priced again (no search)
"""

from __future__ import annotations

import argparse
import collections
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
#: the cost-model spec each analytic target names, whatever tables are shipped: the hand-set profiles (a shipped
#: ``<gpu>.json`` makes ``analytic:<gpu>`` the roofline fitted to it; these stay the datasheet ones)
SEARCH_SPECS = {"analytic:t4": "analytic:t4:datasheet", "analytic:h100": "analytic:h100:datasheet"}
#: initializers at least this many elements are stripped
STRIP_MIN = 1024
#: how ``predicted`` prices a file (the manifest's ``priced``)
PRICED = {"how": "each file as the project's executor runs it (execute.plan_graph): a Relu fused into the Conv or "
                 "biased Gemm before it priced as one conv2d/matmul with activation relu (and the Gemm's bias), "
                 "nodes folded on the host priced 0, every other op as imported"}


def measured_targets() -> list[str]:
    """``cuda:<gpu>`` for every measured table shipped in ``passes/cost/tables`` (or ``$TASO_CUDA_TABLES``),
    sorted: ``cuda:h200`` today, ``cuda:h100`` too once ``h100.json`` is committed."""
    try:
        from taso_mlir.passes.cost import cuda_table

        return [f"cuda:{os.path.splitext(os.path.basename(p))[0]}" for p in cuda_table.shipped_tables()]
    except Exception:
        return []


def default_targets() -> list[str]:
    """The analytic targets first, then every measured table's (the order of the manifest's variants and of the
    report's columns; speedup.py times the measured tables' graphs after the analytic ones)."""
    return list(TARGETS) + [t for t in measured_targets() if t not in TARGETS]


def spec(target: str) -> str:
    """The cost-model spec a target names here (``SEARCH_SPECS``; the target itself otherwise)."""
    return SEARCH_SPECS.get(target, target)


def variant_name(target: str) -> str:
    """``opt-analytic-t4``, ``opt-cuda-h200``, ...: the manifest's name for a target's optimized graph."""
    return f"opt-{target.replace(':', '-')}"


def optimize(model, where: str, target: str):
    """taso-search (then taso-dce) with ``target``, latency check off; (exported ONNX, the search's report)."""
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_export import export_onnx
    from taso_mlir.dialect.onnx_import import import_onnx
    from taso_mlir.passes.registry import build_pass_manager, run_pass_manager
    from taso_mlir.passes.search import taso_search

    ctx = make_context()
    module = import_onnx(model, ctx, where=where)
    pm = build_pass_manager(f"builtin.module(taso-search{{target={spec(target)} latency-check=false}},taso-dce)",
                            ctx)
    taso_search.LAST_REPORT = None
    t = time.perf_counter()
    run_pass_manager(pm, module.operation)
    secs = time.perf_counter() - t
    rep = taso_search.LAST_REPORT or {}
    return export_onnx(module), {"target": target, "spec": spec(target), "search_s": round(secs, 3),
                                 "cost_before_ms": rep.get("cost_before_ms"), "cost_after_ms": rep.get("cost_after_ms"),
                                 "applied": rep.get("applied", {}), "estimated_costs": rep.get("estimated_costs", 0)}


def round_trip(model, where: str):
    """``model`` imported into the taso dialect and exported again, no pass run: the shape arithmetic of an
    exporter (Shape, Gather, Concat, ... on static shapes) folded as the import folds it, every other op kept.
    The torch set's originals are these: the executor plans static graphs, and the optimized graphs went
    through the same import."""
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_export import export_onnx
    from taso_mlir.dialect.onnx_import import import_onnx

    return export_onnx(import_onnx(model, make_context(), where=where))


def fold_shape_arithmetic(model, most: int = 1024):
    """``model`` with its shape arithmetic folded into initializers: each Shape of a value of static shape, and
    each node whose inputs are all constant and whose outputs have at most ``most`` elements (Slice, Cast,
    ConstantOfShape, ... of shapes), computed by onnx's reference evaluator; weights and every op on a
    run-time value stay. What a runtime folds before it runs a model (the executor folds the same on the host)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.shape_inference.infer_shapes(model)
    g = m.graph
    opset = E.default_opset(m)
    static = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        d = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(x.HasField("dim_value") for x in d):
            static[vi.name] = [x.dim_value for x in d]
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    outputs = {o.name for o in g.output}
    keep, new_inits = [], []
    for nd in g.node:
        vals = None
        if nd.op_type == "Shape" and nd.input[0] in static:
            vals = [E.shape_value(nd, static[nd.input[0]])]
        elif all((not x) or x in consts for x in nd.input) and not any(o in outputs for o in nd.output):
            try:
                got = E.evaluate_node(nd, list(nd.input), consts, opset)
                vals = got if all(np.size(v) <= most for v in got) else None
            except E.Unsupported:
                vals = None  # (left as it is: the executor plans or folds it)
        if vals is None:
            keep.append(nd)
            continue
        for o, v in zip(nd.output, vals):
            consts[o] = v
            new_inits.append(numpy_helper.from_array(v, o))
    used = {x for nd in keep for x in nd.input} | outputs
    del g.node[:]
    g.node.extend(keep)
    inits = [t for t in list(g.initializer) + new_inits if t.name in used]
    del g.initializer[:]
    g.initializer.extend(inits)
    del g.value_info[:]
    return m


def torch_models() -> list:
    """The torch set: ``benchmarks/torch_models.py``'s models that are not big, as (name, build, title, config);
    ``build`` exports the model with PyTorch (random weights, a fixed seed) and folds its shape arithmetic
    (``round_trip``, then ``fold_shape_arithmetic`` for what the import keeps). Raises ``RuntimeError`` with the reason where torch is not installed."""
    import importlib.util
    import tempfile

    import onnx

    sys.path.insert(0, os.path.dirname(HERE))
    import torch_models as TM

    if importlib.util.find_spec("torch") is None:
        raise RuntimeError("the torch set needs PyTorch to export its models (pip install torch)")

    def builder(name):
        def build():
            with tempfile.TemporaryDirectory() as d:
                return fold_shape_arithmetic(round_trip(onnx.load(TM.export(name, os.path.join(d, f"{name}.onnx"))),
                                                        name))
        return build
    return [(i.name, builder(i.name), i.name, f"{i.kind}, exported by torch.onnx (opset {TM.OPSET})")
            for i in TM.MODELS.values() if not i.big]


class _NoCost:
    """A cost model that prices nothing (``predicted`` builds the graph once and prices its kernels after)."""

    def cost(self, sig) -> float:
        return 0.0


def _named(model):
    """``model``, or a copy whose nodes all have distinct names (an unnamed or repeated node gets a fresh one):
    the executor's plan names the nodes each kernel runs, and the import keeps each ONNX node's name as its
    ops' location, which is how ``predicted`` matches the two. Names change no cost."""
    import onnx

    names = collections.Counter(n.name for n in model.graph.node)
    if all(n and c == 1 for n, c in names.items()):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    k = 0
    for nd in m.graph.node:
        if not nd.name or names[nd.name] > 1:
            while f"taso_priced_{k}" in names:
                k += 1
            nd.name = f"taso_priced_{k}"
            names[nd.name] = 1
    return m


def as_run(model) -> dict:
    """How the project's executor runs ``model`` (its weights real or drawn): ``execute.plan_graph``, the very
    plan the GPU run times, so that the fusion and folding rules live in one place. {"steps": node name -> the
    Step (kernel) that runs it, "nodes": every node name, "kernels", "fused", "folded"}; a node without a step
    is folded on the host, a step of two nodes is a Relu fused into the Conv or biased Gemm before it. Where the
    executor cannot plan the model: {"error": why}."""
    try:
        gp = E.plan_graph(model)
    except (E.ExecError, E.Unsupported) as e:
        return {"error": str(e).splitlines()[0][:200]}
    return {"steps": {n: st for st in gp.steps for n in st.nodes}, "nodes": {n.name for n in model.graph.node},
            "kernels": len(gp.steps), "fused": gp.fused, "folded": gp.folded}


def _as_kernels(g, mlir_ops, run: dict) -> dict:
    """The imported graph's ops as the executor runs them (``run``: ``as_run``'s), matched by the ONNX node
    names the import keeps as the ops' locations: node id -> None where the op is no kernel of its own (its
    ONNX node folded on the host; a Relu fused into its producer; a biased Gemm's bias add, which the import
    writes as an add after the matmul and the executor runs as the matmul's epilogue), or (attrs, operands,
    operand shapes) where the op's kernel does more than the op as imported (the fused activation, the
    Gemm's bias: the signature the search prices for a conv2d or matmul with ``activation = "relu"`` and a
    bias); every other op is priced as imported."""
    from taso_mlir.dialect.ops import loc_name
    from taso_mlir.passes.search.tgraph import attrs_tuple

    steps, names = run["steps"], run["nodes"]
    by_node: dict = collections.defaultdict(list)  # ONNX node name -> its imported ops (not weights)
    for nid, op in enumerate(mlir_ops):
        n = g.nodes.get(nid)
        if op is None or n is None or n.kind == "arg" or n.weight:
            continue
        nm = loc_name(op.location)
        if nm in names:
            by_node[nm].append(nid)
    out: dict = {}
    for nm, nids in by_node.items():
        if nm not in steps:  # folded on the host
            out.update((nid, None) for nid in nids)
    for st in {id(st): st for st in steps.values()}.values():
        if st.plan.op not in ("conv2d", "matmul"):
            continue
        ks = [nid for nid in by_node.get(st.nodes[0], ()) if g.nodes[nid].kind == st.plan.op]
        if len(ks) != 1:
            continue
        k = ks[0]
        kn = g.nodes[k]
        attrs, operands = dict(kn.attrs), kn.operands
        shapes = [g.nodes[v[0]].shapes[v[1]] or () for v in operands]
        res = (k, 0)  # the value the kernel writes
        if st.op_type == "Gemm" and st.plan.p.get("bias") and len(operands) == 2:
            n_out = (kn.shapes[0] or (0,))[-1]
            for a in by_node.get(st.nodes[0], ()):
                an = g.nodes[a]
                if an.kind != "ewadd" or res not in an.operands or len(an.operands) != 2:
                    continue
                b = an.operands[1] if an.operands[0] == res else an.operands[0]
                if int(np.prod(g.nodes[b[0]].shapes[b[1]] or (0,), dtype=np.int64)) == n_out:
                    out[a] = None
                    operands, shapes, res = operands + (b,), shapes + [(n_out,)], (a, 0)
                    break
        if st.plan.p.get("act") == "relu" and len(st.nodes) > 1:
            for r in by_node.get(st.nodes[1], ()):
                if g.nodes[r].kind == "relu" and g.nodes[r].operands == (res,):
                    out[r] = None
                    attrs["activation"] = "relu"
        if operands != kn.operands or attrs != dict(kn.attrs):
            out[k] = (attrs_tuple(attrs), operands, tuple(tuple(s) for s in shapes))
    return out


def predicted(model, where: str, cost_models: list[str]) -> dict:
    """The file's predicted whole-graph cost under each cost model (ms), priced as the project's executor runs
    it (``as_run``, ``_as_kernels``): the sum over its kernels, each kernel the op signature the search prices
    for it (a Conv or biased Gemm with the Relu the executor fuses into it is one conv2d or matmul with
    ``activation = "relu"`` (and the Gemm's bias), as the search prices it; what the executor folds on the host
    costs nothing; every other op as imported, as taso-search reports a function as written, every split its
    own); and its kernels' signatures: [[key, kind, count, {model: ms}], ...], so that a calibration table
    prices the file the same way. ``as_run``: the executor's plan (kernels, fused activations, folded nodes)
    and the ops priced; ``error`` there (the executor cannot plan the file): every op priced as imported. The
    cost models are named as the targets are (``analytic:h100`` is priced by ``spec``: the hand-set
    profile)."""
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_import import import_onnx
    from taso_mlir.dialect.ops import function_bodies
    from taso_mlir.passes.cost.oracle import OpSig, get_cost_model
    from taso_mlir.passes.search import tgraph as T

    model = _named(model)
    run = as_run(model)
    ctx = make_context()
    module = import_onnx(model, ctx, where=where)
    sigs = []  # the kernels' signatures, one per kernel
    with module.context:
        for f in function_bodies(module.operation):
            g, mlir_ops = T.from_function(f, T.Builder(_NoCost(), split_trees=False))
            ker = _as_kernels(g, mlir_ops, run) if "steps" in run else {}
            for nid, n in g.nodes.items():
                if n.kind == "arg" or n.weight or (nid in ker and ker[nid] is None):
                    continue
                ins = ker[nid][1] if nid in ker else n.operands
                attrs = ker[nid][0] if nid in ker else n.attrs
                shapes = ker[nid][2] if nid in ker else tuple(g.nodes[v[0]].shapes[v[1]] or () for v in ins)
                sigs.append(OpSig(n.kind.removeprefix("other:"), attrs, shapes, tuple(s or () for s in n.shapes),
                                  n.dtype, n.weight, tuple(g.nodes[v[0]].weight for v in ins)))
    per_key: dict = {}
    for sig in sigs:
        e = per_key.setdefault(sig.key(), {"kind": sig.kind, "count": 0, "sig": sig, "ms": {}})
        e["count"] += 1
    out: dict = {"total_ms": {}}
    for name in cost_models:
        cm = get_cost_model(spec(name))
        try:
            total = 0.0
            for e in per_key.values():
                e["ms"][name] = cm.cost(e["sig"])
                total += e["count"] * e["ms"][name]
        finally:
            cm.close()
        out["total_ms"][name] = total
        if getattr(cm, "estimated", 0):
            out.setdefault("estimated", {})[name] = cm.estimated
    out["as_run"] = ({k: run[k] for k in ("kernels", "fused", "folded")} if "steps" in run
                     else {"error": run["error"]})
    out["as_run"]["priced_ops"] = len(sigs)
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


def structure_digest(model) -> str:
    """A digest of the graph as a computation, apart from the names of its nodes, intermediate values and
    initializers: each value is hashed from the op that makes it (type, domain, attributes, output index) and
    its operands' hashes, an initializer from its type, dims, data and doc_string (a stripped one: its
    statistics), a graph input from its name and type; the digest covers the graph outputs (names and hashes),
    the multiset of node hashes (dead nodes too) and of initializer hashes, and the opsets. Two files with the
    same digest run the same kernels on the same shapes in an order the data allows: timing both would measure
    one graph twice."""
    from onnx import TensorProto

    def h(*parts) -> str:
        d = hashlib.sha256()
        for p in parts:
            d.update(p if isinstance(p, bytes) else str(p).encode())
            d.update(b"\0")
        return d.hexdigest()

    g = model.graph
    val: dict = {}
    for i in g.input:
        val[i.name] = h("input", i.name, i.type.SerializeToString(deterministic=True))
    inits = []
    for t in g.initializer:
        t2 = TensorProto()
        t2.CopyFrom(t)
        t2.name = ""
        val[t.name] = h("init", t2.SerializeToString(deterministic=True))
        inits.append(val[t.name])
    nodes = []
    for n in g.node:  # ONNX stores nodes in a topological order
        attrs = sorted(a.SerializeToString(deterministic=True) for a in n.attribute)
        ins = [val.get(x, h("unbound", x)) if x else "" for x in n.input]
        base = h("node", n.op_type, n.domain, *attrs, "|", *ins)
        nodes.append(base)
        for k, o in enumerate(n.output):
            if o:
                val[o] = h(base, k)
    outs = [h(o.name, val.get(o.name, h("unbound", o.name))) for o in g.output]
    opsets = sorted(f"{o.domain}:{o.version}" for o in model.opset_import)
    return h("graph", *outs, "|", *sorted(nodes), "|", *sorted(inits), "|", *opsets)[:16]


def prepare_model(name: str, build, out_dir: str, targets: list[str], cost_models: list[str], progress) -> dict:
    import onnx

    from taso_mlir.dialect.onnx_export import save_onnx

    t0 = time.perf_counter()
    model = build()
    feeds = E.random_feeds(model, seed=1)
    ref = E.ort_outputs(model, feeds)
    entry = {"name": name, "variants": {}, "files": {}}
    files: dict = {}  # digest -> file name
    shapes: dict = {}  # structure digest -> file name
    users: dict = collections.defaultdict(list)  # file name -> the variants that use it, in order
    variants = [("original", model, None)]
    for target in targets:
        opt, rep = optimize(model, name, target)
        got = E.ort_outputs(opt, feeds)
        errs = [E.rel_error(got[k], v) for k, v in ref.items()]
        rep["rel_err_vs_original"] = max(errs) if errs else None
        variants.append((variant_name(target), opt, rep))
    for vname, m, rep in variants:
        m2 = onnx.ModelProto()
        m2.CopyFrom(m)
        strip = strip_weights(m2)
        dig, sdig = graph_digest(m2), structure_digest(m2)
        same = None
        if dig in files:
            same = "the same file"
        elif sdig in shapes:
            files[dig], same = shapes[sdig], "the same graph, other value and node names"
        else:
            fname = f"{name}.{vname}.onnx"
            save_onnx(m2, os.path.join(out_dir, fname))
            files[dig] = shapes[sdig] = fname
            entry["files"][fname] = {"digest": dig, "structure": sdig,
                                     "bytes": os.path.getsize(os.path.join(out_dir, fname)),
                                     "nodes": len(m.graph.node),
                                     "op_types": dict(collections.Counter(n.op_type for n in m.graph.node)
                                                      .most_common()),
                                     "predicted": predicted(m, f"{name}:{vname}", cost_models), "weights": strip}
        fname = files[dig]
        entry["variants"][vname] = {"file": fname, "search": rep}
        if same:  # (priced once: the costs depend on the structure only)
            entry["variants"][vname]["same_graph_as"] = {"variants": list(users[fname]), "how": same}
        users[fname].append(vname)
    entry["prepare_s"] = round(time.perf_counter() - t0, 2)
    progress(f"{name}: " + ", ".join(
        f"{v}: {e['file']} (" + ", ".join(f"{c} {ms:.4g}" for c, ms in
                                          entry["files"][e["file"]]["predicted"]["total_ms"].items()) + " ms)"
        for v, e in entry["variants"].items()) + f"; {entry['prepare_s']} s")
    return entry


def _write_manifest(path: str, man: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(man, f, indent=1)
        f.write("\n")


def reprice(out: str, sets: list, names: list) -> int:
    """``--reprice``: every file of each set's manifest (``names``: those models only) priced again by
    ``predicted`` (its stripped weights drawn: the costs depend on shapes, not values), the manifest's
    predictions replaced and ``priced`` updated; the files, searches and everything else as they were. A file
    whose digest is not the manifest's is an error (nothing written for that set)."""
    import onnx

    for s in sets:
        d = os.path.join(out, s)
        man_path = os.path.join(d, "manifest.json")
        with open(man_path, encoding="utf-8") as f:
            man = json.load(f)
        n = 0
        for m in man.get("models", []):
            if names and m["name"] not in names:
                continue
            for fname, fe in m.get("files", {}).items():
                model = onnx.load(os.path.join(d, fname))
                if graph_digest(model) != fe["digest"]:
                    print(f"prepare: error: {s}/{fname} is not the file its manifest describes (digest "
                          f"{graph_digest(model)}, manifest {fe['digest']})", file=sys.stderr)
                    return 1
                E.fill_weights(model)
                v = next((v for v, e in m["variants"].items() if e["file"] == fname), fname)
                old = fe["predicted"]["total_ms"]
                fe["predicted"] = predicted(model, f"{m['name']}:{v}", man["cost_models"])
                n += 1
                print(f"prepare: {s}/{fname}: " + ", ".join(
                    f"{c} {old.get(c, float('nan')):.4g} -> {ms:.4g}" for c, ms in fe["predicted"]["total_ms"].items())
                    + " ms", file=sys.stderr, flush=True)
        man["priced"] = dict(PRICED, commit=_git_commit(),
                             date=E.C._now_iso())
        _write_manifest(man_path, man)
        print(f"prepare: {s}: {n} files priced again -> {man_path}", file=sys.stderr)
    return 0


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
    ap.add_argument("--sets", default="full,quick", help="full, quick or both (default); torch: the torch-exported "
                                                         "models (needs PyTorch)")
    ap.add_argument("--models", default="", help="comma-separated suite models (default: all)")
    ap.add_argument("--targets", default="", help="the searches' targets (default: analytic:t4, analytic:h100, then "
                                                  "cuda:<gpu> for every shipped table)")
    ap.add_argument("--reprice", action="store_true",
                    help="no search: price the files already in each set's folder again (predicted), the manifest's "
                         "cost models, and rewrite only the manifest's predictions (the files stay as they are)")
    a = ap.parse_args(argv)
    if a.reprice:
        return reprice(a.out, [s for s in a.sets.split(",") if s], [n for n in a.models.split(",") if n])
    from taso_mlir.benchmarks.suite import suite
    from taso_mlir.dialect.errors import TasoError, one_line

    names = [n for n in a.models.split(",") if n]
    targets = [t for t in a.targets.split(",") if t] or default_targets()
    cost_models = list(dict.fromkeys(["analytic:h100", "analytic:t4"] + [t for t in targets if t.startswith("cuda:")]))
    sets = [s for s in a.sets.split(",") if s]
    if not set(sets) <= {"full", "quick", "torch"}:
        print("prepare: error: --sets takes full, quick, torch or a comma-separated list of them", file=sys.stderr)
        return 2
    sources = {}
    for s in sets:
        if s == "torch":
            try:
                sources[s] = torch_models()
            except RuntimeError as e:
                print(f"prepare: error: {e}", file=sys.stderr)
                return 2
        else:
            sources[s] = [(m.name, m.build, m.title, m.config) for m in suite(s == "quick")]
    known = list(dict.fromkeys(n for src in sources.values() for n, *_ in src))
    bad = [n for n in names if n not in known]
    if bad:
        print(f"prepare: error: unknown model(s) {', '.join(bad)} (models: {', '.join(known)})", file=sys.stderr)
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
        for name, build, title, config in sources[s]:
            if a.models and name not in names:
                if name in old:
                    models.append(old[name])
                continue
            try:
                e = prepare_model(name, build, d, targets, cost_models, progress)
            except TasoError as ex:
                progress(f"{name}: error: {one_line(ex, 200)}")
                e = {"name": name, "error": one_line(ex, 300)}
            e.update(title=title, config=config)
            models.append(e)
        man = {"format": MANIFEST_FORMAT, "set": s, "commit": _git_commit(),
               "date": E.C._now_iso(),
               "targets": targets, "cost_models": cost_models, "priced": PRICED,
               "specs": {c: spec(c) for c in dict.fromkeys(targets + cost_models)},
               "weights": f"float initializers of {STRIP_MIN} elements or more stripped; drawn on the GPU machine "
                          "from their recorded mean, deviation and range (execute.fill_weights, seed 0)",
               "models": models}
        _write_manifest(man_path, man)
        total = sum(x["bytes"] for mm in models for x in mm.get("files", {}).values())
        progress(f"{s}: {len(models)} models, {sum(len(mm.get('files', {})) for mm in models)} files, "
                 f"{total / 1e6:.1f} MB -> {man_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
