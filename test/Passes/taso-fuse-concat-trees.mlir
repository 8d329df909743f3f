// RUN: taso-opt %s --split-input-file --taso-fuse-concat-trees | FileCheck %s
// taso-fuse-concat-trees makes a concat that is an operand of another concat on the same axis, and
// has no other use, part of it: one concat of all the pieces (at most 16), in their order, which
// copies each piece once instead of twice. TASO's concat takes two operands, so batching k tensors
// through the rules leaves a chain of k - 1 concats.

// Fires: concat(c, concat(a, b)) on axis 1 is concat(c, a, b).
// CHECK-LABEL: func.func @nested
// CHECK-NEXT: %[[C:.*]] = "taso.concat"(%arg2, %arg0, %arg1) {axis = 1 : i64, {{.*}}} : (tensor<1x4xf32>, tensor<1x2xf32>, tensor<1x3xf32>) -> tensor<1x9xf32>
// CHECK-NEXT: return %[[C]]
func.func @nested(%a: tensor<1x2xf32>, %b: tensor<1x3xf32>, %c: tensor<1x4xf32>) -> tensor<1x9xf32> {
  %i = "taso.concat"(%a, %b) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x2xf32>, tensor<1x3xf32>) -> tensor<1x5xf32>
  %o = "taso.concat"(%c, %i) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x4xf32>, tensor<1x5xf32>) -> tensor<1x9xf32>
  return %o : tensor<1x9xf32>
}

// -----

// Does not fire: the inner concat %j is on axis 0, the outer on axis 1; %i is returned as well, so it
// is computed anyway (fusing would copy its pieces twice still).
// CHECK-LABEL: func.func @not_fused
// CHECK-NEXT: %[[I:.*]] = "taso.concat"(%arg0, %arg1) {axis = 1 : i64
// CHECK-NEXT: %[[J:.*]] = "taso.concat"(%arg0, %arg1) {axis = 0 : i64
// CHECK-NEXT: %[[O:.*]] = "taso.concat"(%[[J]], %arg2) {axis = 1 : i64
// CHECK-NEXT: %[[P:.*]] = "taso.concat"(%[[I]], %arg0) {axis = 1 : i64
// CHECK-NEXT: return %[[O]], %[[P]], %[[I]]
func.func @not_fused(%a: tensor<1x2xf32>, %b: tensor<1x2xf32>, %c: tensor<2x2xf32>) -> (tensor<2x4xf32>, tensor<1x6xf32>, tensor<1x4xf32>) {
  %i = "taso.concat"(%a, %b) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<1x4xf32>
  %j = "taso.concat"(%a, %b) {axis = 0 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<2x2xf32>
  %o = "taso.concat"(%j, %c) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x4xf32>
  %p = "taso.concat"(%i, %a) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x4xf32>, tensor<1x2xf32>) -> tensor<1x6xf32>
  return %o, %p, %i : tensor<2x4xf32>, tensor<1x6xf32>, tensor<1x4xf32>
}
