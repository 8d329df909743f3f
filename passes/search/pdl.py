"""Verified rewrites as MLIR PDL patterns, and their application at chosen sites.

Each rewrite (a proved rule in one direction, ``rulebook.Rewrite``) becomes one ``pdl.pattern``
per operand order of its commutative ops (``@R0091f``, ``@R0091f_c1``, ...):

- the match is PDL: one ``pdl.operation`` per source op with the rule's op names and operand
  structure (operands and result counts fixed, so a convolution with a bias does not match);
- one native constraint, ``taso_site_check(rule id, source ops...)``, runs ``rulebook.check_site``
  on the matched ops: attributes (symbolic ones resolved at the site's shapes), shape and rank
  preconditions, external uses, and that the target type-checks; and, because PDL inserts new ops
  before the root, that the site is in an order where the rewrite keeps SSA dominance;
- the rewrite is PDL: ``pdl.operation`` creates the target ops, whose result types and attributes
  come from one native rewrite, ``taso_target(rule id, source ops...)``, which cannot fail (the
  constraint has checked the target), then ``pdl.replace`` replaces every source op whose results
  are mapped outputs. Source ops left without uses are removed by dead-code elimination.

``emit_text`` writes the patterns (``taso-opt --emit-pdl``): upstream ``mlir-opt`` parses the file
together with the dialect's IRDL file; the native functions are the Python ones registered here.

The search applies rewrites at single sites it chose (``Replayer``): it tags the site's ops with a
``taso.site`` attribute, reorders the block so that the rewrite keeps dominance, and runs a pattern
variant that requires the tags and marks the ops it creates (``taso.made``), capped at one rewrite.
"""

from __future__ import annotations

import itertools
from typing import Optional

from taso_mlir.dialect import specs
from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.handles import check_live
from taso_mlir.dialect.mlir import ir, rewrite
from taso_mlir.dialect.ops import elem_type, mlir_attr, producers, shape_of, taso_attrs
from taso_mlir.generator import graph as G

from taso_mlir.passes.search import rulebook as RB

SITE_ATTR = "taso.site"
MADE_ATTR = "taso.made"


# ---------------------------------------------------------------------------------------------
# emission


def _variants(rw: RB.Rewrite) -> list[tuple]:
    """Operand orders: one tuple of operand refs per source op, for every commutation."""
    per_op = []
    for op in rw.src.ops:
        if op.name in RB.COMMUTATIVE and len(op.operands) == 2 and op.operands[0] != op.operands[1]:
            per_op.append([op.operands, (op.operands[1], op.operands[0])])
        else:
            per_op.append([op.operands])
    return list(itertools.product(*per_op))


def variant_of(rw: RB.Rewrite, ops: list, b: dict, operands: list) -> int:
    """The operand order (index into ``_variants``) in which a site's source ops read their operands:
    ``ops`` the matched op ids in rule order, ``b`` the variables' values, ``operands[k]`` the values
    op k reads. The first such order where operands repeat; 0 if none (not a site of ``rw``)."""
    def value(ref):
        if ref in b:
            return b[ref]
        i, j = G.parse_ref(ref)
        return (ops[i], j)

    for vi, variant in enumerate(_variants(rw)):
        if all(tuple(value(r) for r in refs) == tuple(got) for refs, got in zip(variant, operands)):
            return vi
    return 0


def pattern_names(rw: RB.Rewrite) -> list[str]:
    return [rw.id if i == 0 else f"{rw.id}_c{i}" for i in range(len(_variants(rw)))]


def _target_attr_names(rw: RB.Rewrite) -> list[list[str]]:
    """Per target op, the attribute names the native rewrite returns (spec attributes, then the
    segment-size attribute of variadic ops)."""
    out = []
    for op in rw.dst.ops:
        s = specs.spec(op.name)
        names = [a.name for a in s.attrs]
        if s.variadic_operands or s.optional_operands:
            names.append("operandSegmentSizes")
        if s.variadic_results:
            names.append("resultSegmentSizes")
        out.append(names)
    return out


def replaced_positions(rw: RB.Rewrite) -> set:
    """The positions of ``rw``'s source ops that its pattern replaces (``pdl.replace``, which erases
    them): those all of whose results are mapped outputs."""
    out_of = set(rw.src.outputs)
    return {k for k, op in enumerate(rw.src.ops)
            if all(G.op_ref(k, j, op.num_results) in out_of for j in range(op.num_results))}


def emit_pattern(rw: RB.Rewrite, variant: int = 0, tagged: bool = False) -> str:
    """One ``pdl.pattern`` (see the module docstring). ``tagged``: the single-site variant."""
    name = pattern_names(rw)[variant]
    orders = _variants(rw)[variant]
    L = [f"  pdl.pattern @{name} : benefit(1) {{",
         f"    %rid = pdl.attribute = \"{rw.id}\""]
    var = {}
    for v in rw.src.inputs():
        var[v] = f"%v_{v}"
        L.append(f"    %v_{v} = pdl.operand")
    res = {}
    for k, (op, operands) in enumerate(zip(rw.src.ops, orders)):
        args = [var[r] if G.parse_ref(r) is None else res[r] for r in operands]
        types = []
        for j in range(op.num_results):
            L.append(f"    %t{k}_{j} = pdl.type")
            types.append(f"%t{k}_{j}")
        attrs = ""
        if tagged:
            L.append(f"    %tag{k} = pdl.attribute = {k} : i64")
            attrs = f' {{"{SITE_ATTR}" = %tag{k}}}'
        opnd = f"({', '.join(args)} : {', '.join(['!pdl.value'] * len(args))})" if args else ""
        L.append(f"    %op{k} = pdl.operation \"taso.{op.name}\"{opnd}{attrs} -> "
                 f"({', '.join(types)} : {', '.join(['!pdl.type'] * len(types))})")
        for j in range(op.num_results):
            r = G.op_ref(k, j, op.num_results)
            L.append(f"    %r{k}_{j} = pdl.result {j} of %op{k}")
            res[r] = f"%r{k}_{j}"
    ops = [f"%op{k}" for k in range(len(rw.src.ops))]
    sig = ", ".join(["!pdl.attribute"] + ["!pdl.operation"] * len(ops))
    L.append(f"    pdl.apply_native_constraint \"taso_site_check\"(%rid, {', '.join(ops)} : {sig})")
    L.append(f"    pdl.rewrite %op{len(ops) - 1} {{")
    # the native rewrite returns, per target op, its result types then its attributes
    outs, kinds = [], []
    attr_names = _target_attr_names(rw)
    for k, op in enumerate(rw.dst.ops):
        for j in range(op.num_results):
            outs.append(f"%nt{k}_{j}")
            kinds.append("!pdl.type")
        for a in attr_names[k]:
            outs.append(f"%na{k}_{a}")
            kinds.append("!pdl.attribute")
    if outs:
        L.append(f"      {', '.join(outs)} = pdl.apply_native_rewrite \"taso_target\"(%rid, {', '.join(ops)} : {sig})"
                 f" : {', '.join(kinds)}")
    nres = dict(res)
    dres = {}
    for k, op in enumerate(rw.dst.ops):
        args = [var[r] if G.parse_ref(r) is None else dres[r] for r in op.operands]
        alist = [f'"{a}" = %na{k}_{a}' for a in attr_names[k]]
        if tagged:
            L.append(f"      %made{k} = pdl.attribute = {k} : i64")
            alist.append(f'"{MADE_ATTR}" = %made{k}')
        types = [f"%nt{k}_{j}" for j in range(op.num_results)]
        opnd = f"({', '.join(args)} : {', '.join(['!pdl.value'] * len(args))})" if args else ""
        adict = f" {{{', '.join(alist)}}}" if alist else ""
        L.append(f"      %n{k} = pdl.operation \"taso.{op.name}\"{opnd}{adict} -> "
                 f"({', '.join(types)} : {', '.join(['!pdl.type'] * len(types))})")
        for j in range(op.num_results):
            L.append(f"      %nr{k}_{j} = pdl.result {j} of %n{k}")
            dres[G.op_ref(k, j, op.num_results)] = f"%nr{k}_{j}"
    del nres
    out_of = dict(zip(rw.src.outputs, rw.dst.outputs))
    replaced = replaced_positions(rw)
    for k, op in enumerate(rw.src.ops):
        refs = [G.op_ref(k, j, op.num_results) for j in range(op.num_results)]
        if k in replaced:
            vals = [var[out_of[r]] if G.parse_ref(out_of[r]) is None else dres[out_of[r]] for r in refs]
            L.append(f"      pdl.replace %op{k} with ({', '.join(vals)} : {', '.join(['!pdl.value'] * len(vals))})")
    L.append("    }")
    L.append("  }")
    return "\n".join(L)


def emit_text(rewrites: list, tagged: bool = False) -> str:
    """A module holding every pattern of ``rewrites`` (those PDL can express)."""
    body = []
    for rw in rewrites:
        if rw.why_not_emitted:
            continue
        for v in range(len(_variants(rw))):
            body.append(emit_pattern(rw, v, tagged))
    return "module {\n" + "\n".join(body) + "\n}\n"


# ---------------------------------------------------------------------------------------------
# the native functions


def _op(x) -> ir.Operation:
    return x.operation if hasattr(x, "operation") else x


class MlirView(RB.View):
    def kind(self, op):
        n = op.name
        return n[5:] if n.startswith("taso.") else None

    def operands(self, op):
        return tuple(op.operands)

    def num_results(self, op):
        return len(op.results)

    def result(self, op, j):
        return op.results[j]

    def producer(self, value):
        owner = value.owner
        if isinstance(owner, ir.Block):
            return None
        return _op(owner), ir.OpResult(value).result_number

    def attrs(self, op):
        a = {k: v for k, v in taso_attrs(op).items() if not k.startswith("taso.")}
        try:
            full = specs.spec(op.name).complete_attrs(a)
        except specs.SpecError:
            return {"<invalid>": True}
        return {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in full.items()}

    def shape(self, value):
        return shape_of(value)

    def dtype(self, value):
        return str(elem_type(value))

    def users(self, value):
        for u in value.uses:
            o = _op(u.owner)
            yield None if o.name == "func.return" else o

    def same_op(self, a, b):
        return _op(a) == _op(b)


def _dominance_ok(ops: list, b: dict) -> Optional[str]:
    """PDL inserts the target before the root (the last source op): every source op must precede
    the root in its block, and no external user of a source result may precede it."""
    root = ops[-1]
    if any(o.block != root.block for o in ops):
        return "the matched ops are in different blocks"
    if any(o != root and not o.is_before_in_block(root) for o in ops):
        return "the root is not the last matched op (PDL inserts the target before it)"
    matched = set(ops)
    for o in ops:
        for r in o.results:
            for u in r.uses:
                uo = _op(u.owner)
                if uo not in matched and uo.block == root.block and uo.is_before_in_block(root):
                    return "a result is used before the root (the target would not dominate the use)"
    return None


class Natives:
    """The constraint and rewrite functions the patterns call, over a set of rewrites."""

    def __init__(self, rewrites: list):
        self.by_id = {rw.id: rw for rw in rewrites}
        self.view = MlirView()
        self.last_reject: Optional[str] = None
        self.error: Optional[BaseException] = None

    def constraint(self, rewriter, results, values):  # returns True to REJECT
        try:
            rw = self.by_id[str(ir.StringAttr(values[0]).value)]
            ops = [_op(v) for v in values[1:]]
            b = RB.bind_ops(rw, self.view, ops)
            if b is None:
                self.last_reject = "operand structure differs"
                return True
            why = RB.check_site(rw, self.view, ops, b) or _dominance_ok(ops, b)
            self.last_reject = why
            return why is not None
        except BaseException as e:  # never let an exception cross into MLIR
            self.error = e
            return True

    def target(self, rewriter, results, values):
        rw = self.by_id[str(ir.StringAttr(values[0]).value)]
        ops = [_op(v) for v in values[1:]]
        b = RB.bind_ops(rw, self.view, ops)
        shapes = {v: tuple(shape_of(val)) for v, val in b.items()} | RB.site_env(rw, self.view, ops)
        et = elem_type(ops[-1].results[0])
        attr_names = _target_attr_names(rw)
        for k, ((attrs, outs), op) in enumerate(zip(RB.dst_op_attrs(rw, shapes), rw.dst.ops)):
            for s in outs:
                results.append(ir.RankedTensorType.get(list(s), et))
            s = specs.spec(op.name)
            for a in attr_names[k]:
                if a == "operandSegmentSizes":
                    n = len(op.operands)
                    if s.variadic_operands:
                        seg = [1] * n + [0] * (specs.MAX_ARITY - n)
                    else:
                        req = len(s.operands)
                        seg = [1] * n + [0] * (req + len(s.optional_operands) - n)
                    results.append(ir.DenseI32ArrayAttr.get(seg))
                elif a == "resultSegmentSizes":
                    n = op.num_results
                    results.append(ir.DenseI32ArrayAttr.get([1] * n + [0] * (specs.MAX_ARITY - n)))
                else:
                    results.append(mlir_attr(s.attr(a).kind, attrs[a]))


class PatternSet:
    """Compiled patterns. Keeps the PDL module alive as long as the frozen set (dropping it while
    the set is in use crashes MLIR), and freezes exactly once."""

    def __init__(self, text: str, natives: Natives):
        self.module = ir.Module.parse(text)
        pm = rewrite.PDLModule(self.module)
        pm.register_constraint_function("taso_site_check", natives.constraint)
        pm.register_rewrite_function("taso_target", natives.target)
        self._pdl = pm
        self.frozen = pm.freeze()
        self.natives = natives


def apply_everywhere(module_op: ir.Operation, pset: PatternSet, max_rewrites: int = -1) -> None:
    """Greedy application (for users who want the patterns alone, e.g. tests of a rule family)."""
    cfg = rewrite.GreedyRewriteConfig()
    cfg.enable_folding = False
    if max_rewrites >= 0:
        cfg.max_num_rewrites = max_rewrites
    try:
        rewrite.apply_patterns_and_fold_greedily(module_op, pset.frozen, cfg)
    except Exception as e:  # a capped run reports "failed to converge" although it rewrote
        if "converge" not in str(e):
            raise
    if pset.natives.error is not None:
        e, pset.natives.error = pset.natives.error, None
        raise e


# ---------------------------------------------------------------------------------------------
# replaying a search's rewrites at their sites


class Replayer:
    """Applies a sequence of (rewrite, site) to a function with the tagged PDL variants."""

    def __init__(self, rewrites: list):
        self.rewrites = rewrites
        self.natives = Natives(rewrites)
        self._sets: dict = {}

    def _set(self, rw: RB.Rewrite, variant: Optional[int]) -> PatternSet:
        key = (rw.id, variant)
        if key not in self._sets:
            vs = range(len(_variants(rw))) if variant is None else [variant]
            text = "module {\n" + "\n".join(emit_pattern(rw, v, tagged=True) for v in vs) + "\n}\n"
            self._sets[key] = PatternSet(text, self.natives)
        return self._sets[key]

    def apply(self, func_op: ir.Operation, rw: RB.Rewrite, ops: list,
              variant: Optional[int] = None) -> list[ir.Operation]:
        """Rewrite ``rw`` at source ops ``ops`` (MLIR ops, rule order). Returns the created ops by
        target op index. Raises TasoError if the pattern did not apply (the search and the IR
        disagree). ``variant``: the operand order to apply (``variant_of``; None: any), so that the
        target reads the variables in the order the search bound them."""
        block = func_op.regions[0].blocks[0]
        for k, o in enumerate(ops):
            check_live(o, f"matched op {k} of rewrite {rw.id}")
        # (reordering reads the whole block: only where the site's order needs it and moving the site's
        # ops up does not do)
        if _dominance_ok(ops, {}) is not None and not _order_locally(block, ops):
            _order_for_site(block, ops)
        i64 = ir.IntegerType.get_signless(64)
        for k, o in enumerate(ops):
            o.attributes[SITE_ATTR] = ir.IntegerAttr.get(i64, k)
        pset = self._set(rw, variant)
        self.natives.last_reject = None
        apply_everywhere(func_op, pset, max_rewrites=1)
        made: dict = {}
        tagged = 0
        for o in block.operations:
            op = o.operation
            if SITE_ATTR in op.attributes:
                del op.attributes[SITE_ATTR]
                tagged += 1
            if MADE_ATTR in op.attributes:
                made[int(ir.IntegerAttr(op.attributes[MADE_ATTR]).value)] = op
                del op.attributes[MADE_ATTR]
        # applied: the target ops exist and the replaced op is gone (a target of no ops makes none)
        if len(made) != len(rw.dst.ops) or tagged == len(ops):
            why = self.natives.last_reject or "no match"
            raise TasoError(f"internal error: rewrite {rw.id} did not apply at its site in the IR ({why})")
        return [made[k] for k in range(len(rw.dst.ops))]


def _order_locally(block, ops: list) -> bool:
    """Move the site's ops up, in rule order, to just after the last op that defines one of their other
    operands (operand-free ops such as weights, defined after it, move up too), where that moves every
    one of them up only (so the block stays in a valid order); True if PDL can then rewrite the site
    (``_dominance_ok``). Reads only the site and its operands' producers, not the whole block."""
    matched = set(ops)  # (ops hash and compare by pointer)
    seen: set = set()
    fixed, movable = [], []
    for k, o in enumerate(ops):
        for p in producers(o):
            if p in matched:
                if p not in ops[:k]:  # (rule order must be a topological order of the site)
                    return False
                continue
            if p in seen:
                continue
            seen.add(p)
            (movable if len(p.operands) == 0 and len(p.regions) == 0 else fixed).append(p)
    anchor = None
    for p in fixed:
        if anchor is None or anchor.is_before_in_block(p):
            anchor = p
    if anchor is not None and any(o.is_before_in_block(anchor) for o in ops):
        return False  # (a site op would move down, past its users)
    placed = [p for p in movable if anchor is None or anchor.is_before_in_block(p)] + list(ops)
    if anchor is None:  # (every other operand is an argument or moves: the site goes first)
        first = block.operations[0].operation
        if first != placed[0]:
            placed[0].move_before(first)
        prev, rest = placed[0], placed[1:]
    else:
        prev, rest = anchor, placed
    for o in rest:
        o.move_after(prev)
        prev = o
    return _dominance_ok(ops, {}) is None


def _order_for_site(block, ops: list) -> None:
    """Reorder the block so that the site's ops come last among what they depend on: every op
    that does not depend on a matched op, then the matched ops in rule order, then their
    dependents (a topological order; PDL then inserts the target before the last matched op and
    every use of a replaced result comes after it)."""
    matched = set(ops)
    all_ops = [o.operation for o in block.operations]
    term = all_ops[-1]
    dependent = set()
    for o in all_ops:
        if o in matched:
            continue
        for v in o.operands:
            if isinstance(v.owner, ir.Block):
                continue
            p = _op(v.owner)
            if p in matched or p in dependent:
                dependent.add(o)
                break
    for o in ops:
        o.move_before(term)
    for o in all_ops:
        if o in dependent and o != term:
            o.move_before(term)
