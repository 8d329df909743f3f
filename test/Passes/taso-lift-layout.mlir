// RUN: taso-opt %s --split-input-file --taso-lift-layout | FileCheck %s
// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-lift-layout{cost-model=analytic})' | FileCheck %s
// taso-lift-layout first composes reshape(reshape(x)) into one reshape, then replaces like reshapes or
// transposes of every piece of a split by one reshape or transpose of the whole and a split of its
// result: a transpose moves the split axis, and a row-major reshape keeps each piece a contiguous run.
// Only where the cost model (the default, analytic) charges less for that.

// Fires: attention heads. Each [8, 8] piece is reshaped to [8, 2, 4] and transposed to [2, 8, 4]; one
// reshape of the whole to [8, 4, 4] and one transpose to [4, 8, 4] replace them, and the split moves to
// axis 0 with sizes [2, 2].
// CHECK-LABEL: func.func @heads
// CHECK-NEXT: %[[R:.*]] = "taso.reshape"(%arg0) {shape = array<i64: 8, 4, 4>} : (tensor<8x16xf32>) -> tensor<8x4x4xf32>
// CHECK-NEXT: %[[T:.*]] = "taso.transpose"(%[[R]]) {perm = array<i64: 1, 0, 2>} : (tensor<8x4x4xf32>) -> tensor<4x8x4xf32>
// CHECK-NEXT: %[[S:.*]]:2 = "taso.split"(%[[T]]) {axis = 0 : i64, {{.*}}sizes = array<i64: 2, 2>} : (tensor<4x8x4xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xf32>)
// CHECK-NEXT: return %[[S]]#0, %[[S]]#1
func.func @heads(%x: tensor<8x16xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xf32>) {
  %s:2 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 8, 8>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<8x16xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>)
  %r0 = "taso.reshape"(%s#0) {shape = array<i64: 8, 2, 4>} : (tensor<8x8xf32>) -> tensor<8x2x4xf32>
  %r1 = "taso.reshape"(%s#1) {shape = array<i64: 8, 2, 4>} : (tensor<8x8xf32>) -> tensor<8x2x4xf32>
  %t0 = "taso.transpose"(%r0) {perm = array<i64: 1, 0, 2>} : (tensor<8x2x4xf32>) -> tensor<2x8x4xf32>
  %t1 = "taso.transpose"(%r1) {perm = array<i64: 1, 0, 2>} : (tensor<8x2x4xf32>) -> tensor<2x8x4xf32>
  return %t0, %t1 : tensor<2x8x4xf32>, tensor<2x8x4xf32>
}

// -----

// Fires (the composition): a reshape of a reshape is one reshape.
// CHECK-LABEL: func.func @reshape_of_reshape
// CHECK-NEXT: %[[R:.*]] = "taso.reshape"(%arg0) {shape = array<i64: 4, 6>} : (tensor<2x3x4xf32>) -> tensor<4x6xf32>
// CHECK-NEXT: return %[[R]]
func.func @reshape_of_reshape(%x: tensor<2x3x4xf32>) -> tensor<4x6xf32> {
  %a = "taso.reshape"(%x) {shape = array<i64: 6, 4>} : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
  %b = "taso.reshape"(%a) {shape = array<i64: 4, 6>} : (tensor<6x4xf32>) -> tensor<4x6xf32>
  return %b : tensor<4x6xf32>
}

// -----

// Does not fire: the pieces are reshaped to different layouts ([8, 2, 4] and [8, 4, 2]); the targets do
// not agree outside one axis, so no one reshape of the whole gives both.
// CHECK-LABEL: func.func @different_layouts
// CHECK-NEXT: %[[S:.*]]:2 = "taso.split"(%arg0) {axis = 1 : i64
// CHECK-NEXT: %[[R0:.*]] = "taso.reshape"(%[[S]]#0) {shape = array<i64: 8, 2, 4>}
// CHECK-NEXT: %[[R1:.*]] = "taso.reshape"(%[[S]]#1) {shape = array<i64: 8, 4, 2>}
// CHECK-NEXT: return %[[R0]], %[[R1]]
func.func @different_layouts(%x: tensor<8x16xf32>) -> (tensor<8x2x4xf32>, tensor<8x4x2xf32>) {
  %s:2 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 8, 8>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<8x16xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>)
  %r0 = "taso.reshape"(%s#0) {shape = array<i64: 8, 2, 4>} : (tensor<8x8xf32>) -> tensor<8x2x4xf32>
  %r1 = "taso.reshape"(%s#1) {shape = array<i64: 8, 4, 2>} : (tensor<8x8xf32>) -> tensor<8x4x2xf32>
  return %r0, %r1 : tensor<8x2x4xf32>, tensor<8x4x2xf32>
}
