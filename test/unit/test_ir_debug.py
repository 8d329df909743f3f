"""erase_op and the IR debug mode (dialect/handles.py, TASO_DEBUG_IR=1, on in the test suite): an op
still used is never erased; in debug mode an erased op stays readable until the outermost step ends,
any use of it (a new op, an operand set, a use replaced, a second erasure, an op left reading it) is a
one-line internal error naming the step, and so is a step that leaves IR the verifier or the specs
refuse; outside debug mode an erased op is freed at once."""

from __future__ import annotations

import gc

import pytest

from taso_mlir.dialect import handles as H
from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.ops import create_taso_op, function_dce

T = "tensor<2x4xf32>"
TEXT = f"""func.func @f(%x: {T}) -> {T} {{
  %a = "taso.relu"(%x) : ({T}) -> {T}
  %b = "taso.relu"(%a) : ({T}) -> {T}
  %c = "taso.sigmoid"(%b) : ({T}) -> {T}
  return %c : {T}
}}"""


@pytest.fixture
def debug(monkeypatch):
    monkeypatch.setenv(H.ENV, "1")


def _parse(text=TEXT):
    m = ir.Module.parse(text)
    f = m.body.operations[0].operation
    return m, f, [o.operation for o in f.regions[0].blocks[0].operations]


def _names(f):
    return [o.operation.name for o in f.regions[0].blocks[0].operations]


@pytest.mark.parametrize("mode", ["0", "1"])
def test_an_op_still_used_is_not_erased(monkeypatch, mode):
    monkeypatch.setenv(H.ENV, mode)
    with make_context(), ir.Location.unknown():
        m, f, (a, b, c, ret) = _parse()
        with pytest.raises(TasoError, match=r"^internal error: erasing 'taso.relu' at .* whose result #0 is still "
                                            r"used by 'taso.relu' at .*\(in no pass step\)$"):
            H.erase_op(a)
        with H.step("s", f), pytest.raises(TasoError, match=r"still used by 'taso.sigmoid'.*\(in s\)$"):
            H.erase_op(b)
        assert _names(f) == ["taso.relu", "taso.relu", "taso.sigmoid", "func.return"]
        assert m.operation.verify()


def test_a_stale_handle_stays_readable_and_every_use_of_it_is_caught(debug):
    with make_context(), ir.Location.unknown():
        m, f, (a, b, c, ret) = _parse()
        b_result = b.results[0]
        with H.step("outer", f):
            with H.step("inner", f):
                H.replace_uses(b.results[0], a.results[0])
                H.erase_op(b)
                assert _names(f) == ["taso.relu", "taso.sigmoid", "func.return"]
            # (the inner step ended: its erased op is kept until the outer one ends, readable through
            # the handles taken before, its block included)
            assert len(H._graveyard) == 1 and H.is_dead(b)
            assert b.name == "taso.relu" and b.block != f.regions[0].blocks[0]
            assert str(b.operands[0].type) == T and not list(b_result.uses)
            assert not list(a.results[0].uses)[1:]  # (b no longer counts as a user of a)
            where = r"which was erased in outer > inner \(in outer\)$"
            with pytest.raises(TasoError, match=r"^internal error: operand #0 of a new 'taso.relu' is a value of "
                                                r"'taso.relu' at .*" + where):
                create_taso_op("relu", [b_result], [b_result.type], {})
            with pytest.raises(TasoError, match=r"^internal error: operand #0 of a new 'taso.relu' is a value of "
                                                r"'builtin.unrealized_conversion_cast'"):
                create_taso_op("relu", [b.operands[0]], [b_result.type], {})  # (its operand: a placeholder)
            with pytest.raises(TasoError, match=r"the new operand #0 of 'taso.sigmoid' .* is a value of 'taso.relu'"):
                H.set_operand(c, 0, b_result)
            with pytest.raises(TasoError, match=r"an op whose operand is set is 'taso.relu' .*" + where):
                H.set_operand(b, 0, a.results[0])
            with pytest.raises(TasoError, match=r"that replaces another's uses is a value of 'taso.relu'"):
                H.replace_uses(a.results[0], b_result)
            with pytest.raises(TasoError, match=r"'taso.relu' at .* is erased a second time \(first in outer > inner\)"):
                H.erase_op(b)
            with pytest.raises(TasoError, match=r"matched op 0 of rewrite R1 is 'taso.relu'"):
                H.check_live(b, "matched op 0 of rewrite R1")
            assert _names(f) == ["taso.relu", "taso.sigmoid", "func.return"]
        assert H._graveyard == [] and not H._graveyard_module  # freed when the outermost step ended
        assert m.operation.verify()


def _buggy_user(f, a, b, c):
    """A pass with the bug this mode is for: it erases ``b`` and then makes ``c`` read it (bypassing the
    checked setters)."""
    H.replace_uses(b.results[0], a.results[0])
    H.erase_op(b)
    c.operands[0] = b.results[0]


def test_a_step_that_leaves_an_op_reading_an_erased_value_is_named(debug):
    buggy = H.ir_step(_buggy_user, name="buggy")
    with make_context(), ir.Location.unknown():
        m, f, (a, b, c, ret) = _parse()
        with pytest.raises(TasoError, match=r"^internal error: operand #0 of 'taso.sigmoid' at .* is a value of "
                                            r"'taso.relu' at .*, which was erased in buggy \(in buggy\)$"):
            buggy(f, a, b, c)
        # the step failed: the op reading the erased value reads a placeholder in its function instead, so
        # that freeing the graveyard left nothing pointing into freed memory
        assert H._graveyard == []
        assert c.operands[0].owner.name == "builtin.unrealized_conversion_cast"
        assert _names(f)[0] == "builtin.unrealized_conversion_cast"
        del a, b, c
        gc.collect()
        assert "taso.sigmoid" in str(m)


def test_a_step_that_leaves_invalid_ir_is_named(debug):
    def bad_transpose(f):  # (a result shape the spec refuses: perm [1, 0] of 2x4 is 4x2)
        block = f.regions[0].blocks[0]
        ret = list(block.operations)[-1].operation
        x = block.arguments[0]
        with ir.InsertionPoint(ret):
            t = create_taso_op("transpose", [x], [x.type], {"perm": [1, 0]})
        H.set_operand(ret, 0, t.results[0])

    with make_context(), ir.Location.unknown():
        m, f, _ = _parse()
        with pytest.raises(TasoError, match=r"^internal error: the IR is invalid after this step: .*'taso.transpose' "
                                            r"op: result shapes \[\[2, 4\]\] differ .* \(in bad_transpose\)$"):
            H.ir_step(bad_transpose)(f)
        # the same function as the input of a step: not blamed on it (function_dce leaves it as it is)
        assert function_dce(f) == 3


def test_outside_debug_mode_an_erased_op_is_freed_at_once(monkeypatch):
    monkeypatch.setenv(H.ENV, "0")
    with make_context(), ir.Location.unknown():
        m, f, (a, b, c, ret) = _parse()
        with H.step("s", f):
            H.replace_uses(b.results[0], a.results[0])
            H.erase_op(b)
            assert H._graveyard == []
        assert _names(f) == ["taso.relu", "taso.sigmoid", "func.return"]
        assert m.operation.verify()


def test_passes_run_as_steps_and_the_graveyard_is_freed(debug):
    from taso_mlir.passes.registry import build_pass_manager, run_pass_manager

    text = TEXT.replace("return %c", "%d = \"taso.tanh\"(%c) : ({T}) -> {T}\n  return %c".format(T=T))
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m, f, _ = _parse(text)
        run_pass_manager(build_pass_manager("builtin.module(taso-dce)", ctx), m.operation)
        assert _names(f) == ["taso.relu", "taso.relu", "taso.sigmoid", "func.return"]
        assert H._graveyard == [] and not H._steps


def test_an_erased_op_moved_back_into_the_function_is_caught(debug):
    def move_back(f, a, b, c):
        H.replace_uses(b.results[0], a.results[0])
        H.erase_op(b)
        b.move_before(c)  # (a stale handle used as if the op were live)
        c.operands[0] = b.results[0]

    with make_context(), ir.Location.unknown():
        m, f, (a, b, c, ret) = _parse()
        with pytest.raises(TasoError, match=r"^internal error: 'taso.relu' at .*, erased in move_back, is back in "
                                            r"the function \(in move_back\)$"):
            H.ir_step(move_back)(f, a, b, c)
        assert H._graveyard == []
        assert c.operands[0].owner.name == "builtin.unrealized_conversion_cast"
        assert "taso.relu" in _names(f) and _names(f).count("taso.relu") == 1


def test_a_walk_that_reaches_an_op_it_erased_is_caught(debug):
    text = TEXT.replace("return %c", "%d = \"taso.tanh\"(%x) : ({T}) -> {T}\n  return %c".format(T=T))

    def walk(f):  # erases an op the walk has yet to reach (outside debug mode: it would read freed memory)
        for op in H.each_live(H.ops_of(f.regions[0].blocks[0])):
            if op.name == "taso.relu" and not H.is_dead(ops[3]):
                H.erase_op(ops[3])

    with make_context(), ir.Location.unknown():
        m, f, ops = _parse(text)
        with pytest.raises(TasoError, match=r"^internal error: an op of a list taken before the walk erased any is "
                                            r"'taso.tanh' at .*, which was erased in walk \(in walk\)$"):
            H.ir_step(walk)(f)
        assert _names(f) == ["taso.relu", "taso.relu", "taso.sigmoid", "func.return"]
