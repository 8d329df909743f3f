// RUN: taso-opt %s --split-input-file --taso-fold-weights | FileCheck %s
// taso-fold-weights (after the search) replaces every taso op whose operands are all weights by a new
// weight (taso_folded_<i>) holding its value (the operator's reference semantics), drops the
// identities that reveals (x + 0, x * 1) and removes the ops left unused. The search's rewrites leave
// such ops: a merge of two matmuls concatenates their weights.

// Fires: the concat of two weights is one [4, 3] weight (columns 0.5, 0.5, 0.25); 1 + 0 folds to a
// weight of ones of x's type, and 1 * x is x.
// CHECK-LABEL: func.func @weight_ops
// CHECK-NEXT: %[[W:.*]] = "taso.weight"() {name = "taso_folded_{{[0-9]+}}", value = dense<{{\[\[}}5.000000e-01, 5.000000e-01, 2.500000e-01], [5.000000e-01, 5.000000e-01, 2.500000e-01], [5.000000e-01, 5.000000e-01, 2.500000e-01], [5.000000e-01, 5.000000e-01, 2.500000e-01]]> : tensor<4x3xf32>}
// CHECK-NEXT: %[[M:.*]] = "taso.matmul"(%arg0, %[[W]]) {activation = "none"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: return %[[M]], %arg0
func.func @weight_ops(%x: tensor<2x4xf32>) -> (tensor<2x3xf32>, tensor<2x4xf32>) {
  %w1 = "taso.weight"() {name = "w1", value = dense<0.5> : tensor<4x2xf32>} : () -> tensor<4x2xf32>
  %w2 = "taso.weight"() {name = "w2", value = dense<0.25> : tensor<4x1xf32>} : () -> tensor<4x1xf32>
  %cat = "taso.concat"(%w1, %w2) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<4x2xf32>, tensor<4x1xf32>) -> tensor<4x3xf32>
  %m = "taso.matmul"(%x, %cat) {activation = "none"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %o = "taso.weight"() {name = "one", value = dense<1.0> : tensor<2x4xf32>} : () -> tensor<2x4xf32>
  %z = "taso.weight"() {name = "zero", value = dense<0.0> : tensor<2x4xf32>} : () -> tensor<2x4xf32>
  %one = "taso.ewadd"(%o, %z) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %y = "taso.ewmul"(%one, %x) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  return %m, %y : tensor<2x3xf32>, tensor<2x4xf32>
}

// -----

// Does not fire: onnx.Sqrt of a weight is a generic op (taso-fold-constants folds those, before the
// search); the multiply reads an argument. Nothing is folded.
// CHECK-LABEL: func.func @not_folded
// CHECK-NEXT: %[[A:.*]] = "taso.weight"() {name = "a"
// CHECK-NEXT: %[[R:.*]] = "onnx.Sqrt"(%[[A]])
// CHECK-NEXT: %[[Y:.*]] = "taso.ewmul"(%arg0, %[[A]])
// CHECK-NEXT: return %[[R]], %[[Y]]
// CHECK-NOT: taso_folded
func.func @not_folded(%x: tensor<2x4xf32>) -> (tensor<4xf32>, tensor<2x4xf32>) {
  %a = "taso.weight"() {name = "a", value = dense<4.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %r = "onnx.Sqrt"(%a) : (tensor<4xf32>) -> tensor<4xf32>
  %y = "taso.ewmul"(%x, %a) : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  return %r, %y : tensor<4xf32>, tensor<2x4xf32>
}
