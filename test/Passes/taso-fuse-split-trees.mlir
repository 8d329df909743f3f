// RUN: taso-opt %s --split-input-file --taso-fuse-split-trees | FileCheck %s
// taso-fuse-split-trees makes a split of a piece of another split, on the same axis, part of that
// split where nothing else uses the piece: one split into the finer pieces (at most 16), which moves
// the same bytes in one launch. TASO's rules split in two, so merging k ops leaves a tree of k - 1
// splits (the search costs the tree as its root split). Then a nest of splits on two axes, where every
// piece of a split on one axis is split (and only split) on another into the same sizes, is cut on the
// other axis first where that takes fewer splits: a batch of steps merged over gates, cut by step.

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

// -----

// A nest: the three gates of %x (axis 1) each cut into two steps (axis 0) is cut into the steps first,
// then each step into the gates: 3 splits instead of 4.
// CHECK-LABEL: func.func @nest
// CHECK-NEXT: %[[R:.*]]:2 = "taso.split"(%arg0) {axis = 0 : i64, {{.*}}sizes = array<i64: 4, 2>} : (tensor<6x8xf32>) -> (tensor<4x8xf32>, tensor<2x8xf32>)
// CHECK-NEXT: %[[P:.*]]:3 = "taso.split"(%[[R]]#0) {axis = 1 : i64, {{.*}}sizes = array<i64: 2, 2, 4>} : (tensor<4x8xf32>) -> (tensor<4x2xf32>, tensor<4x2xf32>, tensor<4x4xf32>)
// CHECK-NEXT: %[[Q:.*]]:3 = "taso.split"(%[[R]]#1) {axis = 1 : i64, {{.*}}sizes = array<i64: 2, 2, 4>} : (tensor<2x8xf32>) -> (tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x4xf32>)
// CHECK-NEXT: return %[[P]]#0, %[[Q]]#0, %[[P]]#1, %[[Q]]#1, %[[P]]#2, %[[Q]]#2
func.func @nest(%x: tensor<6x8xf32>) -> (tensor<4x2xf32>, tensor<2x2xf32>, tensor<4x2xf32>, tensor<2x2xf32>, tensor<4x4xf32>, tensor<2x4xf32>) {
  %a:3 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 2, 2, 4>, resultSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<6x8xf32>) -> (tensor<6x2xf32>, tensor<6x2xf32>, tensor<6x4xf32>)
  %b:2 = "taso.split"(%a#0) {axis = 0 : i64, sizes = array<i64: 4, 2>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<6x2xf32>) -> (tensor<4x2xf32>, tensor<2x2xf32>)
  %c:2 = "taso.split"(%a#1) {axis = 0 : i64, sizes = array<i64: 4, 2>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<6x2xf32>) -> (tensor<4x2xf32>, tensor<2x2xf32>)
  %d:2 = "taso.split"(%a#2) {axis = 0 : i64, sizes = array<i64: 4, 2>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<6x4xf32>) -> (tensor<4x4xf32>, tensor<2x4xf32>)
  return %b#0, %b#1, %c#0, %c#1, %d#0, %d#1 : tensor<4x2xf32>, tensor<2x2xf32>, tensor<4x2xf32>, tensor<2x2xf32>, tensor<4x4xf32>, tensor<2x4xf32>
}
