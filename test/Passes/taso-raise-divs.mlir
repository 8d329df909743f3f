// RUN: taso-opt %s --split-input-file --taso-raise-divs | FileCheck %s
// taso-raise-divs replaces onnx.Div(x, c), c a constant float scalar +-2^k and the result of x's static
// type, by taso.smul(x, 1/c) (a new scalar weight taso_scale_<i>): both are the correctly rounded
// x * 2^-k, bit for bit. Only where taso-fold-scales can then fold the factor into weights.

// Fires: scores / 8 is scores * 0.125, and the factor can go into the matmul's weight.
// CHECK-LABEL: func.func @div_by_8
// CHECK: %[[M:.*]] = "taso.matmul"(%arg0, %{{.*}})
// CHECK-NEXT: %[[C:.*]] = "taso.weight"() {name = "taso_scale_{{[0-9]+}}", value = dense<1.250000e-01> : tensor<f32>}
// CHECK-NEXT: %[[Y:.*]] = "taso.smul"(%[[M]], %[[C]]) : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
// CHECK-NEXT: return %[[Y]]
// CHECK-NOT: onnx.Div
func.func @div_by_8(%x: tensor<2x4xf32>) -> tensor<2x3xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x3xf32>} : () -> tensor<4x3xf32>
  %eight = "taso.weight"() {name = "eight", value = dense<8.0> : tensor<f32>} : () -> tensor<f32>
  %m = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %y = "onnx.Div"(%m, %eight) : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}

// -----

// Does not fire: 3 is not a power of two (1/3 is not exact, the multiply would round differently);
// x / 8 of an argument has no weight to fold the factor into (as a multiply it would only be another
// op for the search to move).
// CHECK-LABEL: func.func @not_raised
// CHECK: %[[M:.*]] = "taso.matmul"(%arg0, %{{.*}})
// CHECK-NEXT: %[[Y:.*]] = "onnx.Div"(%[[M]], %{{.*}}) : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
// CHECK-NEXT: %[[Z:.*]] = "onnx.Div"(%arg0, %{{.*}}) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2x4xf32>
// CHECK-NEXT: return %[[Y]], %[[Z]]
// CHECK-NOT: taso.smul
func.func @not_raised(%x: tensor<2x4xf32>) -> (tensor<2x3xf32>, tensor<2x4xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x3xf32>} : () -> tensor<4x3xf32>
  %three = "taso.weight"() {name = "three", value = dense<3.0> : tensor<f32>} : () -> tensor<f32>
  %eight = "taso.weight"() {name = "eight", value = dense<8.0> : tensor<f32>} : () -> tensor<f32>
  %m = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %y = "onnx.Div"(%m, %three) : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  %z = "onnx.Div"(%x, %eight) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2x4xf32>
  return %y, %z : tensor<2x3xf32>, tensor<2x4xf32>
}
