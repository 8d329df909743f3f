// RUN: taso-opt %s --taso-dce | FileCheck %s
// taso-dce removes taso and onnx ops whose results are unused, transitively; used ops stay.

// CHECK-LABEL: func.func @dead
func.func @dead(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  // CHECK-NOT: name = "unused"
  %w = "taso.weight"() {name = "unused", value = dense<1.0> : tensor<3x3xf32>} : () -> tensor<3x3xf32>
  // CHECK-NOT: taso.matmul
  %m = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>
  // CHECK-NOT: onnx.Erf
  %e = "onnx.Erf"(%m) : (tensor<2x3xf32>) -> tensor<2x3xf32>
  // CHECK: %[[R:.*]] = "taso.relu"(%{{.*}})
  %r = "taso.relu"(%x) : (tensor<2x3xf32>) -> tensor<2x3xf32>
  // CHECK: return %[[R]]
  return %r : tensor<2x3xf32>
}
