"""From fingerprints to candidate rules: pairing, pruning, the floating-point test, symbolic shapes.

Stages (each one's count goes into the library header):
1. ``graphs``: everything the enumerator produced.
2. ``candidates``: unordered pairs of graphs with equal fingerprints whose outputs match one to one
   by value hash (every output mapped: no dangling outputs).
3. ``after_common_subgraph``: drop pairs whose graphs share an op (a shared op on the same inputs,
   and so a shared subgraph), and pairs whose outputs are all produced by the same operator on
   pairwise-equivalent operands (they follow from a smaller rule by congruence).
4. ``after_renaming``: drop pairs that are another pair with input variables renamed (within inputs of
   the same shape and kind) or with the two sides swapped.
5. ``after_float_test``: both graphs evaluated in float64 (real ReLU) on fresh random inputs in
   [-1, 1] agree within 1e-6 (relative) -- TASO's second test.
Constant ops' shapes are then stated symbolically, in terms of the rule's input variables, choosing
the reading that holds at the alternative shapes of ``shape_variants``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..dialect import specs
from . import graph as G
from .enumerate import Config, Enumerator

#: dimension maps for testing a rule beyond the generator's shapes: batch/rows 2, channels 4 and
#: spatial 5 map together so that the generator's equalities (2 + 2 = 4) still hold. Kernel dims of
#: 4-D weights (axes 2 and 3) are never mapped.
SHAPE_VARIANTS = (
    {2: 3, 4: 6, 5: 7},  # odd sizes, larger channels
    {2: 1, 4: 2, 5: 9},  # batch 1
    {2: 5, 4: 10, 5: 6},  # batch 5, wider
    {2: 2, 4: 4, 5: 8},  # even spatial size
)


def variant_shapes(inputs: dict, variant: dict) -> dict:
    """Input shapes of a rule under a dimension map (``inputs``: var -> (shape, kind))."""
    out = {}
    for v, (shape, kind) in inputs.items():
        dims = []
        for ax, d in enumerate(shape):
            if kind == "weight" and len(shape) == 4 and ax >= 2:
                dims.append(d)
            elif kind == "weight" and len(shape) == 4 and ax == 1 and d == 1:
                dims.append(d)  # depthwise kernels keep one input channel per group
            else:
                dims.append(variant.get(d, d))
        out[v] = tuple(dims)
    return out


def random_inputs(inputs: dict, shapes: dict, rng: np.random.Generator) -> dict:
    return {v: rng.uniform(-1.0, 1.0, size=shapes[v]) for v in inputs}


@dataclass
class Candidate:
    a: G.Graph
    b: G.Graph
    fingerprint: int
    a_ops: frozenset
    b_ops: frozenset
    note: str = ""


def _term_strings(g: G.Graph) -> list[str]:
    """Canonical term strings of the outputs (commutative operands sorted)."""
    memo: dict[str, str] = {}

    def term(ref: str) -> str:
        if ref in memo:
            return memo[ref]
        pr = G.parse_ref(ref)
        if pr is None:
            return ref
        op = g.ops[pr[0]]
        attrs = ",".join(f"{k}={v}" for k, v in op.attrs if k not in ("sizes", "shape"))
        args = [term(r) for r in op.operands]
        if op.name in ("ewadd", "ewmul"):
            args.sort()
        s = f"{op.name}#{pr[1]}[{attrs}]({','.join(args)})"
        memo[ref] = s
        return s
    return [term(r) for r in g.outputs]


def _rename(g: G.Graph, m: dict) -> G.Graph:
    def r(x):
        return m.get(x, x)
    ops = []
    for op in g.ops:
        attrs = []
        for k, v in op.attrs:
            if k in ("sizes", "shape"):
                v = tuple((r(d[0]), d[1]) if isinstance(d, tuple) else d for d in v)
            attrs.append((k, v))
        ops.append(G.Op(op.name, tuple(attrs), tuple(r(x) for x in op.operands), op.num_results))
    return G.Graph(tuple(ops), tuple(r(x) for x in g.outputs))


def pair_key(a: G.Graph, b: G.Graph, classes: dict) -> tuple:
    """A key equal for pairs that are renamings of each other (either side first)."""
    used = sorted(set(a.inputs()) | set(b.inputs()))
    by_class: dict = {}
    for v in used:
        by_class.setdefault(classes[v], []).append(v)
    groups = list(by_class.items())
    best = None
    per_class = []
    for cls, vs in groups:
        pool = [v for v, c in classes.items() if c == cls]
        per_class.append([dict(zip(vs, p)) for p in itertools.permutations(sorted(pool), len(vs))])
    for combo in itertools.product(*per_class):
        m = {}
        for d in combo:
            m.update(d)
        ta, tb = _term_strings(_rename(a, m)), _term_strings(_rename(b, m))
        order = sorted(range(len(ta)), key=lambda i: (ta[i], tb[i]))
        ka = tuple(ta[i] for i in order)
        kb = tuple(tb[i] for i in order)
        key = min((ka, kb), (kb, ka))
        if best is None or key < best:
            best = key
    return best


def find_candidates(en: Enumerator, fps, graph_ops, log=print) -> tuple[list[Candidate], dict]:
    cfg = en.cfg
    n = cfg.max_ops
    fa = np.frombuffer(fps, dtype=np.uint64)
    ops = np.frombuffer(graph_ops, dtype=np.int32).reshape(-1, n) if n else np.zeros((len(fa), 0), np.int32)
    counts = {"graphs": int(len(fa))}
    order = np.argsort(fa, kind="stable")
    sf = fa[order]
    starts = np.flatnonzero(np.r_[True, sf[1:] != sf[:-1]])
    ends = np.r_[starts[1:], len(sf)]
    T = en.tensors
    pairs: list[Candidate] = []
    n_cand = n_common = 0
    for s, e in zip(starts, ends):
        if e - s < 2:
            continue
        members = []
        for i in order[s:e]:
            opset = tuple(int(o) for o in ops[i] if o >= 0)
            if not opset:  # an input as its own output
                t = next(t for t in en.input_ids if T[t].hash == _input_hash_for(en, fa[i]))
                g = G.Graph((), (cfg.inputs[en.input_ids.index(t)].name,))
                members.append((g, [t], frozenset()))
            else:
                g, sinks = en.graph(opset)
                members.append((g, sinks, frozenset(opset)))
        for (ga, sa, oa), (gb, sb, ob) in itertools.combinations(members, 2):
            ha = sorted(T[t].hash for t in sa)
            hb = sorted(T[t].hash for t in sb)
            if ha != hb or len(set(ha)) != len(ha):
                continue
            n_cand += 1
            if oa & ob or _congruent(en, sa, sb):
                continue
            n_common += 1
            # order b's outputs like a's (matched by value)
            pos = {T[t].hash: k for k, t in enumerate(sb)}
            perm = [pos[T[t].hash] for t in sa]
            gb2 = G.Graph(gb.ops, tuple(gb.outputs[k] for k in perm))
            pairs.append(Candidate(ga, gb2, int(sf[s]), oa, ob))
    counts["candidates"] = n_cand
    counts["after_common_subgraph"] = n_common
    log(f"  {n_cand} candidate pairs, {n_common} after common-subgraph pruning")

    classes = {s.name: (s.shape, s.kind) for s in cfg.inputs}
    seen = set()
    kept = []
    for c in pairs:
        k = pair_key(c.a, c.b, classes)
        if k in seen:
            continue
        seen.add(k)
        kept.append(c)
    counts["after_renaming"] = len(kept)
    log(f"  {len(kept)} after input-renaming pruning")

    inputs = {s.name: (s.shape, s.kind) for s in cfg.inputs}
    rng = np.random.default_rng(cfg.seed + 1)
    passed = []
    for c in kept:
        ok, why = float_test(c.a, c.b, inputs, variant_shapes(inputs, {}), rng)
        if ok:
            passed.append(c)
    counts["after_float_test"] = len(passed)
    log(f"  {len(passed)} after the floating-point test")
    return passed, counts


def _input_hash_for(en: Enumerator, fp) -> int:
    return int(fp)


def _congruent(en: Enumerator, sa, sb) -> bool:
    """Every output pair is the same operator applied to pairwise-equivalent operands."""
    T = en.tensors
    by_hash = {T[t].hash: t for t in sb}
    for ta in sa:
        tb = by_hash[T[ta].hash]
        pa, pb = T[ta].producer, T[tb].producer
        if pa < 0 or pb < 0:
            return False
        oa, ob = en.ops[pa], en.ops[pb]
        if oa.name != ob.name or oa.attrs != ob.attrs or T[ta].index != T[tb].index:
            return False
        ha = [T[t].hash for t in oa.operands]
        hb = [T[t].hash for t in ob.operands]
        if oa.name in ("ewadd", "ewmul"):
            ha.sort(), hb.sort()
        if ha != hb:
            return False
    return True


def float_test(a: G.Graph, b: G.Graph, inputs: dict, shapes: dict, rng, rtol=1e-6, atol=1e-9):
    """(True, '') when both graphs type-check with equal output shapes and agree on random floats.

    (None, why) when neither side type-checks at these shapes; (False, why) otherwise."""
    res = []
    for g in (a, b):
        try:
            G.infer(g, shapes)
            res.append(None)
        except (specs.SpecError, KeyError, IndexError) as e:
            res.append(str(e) or type(e).__name__)
    if res[0] and res[1]:
        return None, "neither side type-checks"
    if res[0] or res[1]:
        return False, f"only one side type-checks ({res[0] or res[1]})"
    vals = random_inputs(inputs, shapes, rng)
    va = G.evaluate(a, vals)
    vb = G.evaluate(b, vals)
    for x, y in zip(va, vb):
        if x.shape != y.shape:
            return False, f"output shapes differ: {list(x.shape)} vs {list(y.shape)}"
        if not np.allclose(x, y, rtol=rtol, atol=atol):
            return False, f"values differ (max abs diff {float(np.max(np.abs(x - y))):.3g})"
    return True, ""


def symbolic_constants(a: G.Graph, b: G.Graph, inputs: dict, rng) -> tuple[G.Graph, G.Graph, int]:
    """State constant ops' shapes as dims of the rule's inputs, choosing the reading that agrees at
    the most shape variants (and disagrees at none). Returns the graphs and that number of variants."""
    slots = []  # (side, op index, axis, value)
    for side, g in enumerate((a, b)):
        for k, op in enumerate(g.ops):
            if op.name in specs.CONSTANTS:
                shape = op.attr("shape")
                for ax, d in enumerate(shape):
                    kernel = len(shape) == 4 and (ax >= 2 or (op.name == "const_pool" and ax == 1))
                    if isinstance(d, int) and not kernel:
                        slots.append((side, k, ax, d))
    base_shapes = variant_shapes(inputs, {})
    used = sorted(set(a.inputs()) | set(b.inputs()))

    def score(ga, gb):
        good = 0
        for var in SHAPE_VARIANTS:
            ok, _ = float_test(ga, gb, inputs, variant_shapes(inputs, var), rng)
            if ok is False:
                return -1
            good += ok is True
        return good
    if not slots:
        return a, b, score(a, b)
    options = []
    for side, k, ax, d in slots:
        opts = [(v, i) for v in used for i, x in enumerate(base_shapes[v]) if x == d]
        options.append(opts or [d])
    best = (score(a, b), a, b)
    for n, combo in enumerate(itertools.product(*options)):
        if n >= 256:
            break
        graphs = [list(a.ops), list(b.ops)]
        for (side, k, ax, _), dim in zip(slots, combo):
            op = graphs[side][k]
            shape = list(op.attr("shape"))
            shape[ax] = dim
            graphs[side][k] = G.Op(op.name, (("shape", tuple(shape)),), op.operands, op.num_results)
        ga, gb = G.Graph(tuple(graphs[0]), a.outputs), G.Graph(tuple(graphs[1]), b.outputs)
        s = score(ga, gb)
        if s > best[0]:
            best = (s, ga, gb)
    return best[1], best[2], best[0]
