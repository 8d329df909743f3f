// RUN: %python %S/../Inputs/make_model.py %t.onnx
// RUN: taso-opt %t.onnx --mlir-elide-elementsattrs-if-larger=8 | FileCheck %s
// RUN: taso-opt %t.onnx --mlir-print-debuginfo -o %t.mlir && taso-opt %t.mlir -o %t.rt.onnx
// RUN: %python -c "import onnx,sys; m=onnx.load(sys.argv[1]); onnx.checker.check_model(m, full_check=True); print([n.op_type for n in m.graph.node], [i.name for i in m.graph.initializer])" %t.rt.onnx | FileCheck %s --check-prefix=ONNX
// An .onnx input is imported (shape inference, upstream importer, convert-onnx-to-taso) and can be
// written back; graph names, weights, node names (with --mlir-print-debuginfo) and the opset survive
// (the Gemm is raised: its transB weight is written transposed, as fcw.T).

// CHECK-LABEL: func.func @lit_model
// CHECK-SAME: (%[[X:.*]]: tensor<1x3x8x8xf32>) -> tensor<1x10xf32>
// CHECK-SAME: taso.input_names = ["x"]
// CHECK-SAME: taso.output_names = ["y"]
// CHECK: %[[W:.*]] = "taso.weight"() {name = "w1", value = dense_resource<__elided__> : tensor<4x3x3x3xf32>}
// CHECK: %[[B:.*]] = "taso.weight"() {name = "b1", value = dense<{{.*}}> : tensor<4xf32>}
// CHECK: %[[C:.*]] = "taso.conv2d"(%[[X]], %[[W]], %[[B]]) {{{.*}}pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 2, 2>}
// CHECK: %[[R:.*]] = "taso.relu"(%[[C]])
// CHECK: %[[F:.*]] = "taso.reshape"(%[[R]]) {shape = array<i64: 1, 64>}
// CHECK: %[[FCW:.*]] = "taso.weight"() {name = "fcw.T", value = dense_resource<__elided__> : tensor<64x10xf32>}
// CHECK: %[[M:.*]] = "taso.matmul"(%[[F]], %[[FCW]]) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>}
// CHECK: %[[G:.*]] = "taso.ewadd"(%[[M]], %{{.*}})
// CHECK: "onnx.Softmax"(%[[G]]) {axis = -1 : si64}

// ONNX: ['Conv', 'Relu', 'Reshape', 'MatMul', 'Add', 'Softmax'] ['w1', 'b1', 'fcb', 'flatten_shape', 'fcw.T']

// RUN: taso-opt %t.onnx -o %t.sum.onnx --summary --verify-numerics 2>&1 | FileCheck %s --check-prefix=SUMMARY
// SUMMARY: taso-opt: 5 taso ops (conv2d 1, relu 1, reshape 1, matmul 1, ewadd 1); 1 generic onnx ops (Softmax 1); 4 weights (0.0 MB)
// SUMMARY: taso-opt: numerics: max |difference| 0 {{.*}}: ok
