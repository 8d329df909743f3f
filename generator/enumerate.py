"""Enumerate every small graph over TASO's operators and fingerprint it.

Ops are hash-consed: an op is (template, operand tensors), created once with its exact uint32 value
(``graph.evaluate``'s fingerprinting mode: wrapping arithmetic, the ReLU surrogate). A graph is a set
of ops closed under operands. The depth-first search adds ops in increasing (cone size, id) order, so
every set is produced exactly once, and the children of a graph are kept as a sorted candidate list
(the parent's remaining candidates plus the ops that use the newly added op's results).

Pruned while enumerating (TASO's rules): a graph with two tensors of equal value (duplicate tensors;
a computed tensor equal to an input only ends a graph as its single output, where it yields an
identity rule such as transpose(transpose(x)) = x); more outputs than ``max_outputs``; a graph that is
disconnected unless every component is a single op (the sources of merge rules such as two matmuls
sharing an input). Enlarge applies only to weight inputs; conv weights are weight-derived tensors.

The fingerprint of a graph is the sum (mod 2**64) of the hashes of its outputs' values, so that the
order of outputs does not matter. ``Enumerator.run`` returns the fingerprints; ``graphs`` rebuilds
the graphs whose fingerprint is shared.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field

import numpy as np

from ..dialect import specs
from . import graph as G

MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple
    kind: str  # "act" | "weight" | "scalar"


@dataclass(frozen=True)
class Config:
    """What the generator enumerates. The default is the shipped library's configuration."""
    max_ops: int = 4
    max_outputs: int = 2
    inputs: tuple = (
        InputSpec("x1", (2, 4), "act"), InputSpec("x2", (2, 4), "act"), InputSpec("x3", (2, 4), "act"),
        InputSpec("w1", (4, 4), "weight"), InputSpec("w2", (4, 4), "weight"),
        InputSpec("i1", (2, 4, 5, 5), "act"), InputSpec("i2", (2, 4, 5, 5), "act"),
        InputSpec("c1", (4, 4, 3, 3), "weight"), InputSpec("c2", (4, 4, 3, 3), "weight"),
        InputSpec("c3", (4, 4, 1, 1), "weight"), InputSpec("d1", (4, 1, 3, 3), "weight"),
        InputSpec("s1", (), "scalar"),
    )
    #: constant ops and their shapes (cone size 1 ops, like TASO's C_pool, I_conv, I_matmul, I_ewmul)
    constants: tuple = (("const_imatmul", (4, 4)), ("const_iewmul", (2, 4)),
                        ("const_iconv", (4, 4, 3, 3)), ("const_pool", (4, 1, 3, 3)))
    #: most ops of a kind in one graph (scalar multiplication commutes with every linear op, so
    #: graphs with two of them mostly restate one scalar move in several places)
    op_limits: tuple = (("smul", 1),)
    enlarge_to: tuple = (3, 3)
    pool_kernel: tuple = (3, 3)
    seed: int = 2019
    #: the operator kinds enumerated (empty: all of TASO's)
    ops: tuple = ()
    #: ops whose results are weights (weight-only: folded before anything runs, e.g. the concat of two
    #: kernels a merge needs) allowed in a graph on top of ``max_ops``
    max_weight_ops: int = 0
    #: the first letter of the rule ids this configuration's library uses
    id_prefix: str = "R"
    #: convolutions read only the input activations (sibling convolutions, as merges have; no chains)
    conv_on_inputs: bool = False

    @property
    def slots(self) -> int:
        """Most ops in one graph."""
        return self.max_ops + self.max_weight_ops

    def to_json(self) -> dict:
        d = {"max_ops": self.max_ops, "max_outputs": self.max_outputs,
             "inputs": [[i.name, list(i.shape), i.kind] for i in self.inputs],
             "constants": [[n, list(s)] for n, s in self.constants],
             "op_limits": {k: v for k, v in self.op_limits},
             "enlarge_to": list(self.enlarge_to), "pool_kernel": list(self.pool_kernel), "seed": self.seed}
        if self.ops:  # (written only where they differ from the default, so older files read the same)
            d["ops"] = list(self.ops)
        if self.max_weight_ops:
            d["max_weight_ops"] = self.max_weight_ops
        if self.id_prefix != "R":
            d["id_prefix"] = self.id_prefix
        if self.conv_on_inputs:
            d["conv_on_inputs"] = True
        return d

    @staticmethod
    def from_json(d: dict) -> "Config":
        return Config(max_ops=d["max_ops"], max_outputs=d["max_outputs"],
                      inputs=tuple(InputSpec(n, tuple(s), k) for n, s, k in d["inputs"]),
                      constants=tuple((n, tuple(s)) for n, s in d["constants"]),
                      op_limits=tuple(sorted(d.get("op_limits", {}).items())),
                      enlarge_to=tuple(d["enlarge_to"]), pool_kernel=tuple(d["pool_kernel"]), seed=d["seed"],
                      ops=tuple(d.get("ops", ())), max_weight_ops=d.get("max_weight_ops", 0),
                      id_prefix=d.get("id_prefix", "R"), conv_on_inputs=d.get("conv_on_inputs", False))


#: the operator kinds the enumerator builds (``Config.ops`` picks among them; constants are ``Config.constants``)
ENUMERATED_OPS = ("ewadd", "ewmul", "smul", "matmul", "conv2d", "relu", "transpose", "maxpool2d", "avgpool2d",
                  "concat", "split", "enlarge")


#: The configurations of the shipped libraries (``taso-gen --family``), by name.
#:
#: ``base``: TASO's operators and inputs, N = 3 (the library ``rules.jsonl``).
#: ``base-n4``: the same at N = 4, less what ``base`` has or derives (``rules-n4.jsonl``): generated with
#: the proved ``base`` rules to derive from, so it holds the rules with a side of 4 ops that those do not
#: give (``pipeline.generate``'s ``derive_from``).
#: ``conv-bias``: convolutions with a bias operand (what exported CNNs and folded batch norms have), with
#: the ops that fuse, merge and enlarge them. Weight-only ops (the concat of two kernels or two biases,
#: enlarge) do not count towards ``max_ops``: a biased merge of a 1x1 and a 3x3 convolution needs three
#: of them beside the convolution and the split. At most two convolutions, both on the input activation
#: (siblings: what merges rewrite), and one relu (``rules-conv-bias.jsonl``).
#: ``matmul-bias``: the same for matmuls with a bias operand (one value per output column: a Gemm's C,
#: a linear layer's bias), on 2-D activations and weights (``rules-matmul-bias.jsonl``).
FAMILIES = {
    "base": Config(max_ops=3),
    "base-n4": Config(max_ops=4, id_prefix="F"),
    "conv-bias": Config(
        max_ops=3, max_weight_ops=3,
        inputs=(InputSpec("i1", (2, 4, 5, 5), "act"), InputSpec("c1", (4, 4, 3, 3), "weight"), InputSpec("c2", (4, 4, 3, 3), "weight"),
                InputSpec("c3", (4, 4, 1, 1), "weight"), InputSpec("d1", (4, 1, 3, 3), "weight"),
                InputSpec("b1", (4,), "weight"), InputSpec("b2", (4,), "weight")),
        constants=(), op_limits=(("conv2d", 2), ("relu", 1)), ops=("conv2d", "relu", "concat", "split", "enlarge"),
        conv_on_inputs=True, id_prefix="B"),
    "matmul-bias": Config(
        max_ops=3, max_weight_ops=3,
        inputs=(InputSpec("x1", (2, 4), "act"), InputSpec("x2", (2, 4), "act"), InputSpec("w1", (4, 4), "weight"),
                InputSpec("w2", (4, 4), "weight"), InputSpec("b1", (4,), "weight"), InputSpec("b2", (4,), "weight")),
        constants=(), op_limits=(("matmul", 2), ("relu", 1)), ops=("matmul", "relu", "concat", "split"),
        conv_on_inputs=True, id_prefix="M"),
}


def value_hash(v: np.ndarray) -> int:
    h = hashlib.blake2b(repr(v.shape).encode() + v.tobytes(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


#: where the rows/columns (batch/channels) of a matmul's and a conv's result come from
_AXIS_SOURCES = {"matmul": {0: (0, 0), 1: (1, 1)}, "conv2d": {0: (0, 0), 1: (1, 0)}}


@dataclass
class _Tensor:
    shape: tuple
    value: np.ndarray
    hash: int
    weight: bool  # derived from weights and constants only
    producer: int  # op id, or -1 for an input
    index: int  # result index, or input index
    splits: dict = field(default_factory=dict)  # axis -> ((tensor, axis), (tensor, axis)) of a concat


class _TensorHash:
    """A tensor of an ``Enumerator.from_table``: its value hash only."""
    __slots__ = ("hash",)

    def __init__(self, h: int):
        self.hash = h


@dataclass
class _Op:
    name: str
    attrs: tuple
    operands: tuple  # tensor ids
    results: tuple = ()  # tensor ids
    order: int = 0  # (cone size << 32) | id: the enumeration order
    split_dims: tuple = ()  # split: ((tensor, axis), (tensor, axis))


class Enumerator:
    def __init__(self, config: Config):
        self.cfg = config
        self.limits = dict(config.op_limits)
        rng = np.random.default_rng(config.seed)
        self.tensors: list[_Tensor] = []
        self.ops: list[_Op] = []
        self.order: list[int] = []  # ops[i].order, for sorting
        self.index: dict[tuple, int] = {}  # (name, attrs, operands) -> op id, or -1 if ill-typed
        self.input_ids = []
        #: convolutions take a bias operand (a configuration with 1-D weight inputs: every convolution is
        #: biased; the base configuration has the unbiased ones)
        self._biases = any(len(s.shape) == 1 and s.kind == "weight" for s in config.inputs)
        for i, spec in enumerate(config.inputs):
            v = rng.integers(0, 1 << 32, size=spec.shape, dtype=np.uint64).astype(np.uint32)
            self.input_ids.append(self._new_tensor(v, spec.kind == "weight", -1, i))
        self.scalars = [t for t, s in zip(self.input_ids, config.inputs) if s.kind == "scalar"]
        self.base_ops = []  # cone-size-1 ops: constants and ops on inputs only
        for name, shape in config.constants:
            op = self._make((name, (("shape", tuple(shape)),), ()))
            if op >= 0:
                self.base_ops.append(op)
        avail = list(self.input_ids)
        self.base_ops += self._new_candidates(avail, set(avail))
        self.base_ops = sorted(set(self.base_ops), key=lambda o: self.ops[o].order)

    # ---- tensors and ops ----
    def _new_tensor(self, v, weight, producer, index):
        t = _Tensor(tuple(v.shape), v, value_hash(v), weight, producer, index)
        self.tensors.append(t)
        return len(self.tensors) - 1

    def _make(self, key) -> int:
        """The op for key (created and evaluated on first use); -1 if it does not type-check."""
        got = self.index.get(key)
        if got is not None:
            return got
        name, attrs, operands = key
        ts = [self.tensors[t] for t in operands]
        a = dict(attrs)
        split_dims = ()
        try:
            if name == "split":
                src = ts[0].splits.get(a["axis"])
                if src is None:
                    raise specs.SpecError("no split point")
                split_dims = src
                a["sizes"] = tuple(self.tensors[t].shape[ax] for t, ax in src)
                g = G.Op("split", tuple(sorted(a.items())), ("a",), 2)
            elif name in specs.CONSTANTS:
                g = G.Op(name, attrs, (), 1)
            else:
                g = G.Op(name, attrs, tuple(f"v{i}" for i in range(len(operands))), 1)
            outs = G.evaluate(G.Graph((g,), tuple(G.op_ref(0, j, g.num_results) for j in range(g.num_results))),
                              {r: t.value for r, t in zip(g.operands, ts)} if name not in specs.CONSTANTS
                              else {"_": np.zeros((), np.uint32)}, relu_surrogate=True)
        except specs.SpecError:
            self.index[key] = -1
            return -1
        oid = len(self.ops)
        cone = 1 + len(set().union(*[self._cone(t) for t in operands])) if operands else 1
        op = _Op(name, attrs, operands, (), (cone << 32) | oid, split_dims)
        self.ops.append(op)
        self.order.append(op.order)
        weight = all(t.weight for t in ts if t.shape) if ts else True  # a scalar factor keeps the kind
        res = []
        for j, v in enumerate(outs):
            tid = self._new_tensor(v, weight, oid, j)
            res.append(tid)
        op.results = tuple(res)
        self._propagate_splits(op)
        self.index[key] = oid
        return oid

    def _cone(self, t) -> frozenset:
        p = self.tensors[t].producer
        if p < 0:
            return frozenset()
        op = self.ops[p]
        c = getattr(op, "_cone", None)
        if c is None:
            c = frozenset({p}).union(*[self._cone(x) for x in op.operands])
            op._cone = c
        return c

    def _propagate_splits(self, op: _Op):
        """Where a later split may cut each result (TASO's split tree): from the concat that joined it."""
        out = self.tensors[op.results[0]]
        ins = [self.tensors[t] for t in op.operands]
        a = dict(op.attrs)
        if op.name == "concat":
            out.splits = {a["axis"]: ((op.operands[0], a["axis"]), (op.operands[1], a["axis"]))}
        elif op.name in ("ewadd", "ewmul"):
            out.splits = {**ins[1].splits, **ins[0].splits}
        elif op.name in ("relu", "smul", "maxpool2d", "avgpool2d"):
            out.splits = dict(ins[0].splits)
        elif op.name in _AXIS_SOURCES:  # result axis <- (operand, axis)
            out.splits = {ax: ins[i].splits[src] for ax, (i, src) in _AXIS_SOURCES[op.name].items()
                          if src in ins[i].splits}
        elif op.name == "transpose":
            out.splits = {1 - ax: v for ax, v in ins[0].splits.items()}

    # ---- candidate ops ----
    def _new_candidates(self, avail: list, new: set) -> list:
        """Ops whose operands are in ``avail`` and use at least one tensor of ``new``."""
        T = self.tensors
        out = []
        allowed = set(self.cfg.ops)

        def make(key):
            return self._make(key) if not allowed or key[0] in allowed else -1
        for a in new:
            ta = T[a]
            r = len(ta.shape)
            if not ta.weight and r > 0:
                out.append(make(("relu", (), (a,))))
            if r == 2:
                out.append(make(("transpose", (("perm", (1, 0)),), (a,))))
            if r == 4 and not ta.weight:
                k = self.cfg.pool_kernel
                pa = (("kernel_shape", k), ("pads", "same"), ("strides", (1, 1)))
                out.append(make(("maxpool2d", pa, (a,))))
                out.append(make(("avgpool2d", (("count_include_pad", 1),) + pa, (a,))))
            if ta.producer < 0 and ta.weight and r == 4 and ta.shape[2:] != tuple(self.cfg.enlarge_to):
                out.append(make(("enlarge", (("kernel_shape", tuple(self.cfg.enlarge_to)),), (a,))))
            if r > 0:
                for s in self.scalars:
                    out.append(make(("smul", (), (a, s))))
            for ax in ta.splits:
                out.append(make(("split", (("axis", ax),), (a,))))
        # bias operands by length (a 1-D weight, one value per output channel): [()] without biases
        biases_of: dict = {}
        if self._biases:
            for c in avail:
                if len(T[c].shape) == 1 and T[c].weight:
                    biases_of.setdefault(T[c].shape[0], []).append((c,))
        new_bias = any(c in new for group in biases_of.values() for (c,) in group)
        for a in avail:
            ta = T[a]
            for b in avail:
                if a == b or (a not in new and b not in new and not new_bias):
                    continue  # an op on the same tensor twice specializes a rule on two tensors
                if a not in new and b not in new:  # only a new bias: only biased convolutions/matmuls are new
                    if not (len(ta.shape) == len(T[b].shape) in (2, 4) and not ta.weight and T[b].weight):
                        continue
                tb = T[b]
                if not ta.shape or not tb.shape:
                    continue
                if ta.shape == tb.shape and a <= b:  # commutative: one operand order (see module doc)
                    out.append(make(("ewadd", (), (a, b))))
                    out.append(make(("ewmul", (), (a, b))))
                ra = len(ta.shape)
                if ra == 2 and len(tb.shape) == 2 and ta.shape[1] == tb.shape[0]:
                    if not self._biases:
                        for act in ("none", "relu"):
                            out.append(make(("matmul", (("activation", act),), (a, b))))
                    elif not ta.weight and tb.weight and not (self.cfg.conv_on_inputs and ta.producer >= 0
                                                              and self.ops[ta.producer].name != "concat"):
                        # with bias operands: activation (an input, or a concat: a row merge's) times
                        # weight, as for convolutions
                        for bias in biases_of.get(tb.shape[1], []):
                            if a not in new and b not in new and bias[0] not in new:
                                continue
                            for act in ("none", "relu"):
                                out.append(make(("matmul", (("activation", act),), (a, b) + bias)))
                if ra == 4 and len(tb.shape) == 4 and not ta.weight and tb.weight and ta.shape[1] % tb.shape[1] == 0 \
                        and not (self.cfg.conv_on_inputs and ta.producer >= 0):
                    g = ta.shape[1] // tb.shape[1]
                    for bias in biases_of.get(tb.shape[0], []) if self._biases else [()]:
                        if a not in new and b not in new and not (bias and bias[0] in new):
                            continue
                        for act in ("none", "relu"):
                            out.append(make(("conv2d", (("activation", act), ("group", g), ("pads", "same"),
                                                        ("strides", (1, 1))), (a, b) + bias)))
                if ra == len(tb.shape) and ta.weight == tb.weight:
                    for ax in range(min(ra, 2)):  # batch/channel (rows/columns) concats
                        if all(ta.shape[i] == tb.shape[i] for i in range(ra) if i != ax):
                            out.append(make(("concat", (("axis", ax),), (a, b))))
        return [o for o in out if o >= 0]

    # ---- the search ----
    def run(self, part: int = 0, parts: int = 1, progress=None):
        """Enumerate the graphs whose first op is base op number i with i % parts == part.

        Returns (fingerprints: array('Q'), ops: array('i') with ``cfg.slots`` slots per graph)."""
        self.fps = array("Q")
        self.graph_ops = array("i")
        n = self.cfg.max_ops
        input_hashes = self.input_hashes = {self.tensors[t].hash for t in self.input_ids}
        for t in self.input_ids:  # 0-op graphs: an input is its own output
            if part == 0:
                self._record((), frozenset({t}))
        base = self.base_ops
        for i, o in enumerate(base):
            if i % parts != part:
                continue
            self._visit([], set(self.input_ids), input_hashes, frozenset(), base, i, n, wleft=self.cfg.max_weight_ops)
            if progress:
                progress(1)
        return self.fps, self.graph_ops

    def _record(self, ops: tuple, sinks: frozenset):
        fp = 0
        for t in sinks:
            fp = (fp + self.tensors[t].hash) & MASK64
        self.fps.append(fp)
        slots = list(ops) + [-1] * (self.cfg.slots - len(ops))
        self.graph_ops.extend(slots)

    def _visit(self, gops: list, avail_set: set, hashes: set, sinks: frozenset, cands: list, j: int, left: int,
               comps: tuple = (), wleft: int = 0):
        """Add cands[j] to the graph ``gops`` and recurse (``left`` more ops may be added, and ``wleft``
        more weight-only ops on top)."""
        T = self.tensors
        o = cands[j]
        op = self.ops[o]
        limit = self.limits.get(op.name)
        if limit is not None and sum(self.ops[g].name == op.name for g in gops) >= limit:
            return
        if wleft and all(T[t].weight for t in op.results):
            wleft -= 1  # a weight-only op, from the extra budget
        elif left == 0:
            return
        else:
            left -= 1
        res = op.results
        rh = [T[t].hash for t in res]
        dup = [h in hashes for h in rh]
        if any(dup) or len(set(rh)) < len(rh):
            # a duplicate tensor ends the graph; a result equal to an input is kept as the graph's
            # only output (every previous output feeds it): an identity rule's side
            if (len(res) == 1 and rh[0] in self.input_hashes and all(t in op.operands for t in sinks)
                    and len(self._join(comps, op, o)) == 1):
                self._record(tuple(gops) + (o,), frozenset(res))
            return
        new_sinks = (sinks - set(op.operands)) | set(res)
        new_ops = gops + [o]
        max_out = self.cfg.max_outputs
        if len(new_sinks) - (left + wleft) > max_out:  # each further op removes at most one output
            return
        comps = self._join(comps, op, o)
        big = max(len(c) for c in comps) > 1
        if (len(new_sinks) <= max_out and (len(comps) == 1 or (not big and self._parallel(new_ops)))
                and not any(T[t].weight for t in new_sinks)):
            self._record(tuple(new_ops), new_sinks)
        if (left == 0 and wleft == 0) or (big and len(comps) - 1 > left + wleft):
            return
        new_avail = avail_set | set(res)
        hashes2 = hashes | set(rh)
        fresh = self._new_candidates(list(new_avail), set(res))
        rest = cands[j + 1:]
        merged = sorted(set(rest).union(fresh), key=self.order.__getitem__)
        for k in range(len(merged)):
            self._visit(new_ops, new_avail, hashes2, new_sinks, merged, k, left, comps, wleft)

    def _parallel(self, ops: list) -> bool:
        """A disconnected graph is kept when it is ops of one kind side by side (a merge rule's source)."""
        first = self.ops[ops[0]]
        return all(self.ops[o].name == first.name and self.ops[o].attrs == first.attrs for o in ops[1:])

    def _join(self, comps: tuple, op: _Op, o: int) -> tuple:
        """Connected components (by internal edges) after adding op ``o``."""
        producers = {self.tensors[t].producer for t in op.operands}
        joined = frozenset({o}).union(*[c for c in comps if not producers.isdisjoint(c)])
        return tuple(c for c in comps if producers.isdisjoint(c)) + (joined,)

    # ---- the op table, for graphs back out in another process ----
    def table(self) -> tuple:
        """What ``graph`` and ``candidates.members_of`` need of this enumerator once it has run, compact
        and picklable (no tensor values): another process rebuilds it with ``from_table`` (op and
        tensor ids are this process's, as in ``run``'s output)."""
        return (self.cfg, tuple(self.input_ids),
                [(o.name, o.attrs, o.operands, o.results, o.order, o.split_dims) for o in self.ops],
                array("Q", (t.hash for t in self.tensors)))

    @classmethod
    def from_table(cls, table: tuple) -> "Enumerator":
        """An enumerator that can only turn op sets into graphs (``graph``, ``candidates.members_of``)."""
        en = cls.__new__(cls)
        en.cfg, input_ids, ops, hashes = table
        en.input_ids = list(input_ids)
        en.ops = [_Op(n, a, operands, results, order, split_dims)
                  for n, a, operands, results, order, split_dims in ops]
        en.tensors = [_TensorHash(h) for h in hashes]
        return en

    def compact(self) -> "Enumerator":
        """What ``from_table(self.table())`` gives, without the copy: an enumerator that can only turn
        op sets into graphs, sharing this one's ops, holding no tensor values (a Ray worker keeps it
        between the enumeration and the graphs' rebuild)."""
        en = Enumerator.__new__(Enumerator)
        en.cfg, en.input_ids, en.ops = self.cfg, list(self.input_ids), self.ops
        en.tensors = [_TensorHash(t.hash) for t in self.tensors]
        return en

    # ---- graphs back out ----
    def graph(self, ops: tuple) -> tuple[G.Graph, list[int]]:
        """The rule graph of an op set, with the tensor ids of its outputs."""
        ops = sorted((o for o in ops if o >= 0), key=lambda c: self.ops[c].order)
        names = {t: s.name for t, s in zip(self.input_ids, self.cfg.inputs)}
        gops = []
        used = set()
        for k, o in enumerate(ops):
            op = self.ops[o]
            for j, t in enumerate(op.results):
                names[t] = G.op_ref(k, j, len(op.results))
            used.update(op.operands)
            attrs = op.attrs
            if op.name == "split":
                attrs = attrs + (("sizes", tuple((names[t], ax) for t, ax in op.split_dims)),)
                attrs = tuple(sorted(attrs))
            if op.name == "conv2d" and dict(attrs)["group"] != 1:
                attrs = tuple((k, "grouped" if k == "group" else v) for k, v in attrs)
            gops.append(G.Op(op.name, attrs, tuple(names[t] for t in op.operands), len(op.results)))
        sinks = [t for o in ops for t in self.ops[o].results if t not in used]
        return G.Graph(tuple(gops), tuple(names[t] for t in sinks)), sinks
