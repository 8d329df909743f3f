"""``identities.drop_identities``: x + 0, x * 1 and smul(x, 1) by a constant weight are x where the
result has x's type; anything that broadcasts, any other constant, or a non-float type stays."""

from __future__ import annotations

import pytest

from taso_mlir.dialect.mlir import ir

from taso_mlir.dialect.context import make_context
from taso_mlir.passes.prepare import identities as I


def _run(body: str, args: str, ret: str) -> tuple[int, str]:
    text = f"func.func @f({args}) -> {ret} {{\n{body}\n}}"
    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(text)
        n = I.drop_identities(m.body.operations[0].operation)
        assert m.operation.verify()
        return n, str(m)


def _w(name, shape, value, et="f32"):
    t = f"tensor<{shape}x{et}>" if shape else f"tensor<{et}>"
    return f'%{name} = "taso.weight"() {{name = "{name}", value = dense<{value}> : {t}}} : () -> {t}'


@pytest.mark.parametrize("op,value", [("ewadd", "0.0"), ("ewmul", "1.0")])
@pytest.mark.parametrize("const_first", [False, True])
def test_identity_is_dropped(op, value, const_first):
    a, b = ("%c", "%x") if const_first else ("%x", "%c")
    n, text = _run(f'{_w("c", "2x4", value)}\n%y = "taso.{op}"({a}, {b}) : (tensor<2x4xf32>, tensor<2x4xf32>) -> '
                   f'tensor<2x4xf32>\nreturn %y : tensor<2x4xf32>', "%x: tensor<2x4xf32>", "tensor<2x4xf32>")
    assert n == 1 and f"taso.{op}" not in text and "return %arg0" in text


def test_a_non_splat_zero_weight_and_smul_by_one():
    n, text = _run(f'{_w("c", "2x2", "[[0.0, 0.0], [0.0, 0.0]]")}\n{_w("s", "", "1.0")}\n'
                   '%y = "taso.ewadd"(%x, %c) : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>\n'
                   '%z = "taso.smul"(%y, %s) : (tensor<2x2xf32>, tensor<f32>) -> tensor<2x2xf32>\n'
                   'return %z : tensor<2x2xf32>', "%x: tensor<2x2xf32>", "tensor<2x2xf32>")
    assert n == 2 and "return %arg0" in text


@pytest.mark.parametrize("case", ["broadcast", "nonzero", "one_in_add", "integer"])
def test_what_is_not_an_identity_stays(case):
    if case == "broadcast":  # x (1, 4) + zeros (2, 4) is (2, 4): not x
        body = (f'{_w("c", "2x4", "0.0")}\n%y = "taso.ewadd"(%x, %c) : (tensor<1x4xf32>, tensor<2x4xf32>) -> '
                'tensor<2x4xf32>\nreturn %y : tensor<2x4xf32>')
        args, ret = "%x: tensor<1x4xf32>", "tensor<2x4xf32>"
    elif case == "integer":
        body = (f'{_w("c", "2x4", "0", "i32")}\n%y = "taso.ewadd"(%x, %c) : (tensor<2x4xi32>, tensor<2x4xi32>) -> '
                'tensor<2x4xi32>\nreturn %y : tensor<2x4xi32>')
        args, ret = "%x: tensor<2x4xi32>", "tensor<2x4xi32>"
    else:
        value = "[[0.0, 0.0, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0]]" if case == "nonzero" else "1.0"
        body = (f'{_w("c", "2x4", value)}\n%y = "taso.ewadd"(%x, %c) : (tensor<2x4xf32>, tensor<2x4xf32>) -> '
                'tensor<2x4xf32>\nreturn %y : tensor<2x4xf32>')
        args, ret = "%x: tensor<2x4xf32>", "tensor<2x4xf32>"
    n, text = _run(body, args, ret)
    assert n == 0 and "taso.ewadd" in text


def test_the_identities_are_proved():
    import z3

    assert I.prove() == z3.unsat
