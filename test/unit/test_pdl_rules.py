"""Every rewrite users can get, applied as its emitted PDL pattern, is checked numerically.

For each usable direction of each proved rule: build a function holding the rule's source graph at
generator shapes (and, where the rule allows, at wider shapes), apply the rewrite's tagged PDL pattern
at that site (what taso-search does), and compare the rewritten function with the original on random
inputs with the reference semantics. This tests the PDL emission, the native constraint and target
functions, and the rule, end to end through MLIR.
"""

from __future__ import annotations

import numpy as np
import pytest

from taso_mlir.dialect import specs
from taso_mlir.dialect.mlir import func, ir
from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.ops import create_taso_op, function_dce
from taso_mlir.generator import graph as G
from taso_mlir.generator.candidates import SHAPE_VARIANTS, random_inputs, variant_shapes
from taso_mlir.passes.search import pdl as P
from taso_mlir.passes.search import rulebook as RB
from taso_mlir.passes.search.taso_search import rewrites
from unit_helpers import run_function

REWRITES = rewrites()


def build_function(ctx, g: G.Graph, shapes: dict) -> tuple[ir.Module, list]:
    """A module with one function computing ``g`` (input variables as arguments, in order).
    Returns the module and the source ops in rule order."""
    names = g.inputs()
    all_shapes = G.infer(g, shapes)
    with ctx, ir.Location.unknown():
        f32 = ir.F32Type.get()
        tt = lambda s: ir.RankedTensorType.get(list(s), f32)  # noqa: E731
        m = ir.Module.create()
        with ir.InsertionPoint(m.body):
            ftype = ir.FunctionType.get([tt(shapes[v]) for v in names], [tt(all_shapes[r]) for r in g.outputs])
            fop = func.FuncOp("f", ftype)
            block = fop.add_entry_block()
        vals = dict(zip(names, block.arguments))
        ops = []
        with ir.InsertionPoint(block):
            for k, op in enumerate(g.ops):
                a, hint = G.spec_attrs(op, all_shapes)
                outs = [all_shapes[G.op_ref(k, j, op.num_results)] for j in range(op.num_results)]
                o = create_taso_op(op.name, [vals[r] for r in op.operands], [tt(s) for s in outs], a)
                ops.append(o)
                for j in range(op.num_results):
                    vals[G.op_ref(k, j, op.num_results)] = o.results[j]
            func.ReturnOp([vals[r] for r in g.outputs])
    return m, ops


_CTX: list = []


def _context():
    """One MLIR context for the whole file (a context per rewrite would hold gigabytes)."""
    if not _CTX:
        _CTX.append(make_context())
    return _CTX[0]


def _apply_and_compare(rw: RB.Rewrite, shapes: dict, kinds: dict, seed: int) -> str:
    ctx = _context()
    try:
        G.infer(rw.src, shapes)
        G.infer(rw.dst, shapes)
    except specs.SpecError:
        return "skip"
    m, ops = build_function(ctx, rw.src, shapes)
    with ctx, ir.Location.unknown():
        fop = m.body.operations[0].operation
        rng = np.random.default_rng(seed)
        names = rw.src.inputs()
        vals = random_inputs({v: (shapes[v], kinds[v]) for v in names}, shapes, rng)
        inputs = [vals[v] for v in names]
        before = run_function(fop, inputs)
        P.Replayer(REWRITES).apply(fop, rw, ops)
        function_dce(fop)
        assert fop.verify()
        after = run_function(fop, inputs)
        left = {o.operation.name for o in fop.regions[0].blocks[0].operations}
    for x, y in zip(before, after):
        assert x.shape == y.shape, rw.id
        np.testing.assert_allclose(y, x, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(x).max())),
                                   err_msg=f"{rw.id}: {rw.text}")
    assert {f"taso.{op.name}" for op in rw.dst.ops} <= left
    return "ok"


RECORD_INPUTS = {}
_library = __import__("taso_mlir.generator.library", fromlist=["read"])
for _path in _library.shipped_paths():
    for _rec in _library.read(_path)[1]:
        RECORD_INPUTS[_rec["id"]] = {v: (tuple(s), k) for v, (s, k) in _rec["inputs"].items()}


#: rewrites with a symbolic stride applied at stride 2 as well
at_stride_2: set = set()


@pytest.mark.parametrize("chunk", range(8))
def test_every_rewrite_as_pdl_is_numerically_exact(chunk, taso_summary):
    done = 0
    for rw in REWRITES[chunk::8]:
        inputs = RECORD_INPUTS[rw.rule_id]
        shapes = {v: s for v, (s, _k) in inputs.items()}
        kinds = {v: k for v, (_s, k) in inputs.items()}
        env = {} if rw.stride_op is None else {G.STRIDE_VAR: (1, 1)}
        assert _apply_and_compare(rw, {**shapes, **env}, kinds, seed=hash(rw.id) % 1000) == "ok", \
            f"{rw.id} does not type-check at its own generator shapes"
        done += 1
        if rw.stride_op is not None:  # a rule with a symbolic stride: also at stride 2, where it type-checks
            for variant in ({},) + SHAPE_VARIANTS:
                vshapes = variant_shapes(inputs, variant)
                if _apply_and_compare(rw, {**vshapes, G.STRIDE_VAR: (2, 2)}, kinds, seed=7) == "ok":
                    at_stride_2.add(rw.id)
                    break
    if chunk == 0:
        taso_summary(f"PDL patterns: {len(REWRITES)} rewrites applied through MLIR and checked numerically "
                     f"(this chunk {done})")


def test_stride_2_sites_are_rewritten(taso_summary):
    """Rewrites with a symbolic stride were applied through PDL at stride 2 (by the test above)."""
    general = [rw for rw in REWRITES if rw.stride_op is not None]
    assert general and len(at_stride_2) >= len(general) // 2, (len(at_stride_2), len(general))
    taso_summary(f"PDL patterns at stride 2: {len(at_stride_2)} of {len(general)} stride-generalized rewrites")


def test_emitted_file_parses_and_names_every_pattern():
    ctx = make_context()
    with ctx:
        text = P.emit_text(REWRITES)
        m = ir.Module.parse(text)
        names = [ir.StringAttr(o.operation.attributes["sym_name"]).value for o in m.body.operations]
    want = [n for rw in REWRITES for n in P.pattern_names(rw)]
    assert names == want
    assert len(set(names)) == len(names)
