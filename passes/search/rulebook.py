"""The verified rules as rewrites, and the one check of a rule at a site.

A *rewrite* is a proved rule of the shipped libraries (``generator/rules.jsonl`` and
``generator/rules-n4.jsonl``, the base family at 3 and 4 ops; ``generator/rules-conv-bias.jsonl`` and
``generator/rules-matmul-bias.jsonl``, convolutions and matmuls with a bias operand) in one of its usable
directions: ``src -> dst`` for "forward", ``dst -> src`` for "backward". Rewrite ids are the rule id
with a direction suffix (``R0091f``, ``R0091b``).

A *site* is an assignment of the rewrite's source ops to operations of a graph. Two graph views
use the same check, :func:`check_site`:

- the search's in-memory graph (``passes/tgraph.py``), which finds sites by its own matcher, and
- the MLIR module, where the emitted PDL pattern finds the site and its native constraint calls
  ``check_site`` on the matched operations (``passes/pdl.py``).

The check is what makes an application sound; it is every precondition the rules file states:

1. the ops have the rule's kinds and operand structure (up to the commutativity of ewadd and ewmul),
   distinct ops for distinct rule ops (so a rule's convolution with a bias operand matches only biased
   convolutions, and one without only unbiased ones);
2. every attribute equals the rule's, with the rule's symbolic attributes (split sizes, constant
   shapes, ``pads="same"``, ``group="grouped"``) resolved at the site's shapes, and spec defaults for
   attributes the rule does not name (so dilations are 1); a rule stated with a symbolic stride
   (``strides = "s"``) takes it from the site, where it must be 1 or 2 in both directions;
3. elementwise operands have equal shapes (no broadcasting), the element type is a float type;
4. an input variable has the rank it had in the generator, unless every op of the rule is
   rank-polymorphic (elementwise), since axes (concat, split, transpose, matmul) are absolute;
5. every result of a matched op that is used outside the match is a mapped output, and no variable is
   bound to a result of a matched op;
6. the target type-checks at the site's shapes and gives the source outputs' shapes, and every
   tensor of both sides has dimensions >= 1.

These are exactly the hypotheses of every proof (``verifier.prove.Prover``): a rule is proved for
inputs of its generator ranks with dimensions >= 1 where both sides type-check with equal output
shapes and a symbolic stride is 1 or 2. Rank-free rules (every op elementwise) are proved at the
generator's ranks; pointwise ops on equal shapes commute with any reshape, so such a rule holds at
every rank.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from taso_mlir.dialect import specs
from taso_mlir.generator import graph as G
from taso_mlir.generator import library

#: ops whose meaning does not depend on the rank of their operands
RANK_POLYMORPHIC = frozenset({"ewadd", "ewmul", "smul", "relu", "const_iewmul"})
COMMUTATIVE = frozenset(library.COMMUTATIVE)
FLOAT_TYPES = frozenset({"f16", "bf16", "f32", "f64"})


@dataclass
class Rewrite:
    id: str  # rule id + "f" (forward) or "b" (backward)
    rule_id: str
    src: G.Graph
    dst: G.Graph
    gen_ranks: dict  # input variable -> rank in the generator
    rank_free: bool  # every op is rank-polymorphic
    proof: dict
    #: per source op: the refs of its results that are outputs of src (with the output index)
    out_index: dict = field(default_factory=dict)  # ref -> output position
    kinds: frozenset = frozenset()
    #: PDL can express it (see emittable())
    why_not_emitted: str = ""
    #: the first source op whose stride is the rule's symbolic stride (None: the rule has none)
    stride_op: Optional[int] = None

    @property
    def text(self) -> str:
        return f"{self.src.text()}  =>  {self.dst.text()}"

    @property
    def memo_key(self) -> tuple:
        """What a memo of this rewrite's answers is keyed by: its id and its content (two rules files
        may give one id to different rules, and memos outlive a run)."""
        key = self.__dict__.get("_memo_key")
        if key is None:
            key = self.__dict__["_memo_key"] = (self.id, self.text)
        return key


def _make(rid: str, direction: str, record: dict, src: G.Graph, dst: G.Graph) -> Rewrite:
    ranks = {v: len(shape) for v, (shape, _kind) in record["inputs"].items()}
    rank_free = all(op.name in RANK_POLYMORPHIC for op in src.ops + dst.ops)
    rw = Rewrite(f"{rid}{direction[0]}", rid, src, dst, ranks, rank_free, record["proof"])
    rw.out_index = {r: i for i, r in enumerate(src.outputs)}
    rw.kinds = frozenset(op.name for op in src.ops)
    rw.why_not_emitted = _why_not(src, dst)
    rw.stride_op = next((k for k, op in enumerate(src.ops) if op.attr("strides") == "s"), None)
    return rw


def _why_not(src: G.Graph, dst: G.Graph) -> str:
    """Why a rewrite cannot be a PDL pattern (and therefore is not offered to the search)."""
    if any(not r.startswith("%") for r in src.outputs):
        return "a source output is an input variable (nothing to replace)"
    if not _connected(src):
        return "the source ops share no value (a PDL pattern must be connected)"
    if len(set(src.outputs)) != len(src.outputs):
        return "a source output is mapped twice"
    for k, op in enumerate(src.ops):
        refs = [G.op_ref(k, j, op.num_results) for j in range(op.num_results)]
        mapped = [r in src.outputs for r in refs]
        if any(mapped) and not all(mapped):
            return "a source op has mapped and unmapped results (PDL replaces all results of an op)"
    return ""


def _connected(g: G.Graph) -> bool:
    """The ops are connected through shared operands or internal edges."""
    parent = list(range(len(g.ops)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_user: dict = {}
    for k, op in enumerate(g.ops):
        for r in op.operands:
            p = G.parse_ref(r)
            other = p[0] if p is not None else first_user.setdefault(r, k)
            parent[find(k)] = find(other)
    return len({find(k) for k in range(len(g.ops))}) <= 1


def load(path=None, status: str = "proved") -> list[Rewrite]:
    """Every usable direction of every rule with the given proof status, in file order: of the rules
    file ``path`` (several separated by commas), by default of every shipped library."""
    paths = [p for p in str(path).split(",") if p] if path else library.shipped_paths()
    out = []
    seen: dict = {}
    for p in paths:
        for record, src, dst in library.rules(p, status):
            if record["id"] in seen:
                raise library.LibraryError(f"{p}: rule id {record['id']} is also in {seen[record['id']]}")
            seen[record["id"]] = p
            for direction in record["directions"]:
                a, b = (src, dst) if direction == "forward" else (dst, src)
                if library.usable(a, b):
                    out.append(_make(record["id"], direction, record, a, b))
    return out


# ---------------------------------------------------------------------------------------------
# the site check, over an abstract graph view


class View:
    """What the check needs to know about a graph. ``op`` and ``value`` handles are opaque."""

    def kind(self, op) -> Optional[str]:  # taso op name without prefix; None for other ops
        raise NotImplementedError

    def operands(self, op) -> tuple:
        raise NotImplementedError

    def num_results(self, op) -> int:
        raise NotImplementedError

    def result(self, op, j: int):
        raise NotImplementedError

    def producer(self, value) -> Optional[tuple[Any, int]]:  # (op, result index) or None (argument)
        raise NotImplementedError

    def attrs(self, op) -> dict:  # complete spec attributes (defaults filled), list values as tuples
        raise NotImplementedError

    def shape(self, value) -> Optional[tuple]:
        raise NotImplementedError

    def dtype(self, value) -> str:
        raise NotImplementedError

    def users(self, value) -> Iterable:  # ops using the value (an op once per use); None = a graph output
        raise NotImplementedError

    def same_op(self, a, b) -> bool:
        return a == b


def operand_orders(kind: str, operands: tuple) -> list[tuple]:
    if kind in COMMUTATIVE and len(operands) == 2 and operands[0] != operands[1]:
        return [operands, (operands[1], operands[0])]
    return [operands]


def bind_ops(rw: Rewrite, view: View, ops: list) -> Optional[dict]:
    """The variable binding of the source ops ``ops`` (in rule order), or None if they do not have
    the rule's operand structure. Used where the ops were found by another matcher (PDL)."""
    for i in range(len(ops)):
        for j in range(i):
            if view.same_op(ops[i], ops[j]):
                return None
    choices = []
    for k, rop in enumerate(rw.src.ops):
        if view.kind(ops[k]) != rop.name or view.num_results(ops[k]) != rop.num_results:
            return None
        operands = view.operands(ops[k])
        if len(operands) != len(rop.operands):
            return None
        choices.append(operand_orders(rop.name, operands))
    for combo in itertools.product(*choices):
        b = _unify(rw, view, ops, combo)
        if b is not None:
            return b
    return None


def _unify(rw: Rewrite, view: View, ops: list, combo) -> Optional[dict]:
    b: dict = {}
    for k, rop in enumerate(rw.src.ops):
        for ref, v in zip(rop.operands, combo[k]):
            p = G.parse_ref(ref)
            if p is None:
                if ref in b:
                    if b[ref] != v:
                        return None
                else:
                    b[ref] = v
            else:
                prod = view.producer(v)
                if prod is None or not view.same_op(prod[0], ops[p[0]]) or prod[1] != p[1]:
                    return None
    # distinct variables may bind the same value (x + x matches x1 + x2); that is sound
    return b


def check_site(rw: Rewrite, view: View, ops: list, b: dict) -> Optional[str]:
    """None if ``rw`` applies at the site (source op k is ``ops[k]``, variable v is ``b[v]``), else
    why not (a short reason, for reports and tests)."""
    return check_local(rw, view, ops, b) or check_uses(rw, view, ops, b)


#: the strides at which a rule stated with a symbolic stride applies: those at which every stride
#: axiom was validated against the reference semantics
SYMBOLIC_STRIDES = frozenset({(1, 1), (2, 2)})


def site_env(rw: Rewrite, view: View, ops: list) -> dict:
    """The values of the rule's symbolic attributes at the site (the stride, if the rule has one), in
    the form ``generator.graph`` reads them from a shapes mapping."""
    if rw.stride_op is None:
        return {}
    return {G.STRIDE_VAR: tuple(view.attrs(ops[rw.stride_op])["strides"])}


def check_local(rw: Rewrite, view: View, ops: list, b: dict) -> Optional[str]:
    """The preconditions that depend only on the site's shapes, types and attributes (1-4, 6)."""
    return local_site(rw, view, ops, b)[0]


def local_site(rw: Rewrite, view: View, ops: list, b: dict) -> tuple[Optional[str], Optional[dict], Optional[dict]]:
    """``check_local``'s answer, and where it is None (the rewrite applies), the variables' shapes (with
    the symbolic attributes' values) and the shapes of every value of the target, which
    ``dst_op_attrs`` reads (so the target is typed once)."""
    shapes: dict = site_env(rw, view, ops)
    if shapes and shapes[G.STRIDE_VAR] not in SYMBOLIC_STRIDES:
        return f"stride {list(shapes[G.STRIDE_VAR])}: the rule's symbolic stride is proved for strides 1 and 2", None, None
    dtypes = set()
    for v, val in b.items():
        s = view.shape(val)
        if s is None:
            return f"{v} has no static shape", None, None
        if not rw.rank_free and len(s) != rw.gen_ranks[v]:
            return f"{v} has rank {len(s)}, the rule's axes are for rank {rw.gen_ranks[v]}", None, None
        dtype = view.dtype(val)
        if dtype not in FLOAT_TYPES:
            return f"{v} is {dtype}, rules are proved over real numbers", None, None
        dtypes.add(dtype)
        shapes[v] = tuple(s)
    if len(dtypes) > 1:  # (the target's ops take one element type)
        return "the variables are of two element types", None, None
    ints = all(type(d) is int for s in shapes.values() for d in s)  # (for both sides' inference)
    try:
        src_shapes = G.infer(rw.src, shapes, ints)
    except specs.SpecError as e:
        return f"source does not type-check: {e}", None, None
    for k, rop in enumerate(rw.src.ops):
        want = G.rule_attrs(rop, src_shapes)
        have = view.attrs(ops[k])
        if want != have:
            diff = sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
            return f"{rop.name} attribute {diff[0]} differs", None, None
        for j in range(rop.num_results):
            r = G.op_ref(k, j, rop.num_results)
            if tuple(view.shape(view.result(ops[k], j)) or ()) != src_shapes[r]:
                return f"{rop.name} result shape differs", None, None
    why, dst_shapes = _check_target(rw, shapes, src_shapes, ints)
    return why, (shapes if why is None else None), dst_shapes


def check_uses(rw: Rewrite, view: View, ops: list, b: dict) -> Optional[str]:
    """Precondition 5: every result of a matched op used outside the match is a mapped output; and no
    variable is bound to a result of a matched op (the rewrite removes those ops, and the target would
    read the variable: in ``%0 = const_pool(); %1 = conv2d(x, w); %2 = conv2d(%1, %0)`` the kernel
    ``w`` must not be ``%0`` itself)."""
    for v, val in b.items():
        p = view.producer(val)
        if p is not None and any(view.same_op(p[0], o) for o in ops):
            return f"{v} is bound to a result of a matched op"
    for k, rop in enumerate(rw.src.ops):
        for j in range(rop.num_results):
            r = G.op_ref(k, j, rop.num_results)
            if r in rw.out_index:
                continue
            for u in view.users(view.result(ops[k], j)):
                if u is None or not any(view.same_op(u, o) for o in ops):
                    return f"result {r} is used outside the match and is not a mapped output"
    return None


def _check_target(rw: Rewrite, shapes: dict, src_shapes: dict, ints: bool) -> tuple[Optional[str], Optional[dict]]:
    try:
        dst_shapes = G.infer(rw.dst, shapes, ints)
    except specs.SpecError as e:
        return f"target does not type-check: {e}", None
    for rs, rd in zip(rw.src.outputs, rw.dst.outputs):
        if dst_shapes[rd] != src_shapes[rs]:
            return "target output shape differs", None
    # the proofs' domain: every tensor of both sides has dimensions >= 1 (no empty split piece)
    for side in (src_shapes, dst_shapes):
        for ref, s in side.items():
            if ref != G.STRIDE_VAR and min(s, default=1) < 1:
                return f"{ref} has an empty dimension: rules are proved for dimensions >= 1", None
    return None, dst_shapes


def dst_op_attrs(rw: Rewrite, shapes: dict, all_shapes: Optional[dict] = None) -> list[tuple[dict, list[tuple]]]:
    """Per target op: its complete concrete attributes and its result shapes, at the site's
    variable shapes (``shapes``: variable -> shape; ``all_shapes``: the target's values' shapes
    there, where ``local_site`` gave them)."""
    if all_shapes is None:
        all_shapes = G.infer(rw.dst, shapes)
    out = []
    for k, op in enumerate(rw.dst.ops):
        full = dict(G.rule_attrs(op, all_shapes))
        outs = [all_shapes[G.op_ref(k, j, op.num_results)] for j in range(op.num_results)]
        out.append((full, outs))
    return out


def shape_form(rw: Rewrite) -> tuple:
    """The rewrite with its input variables named by their first use (source ops' operands in order,
    then attributes, then the target's): two rewrites of one form match the same sites, pass or fail
    the same site check there and add the same ops. The rules files hold such pairs where the generator
    named a variable by its shape class (``c1``, ``c3``: a 1x1 and a 3x3 kernel) and the rule does not
    depend on it (515 of the 3,040 rewrites). Attributes naming a variable's dimension (a split's
    ``sizes``, a constant's ``shape``: ``('i1', 0)``) are renamed with it; ranks stay part of the form."""
    names: dict = {}

    def var(x):
        if G.parse_ref(x) is not None:
            return x
        if x not in names:
            names[x] = f"v{len(names)}"
        return names[x]

    def attr(v):
        if isinstance(v, tuple):
            if len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], int) and not isinstance(v[1], bool) \
                    and v[0] in rw.gen_ranks:
                return (var(v[0]), v[1])
            return tuple(attr(x) for x in v)
        return v

    def ops(g):
        return tuple((op.name, tuple(var(o) for o in op.operands), tuple((a, attr(v)) for a, v in sorted(op.attrs)),
                      op.num_results) for op in g.ops)

    src, dst = ops(rw.src), ops(rw.dst)
    attr = None  # (``attr`` reads itself: the cycle broken)
    ranks = tuple(sorted((names.get(v, v), k) for v, k in rw.gen_ranks.items()))
    return (src, tuple(map(var, rw.src.outputs)), dst, tuple(map(var, rw.dst.outputs)), ranks, rw.rank_free)


def distinct(rewrites: list) -> list:
    """``rewrites`` without those of a form an earlier one has (``shape_form``), in their order."""
    seen: set = set()
    out = []
    for rw in rewrites:
        form = shape_form(rw)
        if form not in seen:
            seen.add(form)
            out.append(rw)
    return out


Checker = Callable[[Rewrite, View, list, dict], Optional[str]]
