// RUN: taso-opt %s --split-input-file --taso-fold-matmul-bias | FileCheck %s
// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-fold-matmul-bias{cost-model=analytic})' | FileCheck %s
// taso-fold-matmul-bias folds ewadd(matmul(x, W), b) (either operand order), b a weight of shape [N]
// (one value per output column), into the matmul's bias operand: matmul(x, W, b) = x @ W + b. Only
// where the cost model (here the default, analytic) charges the biased matmul no more than the two ops.

// Fires, for b on either side of the add.
// CHECK-LABEL: func.func @bias_add
// CHECK-NEXT: %[[W:.*]] = "taso.weight"() {name = "w"
// CHECK-NEXT: %[[B:.*]] = "taso.weight"() {name = "b"
// CHECK-NEXT: %[[M:.*]] = "taso.matmul"(%arg0, %[[W]], %[[B]]) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<2x4xf32>, tensor<4x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: %[[M2:.*]] = "taso.matmul"(%arg0, %[[W]], %[[B]]) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 1>}
// CHECK-NEXT: return %[[M]], %[[M2]]
// CHECK-NOT: taso.ewadd
func.func @bias_add(%x: tensor<2x4xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x3xf32>} : () -> tensor<4x3xf32>
  %b = "taso.weight"() {name = "b", value = dense<1.0> : tensor<3xf32>} : () -> tensor<3xf32>
  %m = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %y = "taso.ewadd"(%m, %b) : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  %m2 = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %y2 = "taso.ewadd"(%b, %m2) : (tensor<3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  return %y, %y2 : tensor<2x3xf32>, tensor<2x3xf32>
}

// -----

// Does not fire: a [1, N] row is not the biased matmul's [N] operand; a fused relu is applied before
// the add, the bias would go in before it; the third matmul's result is returned too (its unbiased
// value is needed); the fourth add's operand is an argument, not a weight. Every add stays.
// CHECK-LABEL: func.func @not_folded
// CHECK: %[[M1:.*]] = "taso.matmul"(%arg0, %{{[^,]*}}) {activation = "none"}
// CHECK-NEXT: %[[Y1:.*]] = "taso.ewadd"(%[[M1]], %{{.*}}) : (tensor<2x3xf32>, tensor<1x3xf32>)
// CHECK-NEXT: %[[M2:.*]] = "taso.matmul"(%arg0, %{{[^,]*}}) {activation = "relu"}
// CHECK-NEXT: %[[Y2:.*]] = "taso.ewadd"(%[[M2]], %{{.*}}) : (tensor<2x3xf32>, tensor<3xf32>)
// CHECK-NEXT: %[[M3:.*]] = "taso.matmul"(%arg0, %{{[^,]*}}) {activation = "none"}
// CHECK-NEXT: %[[Y3:.*]] = "taso.ewadd"(%[[M3]], %{{.*}}) : (tensor<2x3xf32>, tensor<3xf32>)
// CHECK-NEXT: %[[M4:.*]] = "taso.matmul"(%arg0, %{{[^,]*}}) {activation = "none"}
// CHECK-NEXT: %[[Y4:.*]] = "taso.ewadd"(%[[M4]], %arg1) : (tensor<2x3xf32>, tensor<3xf32>)
// CHECK-NEXT: return %[[Y1]], %[[Y2]], %[[M3]], %[[Y3]], %[[Y4]]
func.func @not_folded(%x: tensor<2x4xf32>, %v: tensor<3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x3xf32>} : () -> tensor<4x3xf32>
  %b = "taso.weight"() {name = "b", value = dense<1.0> : tensor<3xf32>} : () -> tensor<3xf32>
  %row = "taso.weight"() {name = "row", value = dense<1.0> : tensor<1x3xf32>} : () -> tensor<1x3xf32>
  %m1 = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %y1 = "taso.ewadd"(%m1, %row) : (tensor<2x3xf32>, tensor<1x3xf32>) -> tensor<2x3xf32>
  %m2 = "taso.matmul"(%x, %w) {activation = "relu"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %y2 = "taso.ewadd"(%m2, %b) : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  %m3 = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %y3 = "taso.ewadd"(%m3, %b) : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  %m4 = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %y4 = "taso.ewadd"(%m4, %v) : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  return %y1, %y2, %m3, %y3, %y4 : tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>
}
