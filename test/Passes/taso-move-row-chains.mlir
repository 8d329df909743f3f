// RUN: taso-opt %s --split-input-file --taso-move-row-chains | FileCheck %s
// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-move-row-chains{cost-model=analytic})' | FileCheck %s
// taso-move-row-chains moves reshapes and transposes that move whole rows (the last axis kept in place)
// across a matmul by a 2-D operand, matmul(R(x), W) = R'(matmul(x, W)) (R' is R with the last axis
// resized from K to N), to join the layout chain on the other side, which is then written as planned
// (chain_plan). Only where the cost model (the default, analytic) charges the joined chain less than
// the two parts.

// Fires: the sequence-first transpose into the matmul moves below it and joins the heads reshape and
// transpose after it: transpose(1,0,2), reshape, transpose(1,2,0,3) become reshape, transpose(0,2,1,3).
// CHECK-LABEL: func.func @row_chain
// CHECK-NEXT: %[[W:.*]] = "taso.weight"() {name = "w"
// CHECK-NEXT: %[[M:.*]] = "taso.matmul"(%arg0, %[[W]]) {activation = "none"{{.*}}} : (tensor<2x4x8xf32>, tensor<8x6xf32>) -> tensor<2x4x6xf32>
// CHECK-NEXT: %[[R:.*]] = "taso.reshape"(%[[M]]) {shape = array<i64: 2, 4, 3, 2>} : (tensor<2x4x6xf32>) -> tensor<2x4x3x2xf32>
// CHECK-NEXT: %[[T:.*]] = "taso.transpose"(%[[R]]) {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x3x2xf32>) -> tensor<2x3x4x2xf32>
// CHECK-NEXT: return %[[T]]
func.func @row_chain(%x: tensor<2x4x8xf32>) -> tensor<2x3x4x2xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<8x6xf32>} : () -> tensor<8x6xf32>
  %t = "taso.transpose"(%x) {perm = array<i64: 1, 0, 2>} : (tensor<2x4x8xf32>) -> tensor<4x2x8xf32>
  %m = "taso.matmul"(%t, %w) {activation = "none"} : (tensor<4x2x8xf32>, tensor<8x6xf32>) -> tensor<4x2x6xf32>
  %r = "taso.reshape"(%m) {shape = array<i64: 4, 2, 3, 2>} : (tensor<4x2x6xf32>) -> tensor<4x2x3x2xf32>
  %u = "taso.transpose"(%r) {perm = array<i64: 1, 2, 0, 3>} : (tensor<4x2x3x2xf32>) -> tensor<2x3x4x2xf32>
  return %u : tensor<2x3x4x2xf32>
}

// -----

// Does not fire: the same chain around a matmul by a batched [4, 8, 6] weight. Its batch index pairs
// with the rows' leading index, which the transpose moves, so the transpose cannot cross the matmul.
// CHECK-LABEL: func.func @batched_weight
// CHECK-NEXT: %[[W:.*]] = "taso.weight"() {name = "w"
// CHECK-NEXT: %[[T:.*]] = "taso.transpose"(%arg0) {perm = array<i64: 1, 0, 2>}
// CHECK-NEXT: %[[M:.*]] = "taso.matmul"(%[[T]], %[[W]]) {activation = "none"} : (tensor<4x2x8xf32>, tensor<4x8x6xf32>) -> tensor<4x2x6xf32>
// CHECK-NEXT: %[[R:.*]] = "taso.reshape"(%[[M]]) {shape = array<i64: 4, 2, 3, 2>}
// CHECK-NEXT: %[[U:.*]] = "taso.transpose"(%[[R]]) {perm = array<i64: 1, 2, 0, 3>}
// CHECK-NEXT: return %[[U]]
func.func @batched_weight(%x: tensor<2x4x8xf32>) -> tensor<2x3x4x2xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x8x6xf32>} : () -> tensor<4x8x6xf32>
  %t = "taso.transpose"(%x) {perm = array<i64: 1, 0, 2>} : (tensor<2x4x8xf32>) -> tensor<4x2x8xf32>
  %m = "taso.matmul"(%t, %w) {activation = "none"} : (tensor<4x2x8xf32>, tensor<4x8x6xf32>) -> tensor<4x2x6xf32>
  %r = "taso.reshape"(%m) {shape = array<i64: 4, 2, 3, 2>} : (tensor<4x2x6xf32>) -> tensor<4x2x3x2xf32>
  %u = "taso.transpose"(%r) {perm = array<i64: 1, 2, 0, 3>} : (tensor<4x2x3x2xf32>) -> tensor<2x3x4x2xf32>
  return %u : tensor<2x3x4x2xf32>
}
