// RUN: taso-opt %s --split-input-file --taso-raise-views | FileCheck %s
// taso-raise-views replaces onnx.Squeeze, onnx.Unsqueeze and onnx.Flatten between static types, with
// constant axes, by taso.reshape: ONNX defines them as reshapes (the row-major order of the elements
// is kept), and the rules and the layout passes compose and move reshapes.

// Fires on all three; the axes weights stay (for taso-dce).
// CHECK-LABEL: func.func @views
// CHECK: %[[S:.*]] = "taso.reshape"(%arg0) {shape = array<i64: 2, 4>} : (tensor<2x1x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: %[[U:.*]] = "taso.reshape"(%arg0) {shape = array<i64: 1, 2, 1, 4>} : (tensor<2x1x4xf32>) -> tensor<1x2x1x4xf32>
// CHECK-NEXT: %[[F:.*]] = "taso.reshape"(%arg1) {shape = array<i64: 2, 12>} : (tensor<2x3x4xf32>) -> tensor<2x12xf32>
// CHECK-NEXT: return %[[S]], %[[U]], %[[F]]
// CHECK-NOT: onnx.
func.func @views(%x: tensor<2x1x4xf32>, %y: tensor<2x3x4xf32>) -> (tensor<2x4xf32>, tensor<1x2x1x4xf32>, tensor<2x12xf32>) {
  %ax = "taso.weight"() {name = "ax", value = dense<1> : tensor<1xsi64>} : () -> tensor<1xsi64>
  %z = "taso.weight"() {name = "z", value = dense<0> : tensor<1xsi64>} : () -> tensor<1xsi64>
  %s = "onnx.Squeeze"(%x, %ax) : (tensor<2x1x4xf32>, tensor<1xsi64>) -> tensor<2x4xf32>
  %u = "onnx.Unsqueeze"(%x, %z) : (tensor<2x1x4xf32>, tensor<1xsi64>) -> tensor<1x2x1x4xf32>
  %f = "onnx.Flatten"(%y) {axis = 1 : si64} : (tensor<2x3x4xf32>) -> tensor<2x12xf32>
  return %s, %u, %f : tensor<2x4xf32>, tensor<1x2x1x4xf32>, tensor<2x12xf32>
}

// -----

// Does not fire: the first Squeeze's operand and result are dynamic (no static shape for a reshape);
// the second's axes are an argument, computed at run time (onnxruntime checks them; a reshape would
// not).
// CHECK-LABEL: func.func @not_static_or_constant
// CHECK: %[[S:.*]] = "onnx.Squeeze"(%arg0, %{{.*}}) : (tensor<?x1x4xf32>, tensor<1xsi64>) -> tensor<?x4xf32>
// CHECK-NEXT: %[[T:.*]] = "onnx.Squeeze"(%arg1, %arg2) : (tensor<2x1x4xf32>, tensor<1xsi64>) -> tensor<2x4xf32>
// CHECK-NEXT: return %[[S]], %[[T]]
// CHECK-NOT: taso.reshape
func.func @not_static_or_constant(%x: tensor<?x1x4xf32>, %w: tensor<2x1x4xf32>, %ax: tensor<1xsi64>) -> (tensor<?x4xf32>, tensor<2x4xf32>) {
  %one = "taso.weight"() {name = "one", value = dense<1> : tensor<1xsi64>} : () -> tensor<1xsi64>
  %s = "onnx.Squeeze"(%x, %one) : (tensor<?x1x4xf32>, tensor<1xsi64>) -> tensor<?x4xf32>
  %t = "onnx.Squeeze"(%w, %ax) : (tensor<2x1x4xf32>, tensor<1xsi64>) -> tensor<2x4xf32>
  return %s, %t : tensor<?x4xf32>, tensor<2x4xf32>
}
