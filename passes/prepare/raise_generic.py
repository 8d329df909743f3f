"""Generic ONNX ops that are `taso` ops in disguise, raised before the search (the conversion keeps
them as they are, so that a round trip gives back the input's operators).

- ``views_to_reshapes``: ``Squeeze``, ``Unsqueeze`` and ``Flatten`` on static types only restate the
  shape (the elements keep their order): ``taso.reshape``, which the rules and ``lift_layout``
  compose and move (an ``Unsqueeze -> Transpose -> Squeeze`` chain, a ``Flatten`` before a matmul).
- ``gathers_to_split``: gathers of every index of an axis, each at a constant index, become one
  ``taso.split``. torch's ``nn.MultiheadAttention`` computes queries, keys and values with one
  packed projection and takes them apart with ``unflatten -> transpose -> Gather(0), Gather(1),
  Gather(2)`` (``unbind`` exports alike). Three generic ``Gather`` ops hide from the search and from
  the layout lifting that the three tensors are the pieces of one: as a split (pieces of size 1 on
  the axis, each reshaped to drop it where the index is a scalar) they are data movement the rules
  and ``lift_layout`` see through. Only groups that use every index are raised: the split then
  moves the bytes the gathers move (a gather of a few rows of a large tensor stays one).

Identity: ``Gather(X, i, axis)`` with a one-element index is piece ``i`` of ``split(X, axis, [1] * n)``
(``n = X.shape[axis]``) reshaped to the Gather's result; Squeeze, Unsqueeze and Flatten are reshapes
(ONNX defines them so: the flat, row-major order of the elements is kept).

Conditions (``_index``, ``gathers_to_split``, ``views_to_reshapes``):
- a Gather: static data of rank >= 1 and a static result; the index a constant integer weight of
  one element, of any shape (``[]`` drops the axis, ``[1]`` keeps it with size 1, ``[1, 1]`` puts
  two size-1 axes in its place: the row-major order is the piece's in each case, so the reshape to
  the result type is right); a negative axis counts from the end (``axis + rank``), a negative index
  from the end of the axis (``i + n``), and either out of range leaves the Gather alone
  (``gather_position``); no attribute but ``axis``; the ONNX domain;
- a group: the Gathers of one tensor on one axis whose indices cover every index ``0..n-1``,
  ``2 <= n <= 16``; repeated indices are fine (each Gather reads its piece); the data's element
  type one the ``taso`` ops take (``TASO_ELEMS``; a complex or float8 tensor is left alone: its
  split would not be a valid ``taso`` op);
- a view: static operand and result of one element type (in ``TASO_ELEMS``), axes constants (or
  absent), no other attributes.
``prove()`` proves the Gather identity on every small shape, every index shape, axis and index
(negative ones through ``gather_position``).
"""

from __future__ import annotations

import math

from taso_mlir.dialect.handles import check_live, each_live, erase_op, ir_step, ops_of, replace_uses
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import TASO_ELEMS, create_taso_op, dense_array, named
from taso_mlir.dialect.specs import MAX_ARITY
from taso_mlir.passes.ir_util import static_shape, defining_op, tensor_like
from taso_mlir.passes.pipeline import FuncState, FunctionPass



def _index(op: ir.Operation):
    """(data, axis, index) of a generic Gather at one constant index (a 0-d or one-element index weight)
    on a static tensor, else None."""
    if op.name != "onnx.Gather" or len(op.operands) != 2 or len(op.results) != 1 \
            or "taso.domain" in op.attributes:
        return None
    data, idx = op.operands
    shape, w = static_shape(data), defining_op(idx)
    if shape is None or not shape or w is None or w.name != "taso.weight" or static_shape(op.results[0]) is None:
        return None
    if str(ir.RankedTensorType(data.type).element_type) not in TASO_ELEMS:
        return None  # (its split would not be a taso op)
    arr = dense_array(w.attributes["value"])
    if arr.size != 1 or arr.dtype.kind not in "iu":
        return None
    attrs = {na.name: na.attr for na in named(op.attributes)}
    if set(attrs) - {"axis"}:
        return None
    pos = gather_position(shape, ir.IntegerAttr(attrs["axis"]).value if "axis" in attrs else 0, int(arr.reshape(-1)[0]))
    return None if pos is None else (data, *pos)


def gather_position(shape: list, axis: int, index: int):
    """(axis, index) of a Gather on a tensor of ``shape``, negative ones counted from the end (ONNX),
    or None where either is out of range."""
    axis += len(shape) if axis < 0 else 0
    if not 0 <= axis < len(shape):
        return None
    index += shape[axis] if index < 0 else 0
    if not 0 <= index < shape[axis]:
        return None
    return axis, index


def split_sizes(shape: list, axis: int) -> list:
    """The sizes of the split that replaces the gathers of every index of ``axis``: one index a piece."""
    return [1] * shape[axis]


def piece_of(sizes: list, index: int) -> int:
    """The piece of that split holding the elements at ``index`` on its axis."""
    start = 0
    for k, n in enumerate(sizes):
        if start <= index < start + n:
            return k
        start += n
    raise IndexError(index)


@ir_step
def gathers_to_split(f: ir.Operation) -> int:
    """Raise each group of Gathers of one tensor on one axis that uses every index (2 to MAX_ARITY of
    them) to a split; returns the number of Gathers replaced (erased)."""
    block = f.regions[0].blocks[0]
    groups: dict = {}  # (data, axis) -> [(op, index)]
    for o in block.operations:
        op = o.operation
        got = _index(op)
        if got is not None:
            groups.setdefault(got[:2], []).append((op, got[2]))
    done = 0
    # (each Gather is in one group, and only its group's raise erases it; the values the groups were
    # keyed by are not read again)
    for (_data, axis), members in list(groups.items()):
        for op, _i in members:
            check_live(op, "a Gather of a group found before the raises")
        # the data as it is now: raising an earlier group can have replaced it (an unbind of an
        # unbind's piece), and the key's value is then gone
        data = members[0][0].operands[0]
        shape = static_shape(data)
        n = shape[axis]
        if not 2 <= n <= MAX_ARITY or {i for _op, i in members} != set(range(n)):
            continue
        sizes = split_sizes(shape, axis)
        first = members[0][0]
        with ir.InsertionPoint(first):
            split = create_taso_op("split", [data], [tensor_like(shape[:axis] + [k] + shape[axis + 1:], data)
                                                     for k in sizes], {"axis": axis, "sizes": sizes},
                                   loc=first.location)
        for op, i in members:
            v = split.results[piece_of(sizes, i)]
            if op.results[0].type != v.type:
                with ir.InsertionPoint(op):
                    v = create_taso_op("reshape", [v], [op.results[0].type], {"shape": static_shape(op.results[0])},
                                       loc=op.location).results[0]
            replace_uses(op.results[0], v)
            erase_op(op)
            done += 1
    return done


#: generic ops that only restate their operand's shape (with static types), and the attributes they may carry
_VIEWS = {"onnx.Squeeze": {"axes"}, "onnx.Unsqueeze": {"axes"}, "onnx.Flatten": {"axis"}}


@ir_step
def views_to_reshapes(f: ir.Operation) -> int:
    """Replace each Squeeze, Unsqueeze and Flatten between static types whose axes are constants by a
    ``taso.reshape``; returns the number replaced (erased)."""
    done = 0
    for op in each_live(ops_of(f.regions[0].blocks[0])):  # (an op is erased only when the walk is at it)
        allowed = _VIEWS.get(op.name)
        if allowed is None or "taso.domain" in op.attributes or len(op.results) != 1 or not len(op.operands) \
                or {na.name for na in named(op.attributes)} - allowed:
            continue
        if any(str(v.type) != "none" and (defining_op(v) is None or defining_op(v).name != "taso.weight")
               for v in list(op.operands)[1:]):
            continue  # axes computed at run time: onnxruntime checks them; a reshape would not
        x, out = op.operands[0], static_shape(op.results[0])
        if str(x.type) == "none" or static_shape(x) is None or out is None or x.type != op.results[0].type and \
                ir.RankedTensorType(x.type).element_type != ir.RankedTensorType(op.results[0].type).element_type \
                or str(ir.RankedTensorType(x.type).element_type) not in TASO_ELEMS:
            continue
        with ir.InsertionPoint(op):
            r = create_taso_op("reshape", [x], [op.results[0].type], {"shape": out}, loc=op.location)
        replace_uses(op.results[0], r.results[0])
        erase_op(op)
        done += 1
    return done


# ---------------------------------------------------------------------------------------------
# proof


def prove(max_rank: int = 3, max_dim: int = 4) -> tuple:
    """Z3 proof, for every shape of up to ``max_rank`` axes of size 1..``max_dim``, every axis of size
    >= 2 and every index on it, each given also as a negative number (``gather_position``), that
    element ``m`` of ``Gather(X, index, axis)`` (a scalar index: the axis is dropped; a one-element
    index of rank 1 or 2: one or two axes of size 1 in its place) is element ``m`` of the reshaped piece
    ``piece_of(split_sizes(...), index)`` of the split, for a symbolic tensor ``X`` (an uninterpreted
    function of the flat index) and a symbolic in-range index ``m``. (``views_to_reshapes`` needs
    none: ONNX defines Squeeze, Unsqueeze and Flatten as reshapes, which keep the flat index.)
    Returns ``(z3.unsat, cases checked)`` (proved) or ``(the first other result, the case)``."""
    import itertools

    import z3

    from taso_mlir.passes.cleanup.lift_layout import flat_index, unflat_index

    X = z3.Function("X", z3.IntSort(), z3.RealSort())
    cases = 0
    for rank in range(1, max_rank + 1):
        for shape in itertools.product(range(1, max_dim + 1), repeat=rank):
            shape = list(shape)
            for given_axis in range(-rank, rank):
                if shape[given_axis] < 2:
                    continue
                for given_index in range(-shape[given_axis], shape[given_axis]):
                    pos = gather_position(shape, given_axis, given_index)
                    # (ONNX: a negative axis or index counts from the end)
                    if pos != (given_axis % rank, given_index % shape[given_axis]):
                        return z3.sat, ("position", shape, given_axis, given_index)
                    if given_axis < 0 or given_index < 0:
                        continue  # (the element identity at that position is checked once, below)
                    axis, index = pos
                    sizes = split_sizes(shape, axis)
                    if sum(sizes) != shape[axis]:
                        return z3.sat, ("split sizes", shape, axis, sizes)
                    k = piece_of(sizes, index)
                    piece = shape[:axis] + [sizes[k]] + shape[axis + 1:]
                    for keep in (0, 1, 2):  # the index's rank: the Gather puts that many axes of size 1 there
                        out = shape[:axis] + [1] * keep + shape[axis + 1:]
                        if math.prod(out) != math.prod(piece):
                            return z3.sat, ("reshape size", shape, axis, index, keep)
                        m = [z3.Int(f"m{d}") for d in range(len(out))]
                        # ONNX: out[a.., j.., b..] = X[a.., index[j..], b..] (j.. all 0)
                        src = m[:axis] + [z3.IntVal(index)] + m[axis + keep:]
                        lhs = flat_index(src, shape)
                        pidx = unflat_index(flat_index(m, out), piece)  # reshape keeps the flat index
                        pidx[axis] = pidx[axis] + sum(sizes[:k])
                        rhs = flat_index(pidx, shape)
                        sv = z3.Solver()
                        sv.add(*[z3.And(v >= 0, v < n) for v, n in zip(m, out)])
                        sv.add(X(lhs) != X(rhs))
                        r = sv.check()
                        cases += 1
                        if r != z3.unsat:
                            return r, ("gather", shape, given_axis, given_index, keep)
    return z3.unsat, cases


def _run_views(st: FuncState) -> None:
    st.count("views_raised", views_to_reshapes(st.f))


def _run_gathers(st: FuncState) -> None:
    st.count("gathers_raised", gathers_to_split(st.f))


VIEWS = FunctionPass("taso-raise-views", "Squeeze/Unsqueeze/Flatten with static shapes as taso.reshape",
                     _run_views, {"views_raised": "Squeeze/Unsqueeze/Flatten raised to reshapes"})
GATHERS = FunctionPass("taso-raise-gathers", "Gathers of every index of an axis as one taso.split",
                       _run_gathers, {"gathers_raised": "Gathers of every index of an axis raised to splits"})
