// RUN: taso-opt %s --split-input-file --taso-unflatten-matmuls | FileCheck %s
// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-unflatten-matmuls{cost-model=analytic})' | FileCheck %s
// taso-unflatten-matmuls undoes taso-flatten-matmuls where the search left a matmul alone:
// reshape(matmul(reshape(x, [rows, K]), W), lead + [N]) is matmul(x, W), x of shape lead + [K],
// prod(lead) = rows, the inner matmul's result used once. Where the search merged flattened matmuls,
// split(matmul(reshape(x, [rows, K]), W), axis = 1) reads x itself and splits on its last axis, where
// the cost model (the default, analytic) charges less for it: the reshapes around it go.

// Fires: the flattened [6, 4] matmul with its relu reads the [2, 3, 4] input again.
// CHECK-LABEL: func.func @restore
// CHECK-NEXT: %[[W:.*]] = "taso.weight"() {name = "w"
// CHECK-NEXT: %[[M:.*]] = "taso.matmul"(%arg0, %[[W]]) {activation = "relu", {{.*}}} : (tensor<2x3x4xf32>, tensor<4x5xf32>) -> tensor<2x3x5xf32>
// CHECK-NEXT: return %[[M]]
// CHECK-NOT: taso.reshape
func.func @restore(%x: tensor<2x3x4xf32>) -> tensor<2x3x5xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x5xf32>} : () -> tensor<4x5xf32>
  %r = "taso.reshape"(%x) {shape = array<i64: 6, 4>} : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
  %m = "taso.matmul"(%r, %w) {activation = "relu"} : (tensor<6x4xf32>, tensor<4x5xf32>) -> tensor<6x5xf32>
  %y = "taso.reshape"(%m) {shape = array<i64: 2, 3, 5>} : (tensor<6x5xf32>) -> tensor<2x3x5xf32>
  return %y : tensor<2x3x5xf32>
}

// -----

// Fires on a merged pair: the split of the flat [6, 11] result on axis 1 is the split of the [2, 3, 11]
// result on axis 2 with the same sizes; the pieces' reshapes to [2, 3, n] are the pieces themselves.
// CHECK-LABEL: func.func @merged
// CHECK-NEXT: %[[W:.*]] = "taso.weight"() {name = "w"
// CHECK-NEXT: %[[M:.*]] = "taso.matmul"(%arg0, %[[W]]) {activation = "none", {{.*}}} : (tensor<2x3x4xf32>, tensor<4x11xf32>) -> tensor<2x3x11xf32>
// CHECK-NEXT: %[[S:.*]]:2 = "taso.split"(%[[M]]) {axis = 2 : i64, {{.*}}sizes = array<i64: 5, 6>} : (tensor<2x3x11xf32>) -> (tensor<2x3x5xf32>, tensor<2x3x6xf32>)
// CHECK-NEXT: return %[[S]]#0, %[[S]]#1
// CHECK-NOT: taso.reshape
func.func @merged(%x: tensor<2x3x4xf32>) -> (tensor<2x3x5xf32>, tensor<2x3x6xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x11xf32>} : () -> tensor<4x11xf32>
  %r = "taso.reshape"(%x) {shape = array<i64: 6, 4>} : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
  %m = "taso.matmul"(%r, %w) {activation = "none"} : (tensor<6x4xf32>, tensor<4x11xf32>) -> tensor<6x11xf32>
  %s:2 = "taso.split"(%m) {axis = 1 : i64, sizes = array<i64: 5, 6>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<6x11xf32>) -> (tensor<6x5xf32>, tensor<6x6xf32>)
  %a = "taso.reshape"(%s#0) {shape = array<i64: 2, 3, 5>} : (tensor<6x5xf32>) -> tensor<2x3x5xf32>
  %b = "taso.reshape"(%s#1) {shape = array<i64: 2, 3, 6>} : (tensor<6x6xf32>) -> tensor<2x3x6xf32>
  return %a, %b : tensor<2x3x5xf32>, tensor<2x3x6xf32>
}

// -----

// Does not fire: the first result is reshaped to [3, 2, 5], not to x's leading shape [2, 3] (another
// tensor of the same size); the second flat matmul's result is returned as well (it has another use,
// and would have to stay).
// CHECK-LABEL: func.func @not_restored
// CHECK: %[[R:.*]] = "taso.reshape"(%arg0) {shape = array<i64: 6, 4>}
// CHECK-NEXT: %[[M:.*]] = "taso.matmul"(%[[R]], %{{.*}}) {activation = "none"} : (tensor<6x4xf32>, tensor<4x5xf32>)
// CHECK-NEXT: %[[Y:.*]] = "taso.reshape"(%[[M]]) {shape = array<i64: 3, 2, 5>}
// CHECK-NEXT: %[[M2:.*]] = "taso.matmul"(%[[R]], %{{.*}}) {activation = "relu"} : (tensor<6x4xf32>, tensor<4x5xf32>)
// CHECK-NEXT: %[[Y2:.*]] = "taso.reshape"(%[[M2]]) {shape = array<i64: 2, 3, 5>}
// CHECK-NEXT: return %[[Y]], %[[Y2]], %[[M2]]
func.func @not_restored(%x: tensor<2x3x4xf32>) -> (tensor<3x2x5xf32>, tensor<2x3x5xf32>, tensor<6x5xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x5xf32>} : () -> tensor<4x5xf32>
  %r = "taso.reshape"(%x) {shape = array<i64: 6, 4>} : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
  %m = "taso.matmul"(%r, %w) {activation = "none"} : (tensor<6x4xf32>, tensor<4x5xf32>) -> tensor<6x5xf32>
  %y = "taso.reshape"(%m) {shape = array<i64: 3, 2, 5>} : (tensor<6x5xf32>) -> tensor<3x2x5xf32>
  %m2 = "taso.matmul"(%r, %w) {activation = "relu"} : (tensor<6x4xf32>, tensor<4x5xf32>) -> tensor<6x5xf32>
  %y2 = "taso.reshape"(%m2) {shape = array<i64: 2, 3, 5>} : (tensor<6x5xf32>) -> tensor<2x3x5xf32>
  return %y, %y2, %m2 : tensor<3x2x5xf32>, tensor<2x3x5xf32>, tensor<6x5xf32>
}
