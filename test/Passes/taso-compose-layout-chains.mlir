// RUN: taso-opt %s --split-input-file --taso-compose-layout-chains | FileCheck %s
// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-compose-layout-chains{cost-model=analytic})' | FileCheck %s
// taso-compose-layout-chains replaces a chain of two or more reshapes and transposes, at least one a
// transpose, each intermediate result used only by the next, by its plan: at most one transpose
// between two reshapes (reshape(transpose(reshape(x, fine), perm), final)), or one reshape where the
// perm is the identity, or nothing where the chain is the identity. Only where the cost model (the
// default, analytic) charges the plan less than the chain; then the chain's ops go.

// Fires: two transposes with a reshape between them (Q/K/V first, then the heads first) are one.
// CHECK-LABEL: func.func @two_transposes
// CHECK-NEXT: %[[R:.*]] = "taso.reshape"(%arg0) {shape = array<i64: 8, 3, 2, 4>} : (tensor<8x24xf32>) -> tensor<8x3x2x4xf32>
// CHECK-NEXT: %[[T:.*]] = "taso.transpose"(%[[R]]) {perm = array<i64: 2, 1, 0, 3>} : (tensor<8x3x2x4xf32>) -> tensor<2x3x8x4xf32>
// CHECK-NEXT: %[[F:.*]] = "taso.reshape"(%[[T]]) {shape = array<i64: 2, 24, 4>} : (tensor<2x3x8x4xf32>) -> tensor<2x24x4xf32>
// CHECK-NEXT: return %[[F]]
func.func @two_transposes(%x: tensor<8x24xf32>) -> tensor<2x24x4xf32> {
  %r = "taso.reshape"(%x) {shape = array<i64: 8, 3, 8>} : (tensor<8x24xf32>) -> tensor<8x3x8xf32>
  %t = "taso.transpose"(%r) {perm = array<i64: 1, 0, 2>} : (tensor<8x3x8xf32>) -> tensor<3x8x8xf32>
  %r2 = "taso.reshape"(%t) {shape = array<i64: 24, 2, 4>} : (tensor<3x8x8xf32>) -> tensor<24x2x4xf32>
  %t2 = "taso.transpose"(%r2) {perm = array<i64: 1, 0, 2>} : (tensor<24x2x4xf32>) -> tensor<2x24x4xf32>
  return %t2 : tensor<2x24x4xf32>
}

// -----

// Fires: two transposes that cancel are the identity; both go.
// CHECK-LABEL: func.func @cancelling
// CHECK-NEXT: return %arg0
func.func @cancelling(%x: tensor<4x6xf32>) -> tensor<4x6xf32> {
  %a = "taso.transpose"(%x) {perm = array<i64: 1, 0>} : (tensor<4x6xf32>) -> tensor<6x4xf32>
  %b = "taso.transpose"(%a) {perm = array<i64: 1, 0>} : (tensor<6x4xf32>) -> tensor<4x6xf32>
  return %b : tensor<4x6xf32>
}

// -----

// Does not fire: %t is returned as well, so the chain of @two_transposes is cut there into two chains
// of one reshape and one transpose each, which are their own plans (no cheaper); the last transpose is
// a chain of one op.
// CHECK-LABEL: func.func @not_a_chain
// CHECK-NEXT: %[[R:.*]] = "taso.reshape"(%arg0) {shape = array<i64: 8, 3, 8>}
// CHECK-NEXT: %[[T:.*]] = "taso.transpose"(%[[R]]) {perm = array<i64: 1, 0, 2>}
// CHECK-NEXT: %[[R2:.*]] = "taso.reshape"(%[[T]]) {shape = array<i64: 24, 2, 4>}
// CHECK-NEXT: %[[T2:.*]] = "taso.transpose"(%[[R2]]) {perm = array<i64: 1, 0, 2>}
// CHECK-NEXT: %[[U:.*]] = "taso.transpose"(%arg0) {perm = array<i64: 1, 0>}
// CHECK-NEXT: return %[[T2]], %[[T]], %[[U]]
func.func @not_a_chain(%x: tensor<8x24xf32>) -> (tensor<2x24x4xf32>, tensor<3x8x8xf32>, tensor<24x8xf32>) {
  %r = "taso.reshape"(%x) {shape = array<i64: 8, 3, 8>} : (tensor<8x24xf32>) -> tensor<8x3x8xf32>
  %t = "taso.transpose"(%r) {perm = array<i64: 1, 0, 2>} : (tensor<8x3x8xf32>) -> tensor<3x8x8xf32>
  %r2 = "taso.reshape"(%t) {shape = array<i64: 24, 2, 4>} : (tensor<3x8x8xf32>) -> tensor<24x2x4xf32>
  %t2 = "taso.transpose"(%r2) {perm = array<i64: 1, 0, 2>} : (tensor<24x2x4xf32>) -> tensor<2x24x4xf32>
  %u = "taso.transpose"(%x) {perm = array<i64: 1, 0>} : (tensor<8x24xf32>) -> tensor<24x8xf32>
  return %t2, %t, %u : tensor<2x24x4xf32>, tensor<3x8x8xf32>, tensor<24x8xf32>
}
