// RUN: taso-opt %s --split-input-file --taso-lift-elementwise | FileCheck %s
// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-lift-elementwise{cost-model=analytic})' | FileCheck %s
// taso-lift-elementwise replaces elementwise ops on the pieces of splits, f(split(X)#i, split(Y)#i)
// (ewadd, ewmul; relu, sigmoid, tanh on one split), by the pieces of split(f(X, Y)): each element is
// computed from the elements at its position, bit for bit. The two splits cut one axis alike. Only
// where the cost model (the default, analytic) charges the op on the whole and its split less than the
// ops on the pieces and the splits that go with them.

// Fires: two adds and the two splits they alone use become one add and one split (four ops, two).
// The operands of the second add were the other way round: IEEE addition commutes.
// CHECK-LABEL: func.func @pieces_of_two_splits
// CHECK-NEXT: %[[A:.*]] = "taso.ewadd"(%arg0, %arg1) : (tensor<1x512xf32>, tensor<1x512xf32>) -> tensor<1x512xf32>
// CHECK-NEXT: %[[S:.*]]:2 = "taso.split"(%[[A]]) {axis = 1 : i64, {{.*}}sizes = array<i64: 256, 256>}
// CHECK-NEXT: return %[[S]]#0, %[[S]]#1
func.func @pieces_of_two_splits(%x: tensor<1x512xf32>, %h: tensor<1x512xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>) {
  %xs:2 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 256, 256>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x512xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>)
  %hs:2 = "taso.split"(%h) {axis = 1 : i64, sizes = array<i64: 256, 256>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x512xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>)
  %a0 = "taso.ewadd"(%xs#0, %hs#0) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  %a1 = "taso.ewadd"(%hs#1, %xs#1) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  return %a0, %a1 : tensor<1x256xf32>, tensor<1x256xf32>
}

// -----

// Does not fire: the splits cut different sizes ([256, 256] and [256, 128, 128]), so the pieces do not
// line up, and the second add pairs piece 1 of one with piece 0 of the other (neither side is a matmul
// whose weight's columns could be permuted to align them).
// CHECK-LABEL: func.func @different_cuts
// CHECK-NEXT: %[[X:.*]]:2 = "taso.split"(%arg0)
// CHECK-NEXT: %[[H:.*]]:3 = "taso.split"(%arg1)
// CHECK-NEXT: %[[A0:.*]] = "taso.ewadd"(%[[X]]#0, %[[H]]#0)
// CHECK-NEXT: %[[A1:.*]] = "taso.ewadd"(%[[X]]#1, %[[H]]#0)
// CHECK-NEXT: return %[[A0]], %[[A1]]
func.func @different_cuts(%x: tensor<1x512xf32>, %h: tensor<1x512xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>) {
  %xs:2 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 256, 256>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x512xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>)
  %hs:3 = "taso.split"(%h) {axis = 1 : i64, sizes = array<i64: 256, 128, 128>, resultSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x512xf32>) -> (tensor<1x256xf32>, tensor<1x128xf32>, tensor<1x128xf32>)
  %a0 = "taso.ewadd"(%xs#0, %hs#0) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  %a1 = "taso.ewadd"(%xs#1, %hs#0) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  return %a0, %a1 : tensor<1x256xf32>, tensor<1x256xf32>
}

// -----

// Does not fire, by cost: the split stays (its piece #2 is returned as it is), so lifting would replace
// the two tanh on pieces by a tanh on the whole and a second split: two launches either way, which the
// cost model charges no less.
// CHECK-LABEL: func.func @split_stays
// CHECK-NEXT: %[[S:.*]]:3 = "taso.split"(%arg0)
// CHECK-NEXT: %[[T0:.*]] = "taso.tanh"(%[[S]]#0) : (tensor<1x256xf32>)
// CHECK-NEXT: %[[T1:.*]] = "taso.tanh"(%[[S]]#1) : (tensor<1x256xf32>)
// CHECK-NEXT: return %[[T0]], %[[T1]], %[[S]]#2
func.func @split_stays(%x: tensor<1x768xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>) {
  %xs:3 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 256, 256, 256>, resultSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x768xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>)
  %t0 = "taso.tanh"(%xs#0) : (tensor<1x256xf32>) -> tensor<1x256xf32>
  %t1 = "taso.tanh"(%xs#1) : (tensor<1x256xf32>) -> tensor<1x256xf32>
  return %t0, %t1, %xs#2 : tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>
}
