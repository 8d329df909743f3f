"""Shapes at which both sides of a rule type-check, found by solving the constraints first.

Drawing every input dimension on its own (``candidates.random_shapes``) almost never hits the joint
equalities a rule's preconditions need (two concat operands whose channel counts sum to another
pair's, a weight with twice the channels of a grouped input, split sizes summing to the dimension
they split), so a rule that is true only where two of those dims also happen to be equal slips
through. This module turns the rule into integer constraints instead and samples their solutions:

- every axis of every input is an integer variable (ranks as in the generator: 4-D activations and
  weights, 2-D matrices, 1-D biases, 0-D scalars), and each grouped convolution has a group variable;
- each op of either side adds the conditions under which it type-checks and its result shape as
  expressions of those variables (``_Model``): matmul inner dims, concat operands equal outside the
  axis and the axis summing, split sizes non-negative and summing to the dimension, ewadd/ewmul
  operands of equal shape (no broadcasting, the rules' precondition), conv input channels = group x
  weight channels with the output channels divisible by the group (group 1, a concrete group, or
  ``"grouped"``: a group of 2..16), odd kernels for ``pads="same"``, window output sizes at the
  stride being sampled (a rule with ``strides="s"`` is sampled at (1, 1) and (2, 2) separately),
  constant shapes stated in input dims (and what each constant's value needs: C_pool's single input
  channel, I_conv's odd kernel, I_matmul square), and equal output shapes of the two sides;
- the constraints are solved with Z3, under *assumptions* in order of priority: a sample is a list
  of wishes (this dim has this value, these two dims differ, these two coincide); where the wishes
  contradict the constraints, the lowest-priority wish in the unsat core is dropped and the rest
  solved again, so every sample satisfies the constraints and as many wishes as it can;
- the wishes make the samples diverse: free values drawn per kind of axis (batch 1-4, channels from
  {1, 2, 3, 4, 5, 6, 8}, so groups and channel multipliers of the 1/2/4/8 family divide, odd and even
  spatial sizes 1-9, kernels 1/3/5 drawn per axis, so non-square too); a sample where every pair of
  dims that can differ does differ (and dims avoid 1), others where random pairs, or all pairs of a
  kind, coincide; and single dimensions of earlier samples perturbed (the rest re-solved around them).

Every sample is then checked with the concrete shape functions (``graph.infer``, the operator specs:
the ground truth) and the constants' value checks; only samples where both sides type-check with
equal output shapes are returned. The ones the check rejects are counted (``ShapeSampler.rejected``),
so a constraint model that is wrong where the specs are right shows up as rejections, not as silence.

Deliberately independent of ``verifier/``: the samples back the proofs numerically, so they must not
share the prover's reading of shapes.
"""

from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np
import z3

from ..dialect import specs
from . import graph as G

#: bounds of every input dimension (inclusive); kernels (axes 2, 3 of a 4-D weight) stay small
MAX_DIM = 16
MAX_KERNEL = 7
#: the largest group of a ``group="grouped"`` convolution the sampler tries
MAX_GROUP = 16
#: preferred values per kind of axis (the solver may choose others where the constraints need them)
BATCH = (1, 2, 3, 4)
CHANNELS = (1, 2, 3, 4, 5, 6, 8)
SPATIAL = (1, 2, 3, 4, 5, 6, 7, 8, 9)
KERNELS = (1, 3, 5)
#: axis kinds whose dims are forced apart / together as one family in the diversity wishes
FAMILY = {"batch": "size", "channel": "size", "spatial": "spatial", "kernel": "kernel"}
#: strides a rule with a symbolic stride (``strides="s"``) is sampled at
SYMBOLIC_STRIDES = ((1, 1), (2, 2))


class Unsupported(Exception):
    """The rule uses an op (or form) the constraint model does not cover; sample it some other way."""


class _Never(Exception):
    """The graph cannot type-check at any shape (a rank or attribute mismatch)."""


def axis_kind(shape: tuple, kind: str, ax: int) -> str:
    """How an input axis is drawn: ``batch``, ``channel``, ``spatial`` or ``kernel``."""
    if len(shape) == 4 and kind == "weight":
        return "kernel" if ax >= 2 else "channel"
    if len(shape) == 4:
        return ("batch", "channel", "spatial", "spatial")[ax]
    return "channel"  # 2-D matrices, 1-D biases


_PREFERRED = {"batch": BATCH, "channel": CHANNELS, "spatial": SPATIAL, "kernel": KERNELS}


def _draw(kind: str, rng: np.random.Generator) -> int:
    values = _PREFERRED[kind]
    return values[int(rng.integers(len(values)))]


def _z(v) -> z3.ArithRef:
    return v if isinstance(v, z3.ExprRef) else z3.IntVal(int(v))


class _Model:
    """The constraints under which both graphs type-check with equal output shapes at one stride."""

    def __init__(self, a: G.Graph, b: G.Graph, inputs: dict, stride):
        self.stride = stride
        self.cons: list = []
        self.vars: dict[tuple[str, int], z3.ArithRef] = {}  # (input, axis) -> its variable
        self.kinds: dict[tuple[str, int], str] = {}
        self.groups: list[z3.ArithRef] = []  # the group variable of each grouped conv
        self.shapes: dict[str, tuple] = {}
        used = set(a.inputs()) | set(b.inputs())
        missing = used - set(inputs)
        if missing:
            raise Unsupported(f"inputs {sorted(missing)} have no generator shape")
        for v in sorted(used):
            shape, kind = inputs[v]
            dims = []
            for ax in range(len(shape)):
                x = z3.Int(f"{v}.{ax}")
                k = axis_kind(tuple(shape), kind, ax)
                self.cons += [x >= 1, x <= (MAX_KERNEL if k == "kernel" else MAX_DIM)]
                self.vars[(v, ax)], self.kinds[(v, ax)] = x, k
                dims.append(x)
            self.shapes[v] = tuple(dims)
        self.feasible = True
        try:
            outs_a = self._graph(a, "a")
            outs_b = self._graph(b, "b")
            if len(outs_a) != len(outs_b):
                raise _Never("the sides have different numbers of outputs")
            for sa, sb in zip(outs_a, outs_b):
                if len(sa) != len(sb):
                    raise _Never(f"output ranks {len(sa)} and {len(sb)} differ")
                self.cons += [x == y for x, y in zip(sa, sb)]
        except _Never:
            self.feasible = False

    # ---- graphs and ops ----
    def _graph(self, g: G.Graph, side: str) -> list[tuple]:
        sh: dict[str, tuple] = dict(self.shapes)
        for k, op in enumerate(g.ops):
            ins = [sh[r] for r in op.operands]
            outs = self._op(op, ins, sh, f"{side}{k}")
            if len(outs) != op.num_results:
                raise _Never(f"{op.name} gives {len(outs)} results, the graph uses {op.num_results}")
            for j, s in enumerate(outs):
                sh[G.op_ref(k, j, op.num_results)] = s
        return [sh[r] for r in g.outputs]

    def _dim(self, d, sh) -> z3.ArithRef:
        if isinstance(d, tuple):
            shape = sh[d[0]]
            if not -len(shape) <= d[1] < len(shape):
                raise _Never(f"dimension {d[1]} of {d[0]}, which has rank {len(shape)}")
            return shape[d[1]]
        return _z(d)

    def _strides(self, a: dict) -> tuple[int, int]:
        s = a.get("strides", (1, 1))
        if s == "s":
            if self.stride is None:
                raise Unsupported("a symbolic stride with no stride to sample at")
            s = self.stride
        if len(s) != 2 or min(s) < 1:
            raise _Never(f"strides {s}")
        return int(s[0]), int(s[1])

    def _window(self, hw, k, strides, pads, dil=(1, 1)) -> tuple:
        out = []
        for i in range(2):
            n = hw[i] + pads[i] + pads[i + 2] - (dil[i] * (k[i] - 1) + 1)
            self.cons.append(n >= 0)
            out.append(n + 1 if strides[i] == 1 else n / strides[i] + 1)
        return tuple(out)

    def _op(self, op: G.Op, ins: list, sh: dict, tag: str) -> list[tuple]:
        a = dict(op.attrs)
        name = op.name
        c = self.cons
        if name == "conv2d":
            if len(ins) not in (2, 3) or len(ins[0]) != 4 or len(ins[1]) != 4:
                raise _Never("conv2d needs a 4-D input and weight")
            x, w = ins[0], ins[1]
            g = a.get("group", 1)
            if g == "grouped":  # C_in(x) / C_in(w), not 1; the output channels divisible by it
                gv = z3.Int(f"group.{tag}")
                self.groups.append(gv)
                c.append(z3.Or([z3.And(gv == n, x[1] == n * w[1], w[0] % n == 0)
                                for n in range(2, MAX_GROUP + 1)]))
            else:
                g = int(g)
                if g < 1:
                    raise _Never(f"group {g}")
                c.append(x[1] == g * w[1])
                if g > 1:
                    c.append(w[0] % g == 0)
            if len(ins) == 3:
                if len(ins[2]) != 1:
                    raise _Never("a conv bias is 1-D")
                c.append(ins[2][0] == w[0])
            pads = a.get("pads", (0, 0, 0, 0))
            if pads == "same":  # (k-1)/2 on each side of an odd kernel
                c += [w[2] % 2 == 1, w[3] % 2 == 1]
                ph, pw = (w[2] - 1) / 2, (w[3] - 1) / 2
                pads = (ph, pw, ph, pw)
            elif len(pads) != 4 or min(pads) < 0:
                raise _Never(f"pads {pads}")
            dil = tuple(a.get("dilations", (1, 1)))
            oh, ow = self._window(x[2:], w[2:], self._strides(a), [_z(p) for p in pads], dil)
            return [(x[0], w[0], oh, ow)]
        if name in ("maxpool2d", "avgpool2d"):
            if len(ins[0]) != 4:
                raise _Never("pooling needs a 4-D input")
            x, k = ins[0], tuple(int(v) for v in a["kernel_shape"])
            pads = a.get("pads", (0, 0, 0, 0))
            if len(k) != 2 or min(k) < 1:
                raise _Never(f"kernel {k}")
            if pads == "same":
                if k[0] % 2 == 0 or k[1] % 2 == 0:
                    raise _Never("'same' padding needs an odd kernel")
                pads = (k[0] // 2, k[1] // 2, k[0] // 2, k[1] // 2)
            if len(pads) != 4 or min(pads) < 0 or any(pads[i] >= k[i % 2] for i in range(4)):
                raise _Never(f"pads {pads} for kernel {k}")
            oh, ow = self._window(x[2:], k, self._strides(a), pads)
            return [(x[0], x[1], oh, ow)]
        if name == "matmul":
            x, y = ins[0], ins[1]
            if len(x) < 2 or len(y) < 2:
                raise _Never("matmul needs rank >= 2")
            c.append(x[-1] == y[-2])
            if len(ins) == 3:
                if len(ins[2]) != 1:
                    raise _Never("a matmul bias is 1-D")
                c.append(ins[2][0] == y[-1])
            bx, by = list(x[:-2]), list(y[:-2])
            n = max(len(bx), len(by))
            bx, by = [None] * (n - len(bx)) + bx, [None] * (n - len(by)) + by
            batch = []
            for p, q in zip(bx, by):  # numpy broadcasting of the batch dims
                if p is None or q is None:
                    batch.append(q if p is None else p)
                else:
                    c.append(z3.Or(p == q, p == 1, q == 1))
                    batch.append(z3.If(p == 1, q, p))
            return [tuple(batch) + (x[-2], y[-1])]
        if name in ("ewadd", "ewmul"):  # equal shapes: no broadcasting (the rules' precondition)
            x, y = ins
            if len(x) != len(y):
                raise _Never(f"{name} operands of ranks {len(x)} and {len(y)}")
            c += [p == q for p, q in zip(x, y)]
            return [x]
        if name == "smul":
            if len(ins[1]) != 0:
                raise _Never("smul's scalar is 0-D")
            return [ins[0]]
        if name in ("relu", "sigmoid", "tanh"):
            return [ins[0]]
        if name == "transpose":
            perm = tuple(a["perm"])
            if sorted(perm) != list(range(len(ins[0]))):
                raise _Never(f"perm {perm} for rank {len(ins[0])}")
            return [tuple(ins[0][p] for p in perm)]
        if name == "concat":
            ax, r = int(a["axis"]), len(ins[0])
            if not 2 <= len(ins) <= specs.MAX_ARITY or not 0 <= ax < r or any(len(s) != r for s in ins):
                raise _Never("concat operands")
            for s in ins[1:]:
                c += [s[i] == ins[0][i] for i in range(r) if i != ax]
            out = list(ins[0])
            out[ax] = z3.Sum([s[ax] for s in ins])
            return [tuple(out)]
        if name == "split":
            x, ax = ins[0], int(a["axis"])
            sizes = [self._dim(d, sh) for d in a["sizes"]]
            if not 0 <= ax < len(x) or not 2 <= len(sizes) <= specs.MAX_ARITY:
                raise _Never("split axis or arity")
            c += [s >= 0 for s in sizes]
            c.append(z3.Sum(sizes) == x[ax])
            return [tuple(s if i == ax else x[i] for i in range(len(x))) for s in sizes]
        if name == "enlarge":
            w, k = ins[0], tuple(int(v) for v in a["kernel_shape"])
            if len(w) != 4 or len(k) != 2:
                raise _Never("enlarge needs a 4-D weight")
            c += [w[2] <= k[0], w[3] <= k[1], (k[0] - w[2]) % 2 == 0, (k[1] - w[3]) % 2 == 0]
            return [(w[0], w[1], _z(k[0]), _z(k[1]))]
        if name == "batchnorm":
            x = ins[0]
            if len(x) < 2 or any(len(p) != 1 for p in ins[1:]):
                raise _Never("batchnorm operands")
            c += [p[0] == x[1] for p in ins[1:]]
            return [x]
        if name in specs.CONSTANTS:
            shape = tuple(self._dim(d, sh) for d in a["shape"])
            c += [d >= 0 for d in shape]
            if name == "const_pool":  # a depthwise kernel [C, 1, kh, kw]
                if len(shape) != 4:
                    raise _Never("C_pool is 4-D")
                c.append(shape[1] == 1)
            elif name == "const_iconv":  # [C, C/g, kh, kw] with an odd kernel
                if len(shape) != 4:
                    raise _Never("I_conv is 4-D")
                c += [shape[2] % 2 == 1, shape[3] % 2 == 1, shape[1] >= 1,
                      z3.Or(shape[0] % shape[1] == 0, shape[0] == shape[1])]
            elif name == "const_imatmul":
                if len(shape) < 2:
                    raise _Never("I_matmul is at least 2-D")
                c.append(shape[-1] == shape[-2])
            return [shape]
        raise Unsupported(f"no shape constraints for {name}")


def check_shapes(a: G.Graph, b: G.Graph, shapes: dict, stride=None) -> str | None:
    """None where both sides type-check at ``shapes`` with equal output shapes (``graph.infer``, the
    operator specs, and the constants' value checks); otherwise why not."""
    env = dict(shapes)
    if stride is not None:
        env[G.STRIDE_VAR] = tuple(stride)
    outs = []
    for g in (a, b):
        try:
            sh = G.infer(g, env)
            for op in g.ops:
                if op.name in specs.CONSTANTS:  # (their value checks run when they are evaluated)
                    _attrs, hint = G.spec_attrs(op, sh)
                    specs.constant(op.name, hint[0], np.float32)
        except (specs.SpecError, KeyError, IndexError) as e:
            return f"{'source' if g is a else 'target'}: {e}"
        outs.append([sh[r] for r in g.outputs])
    if outs[0] != outs[1]:
        return f"output shapes differ: {outs[0]} vs {outs[1]}"
    return None


class ShapeSampler:
    """Samples shapes of a rule's inputs at which both sides type-check with equal output shapes, at
    one stride (``None``: the rule has no symbolic stride). ``inputs``: var -> (generator shape, kind).

    ``feasible`` is False where the constraints have no solution at all (within the bounds). A concat
    of ``x`` with a stride-2 convolution of ``x`` is feasible: at 1x1 spatial sizes only, which the
    solver finds and independent draws rarely do. Counters: ``candidates`` (distinct solutions drawn), ``accepted``,
    ``rejected`` (solutions the concrete shape functions refuse: a wrong constraint model), ``checks``
    (solver calls); ``rejections`` keeps the first few rejected shapes with the reason."""

    def __init__(self, a: G.Graph, b: G.Graph, inputs: dict, stride=None, timeout_ms: int = 2000):
        self.a, self.b, self.stride = a, b, (tuple(stride) if stride is not None else None)
        self.inputs = {v: (tuple(s), k) for v, (s, k) in inputs.items()}
        m = _Model(a, b, self.inputs, self.stride)
        self.model = m
        self.keys = list(m.vars)  # (input, axis), in a fixed order
        self.solver = z3.Solver()
        self.solver.set("timeout", timeout_ms)
        self.solver.add(*m.cons)
        self.candidates = self.accepted = self.rejected = self.checks = 0
        self.rejections: list[tuple[dict, str]] = []
        self.feasible = m.feasible and self._check() != z3.unsat  # (unknown: try anyway)
        self._seen: set = set()
        self._found: list[dict] = []  # the accepted solutions (var values), for perturbation
        self.free = list(self.keys)  # one dim per class of dims the constraints force equal
        self.forced: dict = {}  # dim -> the dim of its class in ``free``
        self._pair_terms: list | None = None
        self._terms: dict = {}

    # ---- solving ----
    def _check(self, *lits):
        self.checks += 1
        return self.solver.check(*lits)

    def _solve(self, wishes: list) -> z3.ModelRef | None:
        """A model satisfying the constraints and as many of ``wishes`` (Boolean terms, highest priority
        first) as it can: the lowest-priority wish of each unsat core is dropped until it solves."""
        lits, seen = [], set()
        for w in wishes:
            if w.get_id() not in seen:
                seen.add(w.get_id())
                lits.append(w)
        while True:
            r = self._check(*lits)
            if r == z3.sat:
                return self.solver.model()
            if not lits:
                return None
            if r == z3.unsat:
                core = {c.get_id() for c in self.solver.unsat_core()}
                drop = max((i for i, l in enumerate(lits) if l.get_id() in core), default=len(lits) - 1)
            else:  # unknown (the timeout): give up the lower half of the wishes
                drop = slice(len(lits) // 2, None)
            del lits[drop]

    def _values(self, model) -> dict:
        out = {}
        for k, x in self.model.vars.items():
            v = model[x]
            out[k] = (v if v is not None else model.eval(x, model_completion=True)).as_long()
        return out

    def _is(self, k, value: int):
        """The term ``dim k == value`` (made once)."""
        t = self._terms.get((k, value))
        if t is None:
            t = self._terms[(k, value)] = self.model.vars[k] == value
        return t

    def _shapes(self, vals: dict) -> dict:
        return {v: tuple(vals.get((v, ax), d) for ax, d in enumerate(shape))  # (unused inputs: as generated)
                for v, (shape, _kind) in self.inputs.items()}

    def _classes(self, vals: dict) -> None:
        """Find the dims the constraints force equal (so that wishes go to one dim of each class): of
        the dims equal in ``vals``, those that cannot differ from the class's first."""
        V, by_value = self.model.vars, {}
        for k in self.keys:
            by_value.setdefault((FAMILY[self.model.kinds[k]], vals[k]), []).append(k)
        for ks in by_value.values():
            reps: list = []
            for k in ks:
                for r in reps:
                    if self._check(V[k] != V[r]) == z3.unsat:
                        self.forced[k] = r
                        break
                else:
                    reps.append(k)
        self.free = [k for k in self.keys if k not in self.forced]
        self._pair_terms = None

    def admits(self, shapes: dict) -> bool:
        """The constraints have a solution with these input shapes (a check that the model is not
        stricter than the specs: every shape ``check_shapes`` accepts, within the bounds, must pass)."""
        V = self.model.vars
        return self._check(*[V[(v, ax)] == d for v, shape in shapes.items() for ax, d in enumerate(shape)
                             if (v, ax) in V]) == z3.sat

    # ---- wishes ----
    def _targets(self, rng, keys=None) -> list:
        """A drawn value for every input dim of ``free`` (``keys``), in random order."""
        keys = self.free if keys is None else keys
        wishes = [self._is(k, _draw(self.model.kinds[k], rng)) for k in keys]
        order = rng.permutation(len(wishes))
        return [wishes[i] for i in order]

    def _pairs(self, rng) -> list[tuple]:
        """Pairs of free input dims of one family (sizes, spatial, kernel), in random order, as
        (p, q, p != q, p == q)."""
        if self._pair_terms is None:
            fam, V = (lambda k: FAMILY[self.model.kinds[k]]), self.model.vars  # noqa: E731
            self._pair_terms = [(p, q, V[p] != V[q], V[p] == V[q])
                                for p, q in itertools.combinations(self.free, 2) if fam(p) == fam(q)]
        order = rng.permutation(len(self._pair_terms)) if self._pair_terms else []
        return [self._pair_terms[i] for i in order]

    def _apart(self, rng, avoid_one: bool) -> list:
        """Every pair of dims of a family differs (where the constraints let it), dims avoid 1."""
        wishes = [ne for _p, _q, ne, _eq in self._pairs(rng)]
        if avoid_one:
            wishes += [self.model.vars[k] >= 2 for k in self.free]
        return wishes + self._targets(rng)

    def _together(self, rng, how_many: int | None) -> list:
        """Random pairs of same-family dims coincide (``None``: all of them)."""
        pairs = self._pairs(rng)
        if how_many is not None:
            pairs = pairs[:how_many]
        return [eq for _p, _q, _ne, eq in pairs] + self._targets(rng)

    def _perturb(self, rng) -> list:
        """One dim of an earlier sample moved (first wish), the rest kept where they can be."""
        base = self._found[int(rng.integers(len(self._found)))]
        k = self.free[int(rng.integers(len(self.free)))]
        old, kind = base[k], self.model.kinds[k]
        choices = sorted({old - 1, old + 1, old + 2, _draw(kind, rng)} - {old})
        new = max(1, int(rng.choice(choices)))
        rest = [self._is(q, base[q]) for q in self.free if q != k]
        order = rng.permutation(len(rest)) if rest else []
        return [self._is(k, new)] + [rest[i] for i in order]

    # ---- sampling ----
    def samples(self, rng: np.random.Generator, n: int = 24, max_tries: int | None = None) -> Iterator[dict]:
        """Yield up to ``n`` distinct input shapes (var -> tuple) where both sides type-check with equal
        output shapes; stop after ``max_tries`` solver solutions (default ``4 * n``)."""
        if not self.feasible:
            return
        max_tries = 4 * n if max_tries is None else max_tries
        plan = ["random", "apart1", "random", "apart", "together-all", "random"]
        got = tries = 0
        while got < n and tries < max_tries:
            step = plan[tries] if tries < len(plan) else None
            tries += 1
            if step is None:
                u = rng.random()
                if not self._found or not self.keys:
                    u = min(u, 0.59)
                step = ("random" if u < 0.35 else "together" if u < 0.5 else "apart" if u < 0.6 else "perturb")
            if step == "random":
                wishes = self._targets(rng)
            elif step == "apart1":
                wishes = self._apart(rng, avoid_one=True)
            elif step == "apart":
                wishes = self._apart(rng, avoid_one=False)
            elif step == "together-all":
                wishes = self._together(rng, None)
            elif step == "together":
                wishes = self._together(rng, int(rng.integers(1, 4)))
            else:
                wishes = self._perturb(rng)
            model = self._solve(wishes)
            if model is None:
                continue
            vals = self._values(model)
            shapes = self._shapes(vals)
            key = tuple(sorted(shapes.items()))
            if key in self._seen:
                continue
            self._seen.add(key)
            self.candidates += 1
            why = check_shapes(self.a, self.b, shapes, self.stride)
            if why is not None:
                self.rejected += 1
                if len(self.rejections) < 5:
                    self.rejections.append((shapes, why))
                continue
            self.accepted += 1
            if not self._found:
                self._classes(vals)
            self._found.append(vals)
            got += 1
            yield shapes


def strides_of(a: G.Graph, b: G.Graph) -> list:
    """The strides to sample a rule at: both of ``SYMBOLIC_STRIDES`` for a rule with ``strides="s"``."""
    return list(SYMBOLIC_STRIDES) if G.has_symbolic_stride(a, b) else [None]


def sample_rule(a: G.Graph, b: G.Graph, inputs: dict, rng: np.random.Generator, n: int = 24) -> dict:
    """Samples at every stride the rule is stated for: ``{stride: (ShapeSampler, [shapes, ...])}``."""
    out = {}
    for stride in strides_of(a, b):
        s = ShapeSampler(a, b, inputs, stride)
        out[stride] = (s, list(s.samples(rng, n)))
    return out
