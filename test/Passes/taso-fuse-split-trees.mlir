// RUN: taso-opt %s --split-input-file --taso-fuse-split-trees | FileCheck %s
// taso-fuse-split-trees makes a split of a piece of another split, on the same axis, part of that
// split where nothing else uses the piece: one split into the finer pieces (at most 16), which moves
// the same bytes in one launch. TASO's rules split in two, so merging k ops leaves a tree of k - 1
// splits (the search costs the tree as its root split).

// Fires: [4, 8] then the 8 as [2, 6] is one split [4, 2, 6].
// CHECK-LABEL: func.func @nested
// CHECK-NEXT: %[[S:.*]]:3 = "taso.split"(%arg0) {axis = 1 : i64, {{.*}}sizes = array<i64: 4, 2, 6>} : (tensor<1x12xf32>) -> (tensor<1x4xf32>, tensor<1x2xf32>, tensor<1x6xf32>)
// CHECK-NEXT: return %[[S]]#0, %[[S]]#1, %[[S]]#2
func.func @nested(%x: tensor<1x12xf32>) -> (tensor<1x4xf32>, tensor<1x2xf32>, tensor<1x6xf32>) {
  %s:2 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 4, 8>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x12xf32>) -> (tensor<1x4xf32>, tensor<1x8xf32>)
  %t:2 = "taso.split"(%s#1) {axis = 1 : i64, sizes = array<i64: 2, 6>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x8xf32>) -> (tensor<1x2xf32>, tensor<1x6xf32>)
  return %s#0, %t#0, %t#1 : tensor<1x4xf32>, tensor<1x2xf32>, tensor<1x6xf32>
}

// -----

// Does not fire: the inner split of %arg0's piece is on another axis (1, the outer on 0: the pieces are
// not runs of one axis); %arg1's piece #1 is returned as well, so it must stay a value of its own.
// CHECK-LABEL: func.func @not_fused
// CHECK-NEXT: %[[S:.*]]:2 = "taso.split"(%arg0) {axis = 0 : i64, {{.*}}sizes = array<i64: 2, 2>}
// CHECK-NEXT: %[[T:.*]]:2 = "taso.split"(%[[S]]#1) {axis = 1 : i64, {{.*}}sizes = array<i64: 4, 4>}
// CHECK-NEXT: %[[U:.*]]:2 = "taso.split"(%arg1) {axis = 1 : i64, {{.*}}sizes = array<i64: 4, 8>}
// CHECK-NEXT: %[[V:.*]]:2 = "taso.split"(%[[U]]#1) {axis = 1 : i64, {{.*}}sizes = array<i64: 2, 6>}
// CHECK-NEXT: return %[[S]]#0, %[[T]]#0, %[[T]]#1, %[[U]]#0, %[[U]]#1, %[[V]]#0, %[[V]]#1
func.func @not_fused(%x: tensor<4x8xf32>, %y: tensor<1x12xf32>) -> (tensor<2x8xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1x4xf32>, tensor<1x8xf32>, tensor<1x2xf32>, tensor<1x6xf32>) {
  %s:2 = "taso.split"(%x) {axis = 0 : i64, sizes = array<i64: 2, 2>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<4x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>)
  %t:2 = "taso.split"(%s#1) {axis = 1 : i64, sizes = array<i64: 4, 4>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<2x8xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>)
  %u:2 = "taso.split"(%y) {axis = 1 : i64, sizes = array<i64: 4, 8>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x12xf32>) -> (tensor<1x4xf32>, tensor<1x8xf32>)
  %v:2 = "taso.split"(%u#1) {axis = 1 : i64, sizes = array<i64: 2, 6>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x8xf32>) -> (tensor<1x2xf32>, tensor<1x6xf32>)
  return %s#0, %t#0, %t#1, %u#0, %u#1, %v#0, %v#1 : tensor<2x8xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1x4xf32>, tensor<1x8xf32>, tensor<1x2xf32>, tensor<1x6xf32>
}
