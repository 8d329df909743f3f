"""Bad input to taso-opt: one clear line on stderr and exit 1 (never an internal error, a traceback or
an invalid output file), found by mutation fuzzing. Inputs that abort the MLIR library are in
test/Diagnostics/unreadable.mlir (a lit test, so that a regression cannot take pytest down with it)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from taso_mlir.tools.taso_opt import main


def run(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    return rc, err


def expect_error(capsys, tmp_path, text: str, suffix: str, want: str, *flags, out: str = "out.onnx"):
    src = tmp_path / f"in{suffix}"
    if isinstance(text, bytes):
        src.write_bytes(text)
    else:
        src.write_text(text)
    before = src.read_bytes()
    rc, err = run(capsys, src, "-o", tmp_path / out, *flags)
    lines = err.strip().splitlines()
    assert rc == 1, err
    assert len(lines) == 1 and lines[0].startswith("taso-opt: error: ") and "internal error" not in err, err
    assert want in lines[0], err
    assert not (tmp_path / out).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".taso-")]
    assert src.read_bytes() == before


def fn(body: str, args: str = "%x: tensor<2xf32>", results: str = "tensor<2xf32>", attrs: str = "",
       ret: str = "%x") -> str:
    a = f" attributes {{{attrs}}}" if attrs else ""
    return (f"func.func @g({args}) -> {results}{a} {{\n{body}\n  return {ret} : {results}\n}}\n")


# ---------------------------------------------------------------------------------------------
# MLIR -> ONNX: what the exporter cannot write faithfully


EXPORT_CASES = {
    # onnx-mlir's form without --convert-onnx-to-taso used to come out with a "Return" node and its
    # onnx_node_name attributes
    "onnx-mlir form": ('func.func @g(%x: tensor<2xf32>) -> tensor<2xf32> {\n'
                       '  %0 = "onnx.Relu"(%x) : (tensor<2xf32>) -> tensor<2xf32>\n'
                       '  "onnx.Return"(%0) : (tensor<2xf32>) -> ()\n}\n'
                       '"onnx.EntryPoint"() {func = @g} : () -> ()\n',
                       "outside the graph function cannot be exported to ONNX (onnx-mlir's form; convert it"),
    "onnx-mlir node name": (fn('  %q = "onnx.Relu"(%x) {onnx_node_name = "r"} : (tensor<2xf32>) -> tensor<2xf32>',
                               ret="%q"), "in onnx-mlir's form; convert it with --convert-onnx-to-taso first"),
    "op outside the function": (fn("") + '"onnx.Relu"() : () -> ()\n', "operation 'onnx.Relu' outside the graph"),
    "declaration": ("func.func private @ext(tensor<2xf32>) -> tensor<2xf32>\n", "declaration without a body"),
    "importer form": ("func.func @g(%x: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {\n"
                      "  return %x : !torch.vtensor<[2],f32>\n}\n",
                      "the ONNX importer's form; convert it with --convert-onnx-to-taso first"),
    "region": (fn('  %q = "onnx.Foo"(%x) ({\n  ^bb0:\n    "onnx.Yield"() : () -> ()\n  }) : '
                  '(tensor<2xf32>) -> tensor<2xf32>', ret="%q"), "has regions (subgraphs)"),
    "memref value": (fn('  %q = "onnx.Relu"(%x) : (tensor<2xf32>) -> memref<2xf32>'),
                     "has type memref<2xf32>, which ONNX cannot hold"),
    "i4 value": (fn('  %q = "onnx.Cast"(%x) {to = 22 : si64} : (tensor<2xf32>) -> tensor<2xi4>'),
                 "has type tensor<2xi4>, which ONNX cannot hold"),
    "i4 weight": (fn('  %w = "taso.weight"() {name = "w", value = dense<1> : tensor<2xi4>} : () -> tensor<2xi4>',
                     results="tensor<2xi4>", args="", ret="%w"), "'taso.weight' op: element type i4 is not supported"),
    "bf16 weight data": (fn('  %w = "taso.weight"() {name = "w", value = dense<1.0> : tensor<2xbf16>} : () -> '
                            'tensor<2xbf16>', results="tensor<2xbf16>", args="", ret="%w"),
                         "element type bf16 is not supported"),
    "huge splat weight": (fn('  %w = "taso.weight"() {name = "w", value = dense<1.0> : tensor<99999999999x99999999999'
                             'xf32>} : () -> tensor<99999999999x99999999999xf32>',
                             results="tensor<99999999999x99999999999xf32>", args="", ret="%w"), "is too large"),
    "huge constant op": (fn('  %w = "taso.const_imatmul"() : () -> tensor<9999999x9999999xf32>',
                            results="tensor<9999999x9999999xf32>", args="", ret="%w"), "is too large to write out"),
    "huge splat attribute": (fn('  %q = "onnx.Constant"() {value = dense<1.0> : tensor<9223372036854775807x3xf32>} : '
                                '() -> tensor<4xf32>', results="tensor<4xf32>", args="", ret="%q"), "is too large"),
    "opset_imports not a dictionary": (fn("", attrs="taso.opset_imports = 3"),
                                       "taso.opset_imports must be a dictionary"),
    "opset version not an integer": (fn("", attrs='taso.opset_imports = {ai.onnx = "x"}'),
                                     "opset version of 'ai.onnx' must be an integer"),
    "opset version an array": (fn("", attrs="taso.opset_imports = {ai.onnx = array<i32: 1, 1>}"),
                               "opset version of 'ai.onnx' must be an integer"),
    "ir_version too wide": (fn("", attrs="taso.ir_version = 99999999999999999999 : i128"),
                            "taso.ir_version 99999999999999999999 : i128 is out of range"),
    "ir_version a string": (fn("", attrs='taso.ir_version = "x"'), "taso.ir_version must be an integer"),
    "input names not strings": (fn("", attrs="taso.input_names = [1], taso.output_names = [2]"),
                                "an element of taso.input_names must be a string"),
    "output names not a list": (fn("", attrs="taso.output_names = 3"), "taso.output_names must be an array"),
    "domain not a string": (fn('  %q = "onnx.Relu"(%x) {taso.domain = 1 : i64} : (tensor<2xf32>) -> tensor<2xf32>',
                               ret="%q"), "attribute 'taso.domain' must be a string"),
    "attr_types not a string": (fn('  %q = "onnx.Relu"(%x) {taso.attr_types = 7 : i64} : (tensor<2xf32>) -> '
                                   'tensor<2xf32>', ret="%q"), "attribute 'taso.attr_types' must be a string"),
    "INT attribute given a string": (fn('  %q = "onnx.Softmax"(%x) {axis = "x"} : (tensor<2xf32>) -> tensor<2xf32>',
                                        ret="%q"), "the operator's schema wants INT"),
    "INT attribute given a float": (fn('  %q = "onnx.Softmax"(%x) {axis = 1.5 : f32} : (tensor<2xf32>) -> '
                                       'tensor<2xf32>', ret="%q"), "the operator's schema wants INT"),
    "INT attribute given an array": (fn('  %q = "onnx.Softmax"(%x) {axis = array<i32: 1, 1>} : (tensor<2xf32>) -> '
                                        'tensor<2xf32>', ret="%q"), "the operator's schema wants INT"),
    "FLOAT attribute given a string": (fn('  %q = "onnx.Elu"(%x) {alpha = "x"} : (tensor<2xf32>) -> tensor<2xf32>',
                                          ret="%q"), "the operator's schema wants FLOAT"),
    "INT attribute too wide": (fn('  %q = "onnx.Softmax"(%x) {axis = 99999999999999999999999 : i128} : '
                                  '(tensor<2xf32>) -> tensor<2xf32>', ret="%q"), "cannot export attribute 'axis'"),
    "bf16 dense attribute": (fn('  %q = "onnx.Relu"(%x) {foo = dense<1.0> : tensor<2xbf16>} : (tensor<2xf32>) -> '
                                'tensor<2xf32>', ret="%q"), "element type bf16 is not supported"),
    "functions attribute not an array": ('module attributes {taso.onnx_functions = 1} {\n' + fn("") + "}\n",
                                         "is not a list of ONNX functions"),
    # the checker and ONNX shape inference on the exported model
    "unknown attribute": (fn('  %q = "onnx.Relu"(%x) {foo} : (tensor<2xf32>) -> tensor<2xf32>', ret="%q"),
                          "would not be valid: Unrecognized attribute: foo for operator Relu"),
    "Conv with one input": (fn('  %q = "onnx.Conv"(%x) : (tensor<2xf32>) -> tensor<2xf32>', ret="%q"),
                            "would not be valid: Node(Conv) with schema(::Conv:11) has input size 1"),
    "too few inputs": (fn('  %q = "onnx.Gemm"(%x) : (tensor<2xf32>) -> tensor<2xf32>', ret="%q"),
                       "would not be valid: Node(Gemm) with schema(::Gemm:13) has input size 1"),
    "axis out of range": (fn('  %q = "onnx.Softmax"(%x) {axis = 7 : si64} : (tensor<2xf32>) -> tensor<2xf32>',
                             ret="%q"), "would not be valid: [ShapeInferenceError]"),
    "result type contradicts ONNX": (fn('  %q = "onnx.Neg"(%x) : (tensor<2xf32>) -> tensor<3xf32>',
                                        results="tensor<3xf32>", ret="%q"), "would not be valid: [ShapeInferenceError]"),
    "output name empty": (fn("", attrs='taso.input_names = ["a"], taso.output_names = [""]'),
                          "would not be valid"),
}


@pytest.mark.parametrize("case", sorted(EXPORT_CASES))
def test_mlir_to_onnx_rejects(case, capsys, tmp_path):
    text, want = EXPORT_CASES[case]
    expect_error(capsys, tmp_path, text, ".mlir", want)


def test_location_names_that_are_not_utf8_export(capsys, tmp_path):
    src = tmp_path / "in.mlir"
    src.write_text(fn('  %q = "taso.relu"(%x) : (tensor<2xf32>) -> tensor<2xf32> loc("\\FF\\FE")', ret="%q",
                      args='%x: tensor<2xf32> loc("\\FF")'))
    rc, err = run(capsys, src, "-o", tmp_path / "out.onnx")
    assert rc == 0, err
    onnx.checker.check_model(onnx.load(tmp_path / "out.onnx"), full_check=True)


# ---------------------------------------------------------------------------------------------
# convert-onnx-to-taso on malformed importer / onnx-mlir input


def vt(dims, elem="f32") -> str:
    return f"!torch.vtensor<[{','.join(map(str, dims))}],{elem}>"


CONVERT_CASES = {
    "Constant value of another shape": (
        f'func.func @g() -> {vt([3])} {{\n  %0 = torch.operator "onnx.Constant"() {{torch.onnx.value = dense<1.0> : '
        f'tensor<2xf32>}} : () -> {vt([3])}\n  return %0 : {vt([3])}\n}}\n',
        "the value's type tensor<2xf32> differs from the result type tensor<3xf32>"),
    "Constant value_ints of another shape": (
        f'func.func @g() -> {vt([3], "si64")} {{\n  %0 = torch.operator "onnx.Constant"() {{torch.onnx.value_ints = '
        f'[1 : si64, 2 : si64]}} : () -> {vt([3], "si64")}\n  return %0 : {vt([3], "si64")}\n}}\n',
        "the value's type tensor<2xsi64> differs from the result type tensor<3xsi64>"),
    "Constant value_float a string": (
        f'func.func @g() -> {vt([])} {{\n  %0 = torch.operator "onnx.Constant"() {{torch.onnx.value_float = "x"}} : '
        f'() -> {vt([])}\n  return %0 : {vt([])}\n}}\n', "attribute 'value_float' has the wrong kind"),
    "Constant without result": (
        f'func.func @g() -> {vt([3])} {{\n  torch.operator "onnx.Constant"() {{torch.onnx.value = dense<1.0> : '
        f'tensor<3xf32>}} : () -> ()\n  %0 = torch.operator "onnx.Constant"() {{torch.onnx.value = dense<1.0> : '
        f'tensor<3xf32>}} : () -> {vt([3])}\n  return %0 : {vt([3])}\n}}\n', "a Constant has no operands, one result"),
    "dense_resource blob too short": (
        f'func.func @g() -> {vt([4])} {{\n  %0 = torch.operator "onnx.Constant"() {{torch.onnx.value = '
        f'dense_resource<r> : tensor<4xf32>}} : () -> {vt([4])}\n  return %0 : {vt([4])}\n}}\n'
        '{-#\n  dialect_resources: {\n    builtin: {\n      r: "0x0400000000000000"\n    }\n  }\n#-}\n',
        "dense_resource blob 'r' holds 4 bytes, which do not make a tensor<4xf32>"),
    "Identity changing the type": (
        f'func.func @g(%x: {vt([2])}) -> {vt([3], "si64")} {{\n  %0 = torch.operator "onnx.Identity"(%x) : '
        f'({vt([2])}) -> {vt([3], "si64")}\n  return %0 : {vt([3], "si64")}\n}}\n',
        "Identity changes the type tensor<2xf32> to tensor<3xsi64>"),
    "domain not a string": (
        f'func.func @g(%x: {vt([2])}) -> {vt([2])} {{\n  %0 = torch.operator "onnx.Relu"(%x) '
        f'{{torch.onnx.taso_domain = 1 : si64}} : ({vt([2])}) -> {vt([2])}\n  return %0 : {vt([2])}\n}}\n',
        "attribute 'torch.onnx.taso_domain' must be a string"),
    "attribute without the torch.onnx prefix": (
        f'func.func @g(%x: {vt([2])}) -> {vt([2])} {{\n  %0 = torch.operator "onnx.Relu"(%x) {{alpha = 1.0 : f32}} '
        f': ({vt([2])}) -> {vt([2])}\n  return %0 : {vt([2])}\n}}\n',
        "torch.operator attribute 'alpha' is not an ONNX attribute"),
    "opset_version a string": (
        f'func.func @g(%x: {vt([2])}) -> {vt([2])} attributes {{torch.onnx_meta.opset_version = "x"}} {{\n'
        f'  return %x : {vt([2])}\n}}\n', "torch.onnx_meta.opset_version must be an integer"),
    "opset_versions not a dictionary": (
        f'func.func @g(%x: {vt([2])}) -> {vt([2])} attributes {{torch.onnx_meta.opset_versions = [1]}} {{\n'
        f'  return %x : {vt([2])}\n}}\n', "torch.onnx_meta.opset_versions must be a dictionary"),
    "input names of the wrong count": (
        fn("", attrs='taso.input_names = ["a", "b"]'), "taso.input_names has 2 names for 1 function arguments"),
    "onnx.name not a string": (
        'func.func @g(%x: tensor<2xf32> {onnx.name = 3}) -> tensor<2xf32> {\n'
        '  %0 = "onnx.Relu"(%x) : (tensor<2xf32>) -> tensor<2xf32>\n  "onnx.Return"(%0) : (tensor<2xf32>) -> ()\n}\n',
        "argument/result attribute 'onnx.name' must be a string"),
    "onnx_node_name not a string": (
        'func.func @g(%x: tensor<2xf32>) -> tensor<2xf32> {\n'
        '  %0 = "onnx.Relu"(%x) {onnx_node_name = 3 : i64} : (tensor<2xf32>) -> tensor<2xf32>\n'
        '  "onnx.Return"(%0) : (tensor<2xf32>) -> ()\n}\n', "attribute 'onnx_node_name' must be a string"),
    "Custom function_name not a string": (
        fn('  %q = "onnx.Custom"(%x) {function_name = 3 : i64} : (tensor<2xf32>) -> tensor<2xf32>', ret="%q"),
        "attribute 'function_name' must be a string"),
    "two returns": (
        'func.func @g(%x: tensor<2xf32>) -> tensor<2xf32> {\n  "onnx.Return"(%x) : (tensor<2xf32>) -> ()\n'
        '  %0 = "onnx.Relu"(%x) : (tensor<2xf32>) -> tensor<2xf32>\n  "onnx.Return"(%0) : (tensor<2xf32>) -> ()\n}\n',
        "a second 'onnx.Return' in the function"),
    "returns what it does not declare": (
        'func.func @g(%x: tensor<2xf32>) -> tensor<2xf32> {\n'
        '  "onnx.Return"(%x, %x) : (tensor<2xf32>, tensor<2xf32>) -> ()\n}\n',
        "the function returns (tensor<2xf32>, tensor<2xf32>) but is declared to return (tensor<2xf32>)"),
    "onnx.Return with a result": (
        'func.func @g(%x: tensor<2xf32>) -> tensor<2xf32> {\n'
        '  %0 = "onnx.Return"(%x) : (tensor<2xf32>) -> tensor<2xf32>\n'
        '  %1 = "onnx.Neg"(%0) : (tensor<2xf32>) -> tensor<2xf32>\n  "onnx.Foo"(%1) : (tensor<2xf32>) -> ()\n}\n',
        "'onnx.Return' has results"),
    "more than one block": (
        'func.func @g(%x: tensor<2xf32>) -> tensor<2xf32> {\n  cf.br ^bb1\n^bb1:\n  return %x : tensor<2xf32>\n}\n',
        "a function with more than one block is not an ONNX graph"),
}


@pytest.mark.parametrize("case", sorted(CONVERT_CASES))
def test_convert_rejects(case, capsys, tmp_path):
    text, want = CONVERT_CASES[case]
    expect_error(capsys, tmp_path, text, ".mlir", want, "--convert-onnx-to-taso", "--taso-dce", "--taso-verify",
                 out="out.mlir")


def test_declarations_pass_through(capsys, tmp_path):
    """A function declaration (no body) is left alone by convert-onnx-to-taso and taso-dce."""
    src = tmp_path / "in.mlir"
    src.write_text("func.func private @ext(tensor<2xf32>) -> tensor<2xf32>\n" + fn(""))
    rc, err = run(capsys, src, "-o", tmp_path / "out.mlir", "--convert-onnx-to-taso", "--taso-dce", "--summary")
    assert rc == 0, err
    assert "func.func private @ext" in (tmp_path / "out.mlir").read_text()


def test_dce_keeps_onnx_return(capsys, tmp_path):
    """taso-dce must not erase onnx-mlir's (result-less) onnx.Return."""
    src = tmp_path / "in.mlir"
    src.write_text('func.func @g(%x: tensor<2xf32>) -> tensor<2xf32> {\n'
                   '  %0 = "onnx.Relu"(%x) : (tensor<2xf32>) -> tensor<2xf32>\n'
                   '  "onnx.Return"(%0) : (tensor<2xf32>) -> ()\n}\n')
    rc, err = run(capsys, src, "-o", tmp_path / "out.mlir", "--taso-dce")
    assert rc == 0, err
    assert '"onnx.Return"' in (tmp_path / "out.mlir").read_text()


def test_internal_errors_in_passes_are_not_user_errors(capsys, tmp_path, monkeypatch):
    """A bug in one of our passes is reported as an internal error (exit 2), not as bad input."""
    import taso_mlir.dialect.convert_onnx_to_taso as conv

    def boom(*a, **k):
        raise KeyError("bug")

    monkeypatch.setattr(conv, "_convert_func", boom)
    src = tmp_path / "in.mlir"
    src.write_text(fn(""))
    rc, err = run(capsys, src, "--convert-onnx-to-taso")
    assert rc == 2 and "internal error: KeyError" in err, err


# ---------------------------------------------------------------------------------------------
# ONNX input


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8  # (what onnxruntime loads)
    return m


def test_initializer_data_not_matching_its_shape(capsys, tmp_path):
    w = nh.from_array(np.ones(4, np.float32), "w")
    del w.dims[:]
    w.dims.append(2)  # 16 bytes of data for 2 floats
    m = _model([h.make_node("Add", ["x", "w"], ["y"])], [h.make_tensor_value_info("x", T.FLOAT, [2])],
               [h.make_tensor_value_info("y", T.FLOAT, [2])], [w])
    expect_error(capsys, tmp_path, m.SerializeToString(), ".onnx",
                 "initializer 'w' of shape [2]: its data does not match its shape and type")


def test_initializer_claiming_a_huge_shape(capsys, tmp_path):
    w = nh.from_array(np.ones(4, np.float32), "w")
    del w.dims[:]
    w.dims.extend([2147483648])
    m = _model([h.make_node("Add", ["x", "w"], ["y"])], [h.make_tensor_value_info("x", T.FLOAT, [2])],
               [h.make_tensor_value_info("y", T.FLOAT, [2])], [w])
    # (onnx.checker sees it: the check reads the data's size, not the data)
    expect_error(capsys, tmp_path, m.SerializeToString(), ".onnx", "raw_data size (16 bytes) is too small")


def test_graph_without_outputs(capsys, tmp_path):
    m = _model([h.make_node("Relu", ["x"], ["y"])], [h.make_tensor_value_info("x", T.FLOAT, [2])], [])
    expect_error(capsys, tmp_path, m.SerializeToString(), ".onnx", "the graph has no outputs")


# ---------------------------------------------------------------------------------------------
# outputs


def test_output_to_a_device_or_pipe_is_written_in_place(capsys, tmp_path):
    """``-o /dev/null`` used to rename a temporary file over the device node (as root) or fail."""
    import os
    import stat
    import threading

    src = tmp_path / "in.mlir"
    src.write_text(fn(""))
    if os.path.exists("/dev/null") and stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.access("/dev/null", os.W_OK):
        rc, err = run(capsys, src, "-o", "/dev/null")
        assert rc == 0, err
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    for name in ("pipe.mlir", "pipe.onnx"):
        fifo = tmp_path / name
        os.mkfifo(fifo)
        got = []
        reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
        reader.start()
        rc, err = run(capsys, src, "-o", fifo)
        reader.join(timeout=30)
        assert rc == 0, err
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
        assert got and got[0]
        if name.endswith(".onnx"):
            onnx.checker.check_model(onnx.load_model_from_string(got[0]))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".taso-")]


def test_output_through_a_symlink_and_file_mode(capsys, tmp_path):
    import os

    src = tmp_path / "in.mlir"
    src.write_text(fn(""))
    target = tmp_path / "target.mlir"
    target.write_text("old")
    os.chmod(target, 0o640)
    link = tmp_path / "link.mlir"
    link.symlink_to(target)
    rc, err = run(capsys, src, "-o", link)
    assert rc == 0, err
    assert link.is_symlink() and "func.func @g" in target.read_text()
    assert os.stat(target).st_mode & 0o777 == 0o640  # the replaced file keeps its mode
    fresh = tmp_path / "fresh.mlir"
    rc, err = run(capsys, src, "-o", fresh)
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(fresh).st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600


def test_opset_option_out_of_range(capsys, tmp_path):
    src = tmp_path / "in.mlir"
    src.write_text(fn(""))
    for v in ("-5", "0", "99999999999999999999"):
        rc, err = run(capsys, src, f"--pass-pipeline=builtin.module(convert-onnx-to-taso{{opset={v}}})")
        assert rc == 1 and "option 'opset' must be an ONNX opset version" in err, err


def test_graph_input_with_a_negative_dimension(capsys, tmp_path):
    m = _model([h.make_node("Relu", ["x"], ["y"])], [h.make_tensor_value_info("x", T.FLOAT, [-3, 2])],
               [h.make_tensor_value_info("y", T.FLOAT, [-3, 2])])
    expect_error(capsys, tmp_path, m.SerializeToString(), ".onnx", "graph input 'x' has a negative dimension 0 (-3)")


def _run_limited(tmp_path, model, *flags):
    """taso-opt in a subprocess with 3 GB of address space: a regression fails instead of exhausting
    the machine's memory."""
    import resource
    import subprocess
    import sys

    src = tmp_path / "in.onnx"
    onnx.save(model, src)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    return subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(src), "-o", str(tmp_path / "out.onnx"),
                           *flags], capture_output=True, text=True, timeout=300, preexec_fn=limit)


def test_large_1d_tensors_do_not_exhaust_memory(tmp_path):
    """ONNX's data propagation materializes a 1-D value's dimensions as if it were a shape: an Add of two
    [2**31] tensors (a valid model) used to get taso-opt killed by the kernel."""
    n = 2**31
    m = _model([h.make_node("Add", ["x", "x"], ["a"]), h.make_node("Neg", ["a"], ["y"])],
               [h.make_tensor_value_info("x", T.FLOAT, [n])], [h.make_tensor_value_info("y", T.FLOAT, [n])])
    r = _run_limited(tmp_path, m)
    assert r.returncode == 0, r.stderr
    out = onnx.load(tmp_path / "out.onnx")
    assert [d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == [n]


def test_shape_refinement_does_not_fill_memory(monkeypatch):
    """Shape refinement evaluates small integer computations; a ConstantOfShape of [200000, 200000]
    is not one of them (it used to be evaluated before its size was checked)."""
    nodes = [
        h.make_node("ConstantOfShape", ["big"], ["c"], value=nh.from_array(np.array([1], np.int64))),
        h.make_node("ReduceSum", ["c"], ["tot"], keepdims=0),
        h.make_node("Shape", ["x"], ["sx"]),
        h.make_node("Mod", ["sx", "two"], ["m"]),
        h.make_node("Slice", ["x", "zero", "m"], ["y"]),
    ]
    inits = [nh.from_array(np.array([200000, 200000], np.int64), "big"), nh.from_array(np.array([3], np.int64), "two"),
             nh.from_array(np.array([0], np.int64), "zero")]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [5])],
               [h.make_tensor_value_info("y", T.FLOAT, ["n"]), h.make_tensor_value_info("tot", T.INT64, [])], inits)
    import onnx.reference

    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_import import import_onnx

    evaluated = []
    real_init = onnx.reference.ReferenceEvaluator.__init__

    def spy(self, proto, *a, **k):
        evaluated.extend(n.op_type for n in getattr(proto, "node", []))
        real_init(self, proto, *a, **k)

    monkeypatch.setattr(onnx.reference.ReferenceEvaluator, "__init__", spy)
    import_onnx(m, make_context())
    assert "Mod" in evaluated  # refinement ran
    assert "ConstantOfShape" not in evaluated


def test_onnx_names_that_are_not_utf8(capsys, tmp_path):
    """protobuf hands a string field whose bytes are not UTF-8 to Python as bytes; the importer then
    failed with a message about its own function arguments."""
    m = _model([h.make_node("Relu", ["xin"], ["y"], name="NODE")], [h.make_tensor_value_info("xin", T.FLOAT, [2])],
               [h.make_tensor_value_info("y", T.FLOAT, [2])])
    data = m.SerializeToString()
    expect_error(capsys, tmp_path, data.replace(b"NODE", b"NO\xff\xfe"), ".onnx",
                 "model.graph.node[0].name (b'NO\\xff\\xfe') is not UTF-8 text")
    expect_error(capsys, tmp_path, data.replace(b"xin", b"x\xffn"), ".onnx", "model.graph.node[0].input[0]")


def test_export_names_nodes_in_linear_time():
    """The exporter's fresh names for nodes without names counted up from 1 every time: a 50,000-node
    model took minutes to write out."""
    import time

    from taso_mlir.dialect.onnx_export import _Names

    names, t = _Names(), time.perf_counter()
    got = [names.fresh("t") for _ in range(50000)]
    assert time.perf_counter() - t < 5
    assert got[:3] == ["t", "t_1", "t_2"] and len(set(got)) == 50000
    names.used.add("u_1")
    assert [names.fresh("u") for _ in range(3)] == ["u", "u_2", "u_3"]


def test_verify_numerics_on_inputs_too_large_to_make(tmp_path):
    """--verify-numerics drew random inputs of any size: an internal MemoryError, or the kernel killing
    taso-opt, for a (valid) model with an input of 2**31 floats."""
    n = 2**31
    m = _model([h.make_node("Neg", ["x"], ["y"])], [h.make_tensor_value_info("x", T.FLOAT, [n])],
               [h.make_tensor_value_info("y", T.FLOAT, [n])])
    r = _run_limited(tmp_path, m, "--verify-numerics")
    assert r.returncode == 1, r.stderr
    assert "random inputs for the model (input 'x' of shape [2147483648]) would take 16 GiB" in r.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_summary_of_a_failing_run_is_not_printed(capsys, tmp_path):
    """--summary printed its census before the export failed: two lines on stderr for one error."""
    text, want = EXPORT_CASES["unknown attribute"]
    expect_error(capsys, tmp_path, text, ".mlir", want, "--summary")


def test_bad_command_line_is_one_line(capsys, tmp_path):
    """argparse printed its usage (several lines) and exited 2, the status of internal errors."""
    src = tmp_path / "in.mlir"
    src.write_text(fn(""))
    for argv in ([src, "--mlir-elide-elementsattrs-if-larger=abc"], [src, "-o"], [src, "--input-shape"]):
        rc, err = run(capsys, *argv)
        assert rc == 1 and len(err.strip().splitlines()) == 1 and "(see taso-opt --help)" in err, err


def test_malformed_onnx_ops_stay_generic(capsys, tmp_path):
    """A Conv with one input used to reach the Conv raiser, which read a second input (IndexError)."""
    src = tmp_path / "in.mlir"
    src.write_text(fn('  %q = "onnx.Conv"(%x) : (tensor<2xf32>) -> tensor<2xf32>', ret="%q"))
    rc, err = run(capsys, src, "-o", tmp_path / "out.mlir", "--convert-onnx-to-taso", "--taso-dce", "--taso-verify")
    assert rc == 0, err
    assert '"onnx.Conv"(%arg0)' in (tmp_path / "out.mlir").read_text()


def test_model_parts_that_would_be_dropped(capsys, tmp_path):
    """training_info and quantization annotations used to vanish from the written model."""
    m = _model([h.make_node("Relu", ["x"], ["y"])], [h.make_tensor_value_info("x", T.FLOAT, [2])],
               [h.make_tensor_value_info("y", T.FLOAT, [2])])
    t = onnx.ModelProto()
    t.CopyFrom(m)
    t.training_info.add().algorithm.CopyFrom(h.make_graph([h.make_node("Neg", ["x"], ["z"])], "train", [], []))
    expect_error(capsys, tmp_path, t.SerializeToString(), ".onnx", "training information (ModelProto.training_info)")
    q = onnx.ModelProto()
    q.CopyFrom(m)
    q.graph.quantization_annotation.add(tensor_name="y")
    expect_error(capsys, tmp_path, q.SerializeToString(), ".onnx", "quantization annotations")


def test_an_invalid_export_after_input_shapes_points_at_them(capsys, tmp_path, monkeypatch):
    # shapes given with --input-shape that ONNX's inference on import cannot relate (a Hugging Face BERT
    # with attention_mask=2x8 beside input_ids=2x16 meets at an Add behind data-dependent Expands) only
    # show up as an invalid export: the error then says which option to check
    from taso_mlir.dialect import onnx_export
    from taso_mlir.dialect.errors import TasoError

    g = h.make_graph([h.make_node("Relu", ["a"], ["y"])], "g", [h.make_tensor_value_info("a", T.FLOAT, ["n"])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["n"])])
    src = tmp_path / "in.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), src)

    def invalid(module):
        raise TasoError("the exported ONNX model would not be valid: [ShapeInferenceError] Incompatible dimensions")

    monkeypatch.setattr(onnx_export, "export_onnx", invalid)
    assert main([str(src), "--input-shape", "a=4", "-o", str(tmp_path / "out.onnx")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("(do the --input-shape sizes agree with each other?)"), err
    static = tmp_path / "static.onnx"  # (no shapes given: no hint)
    g.input[0].CopyFrom(h.make_tensor_value_info("a", T.FLOAT, [4]))
    g.output[0].CopyFrom(h.make_tensor_value_info("y", T.FLOAT, [4]))
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), static)
    assert main([str(static), "-o", str(tmp_path / "out.onnx")]) == 1
    err = capsys.readouterr().err
    assert "would not be valid" in err and "--input-shape" not in err
