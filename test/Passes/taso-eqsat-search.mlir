// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-eqsat-search{target=analytic:t4})' | FileCheck %s
// taso-eqsat-search saturates an e-graph of the function with the verified rules and writes the cheapest
// acyclic graph it holds back into the function (extracted by an integer program). Alone it does
// nothing else: no weight folding (the concats of kernels stay ops on weights), no never-worse guard.

// Fires: SqueezeNet's fire module, two convolutions of one input (1x1 and 3x3, each with a bias and a
// relu) concatenated, becomes one 3x3 convolution of the concatenated (enlarged) kernels with the relu
// fused: the graph the backtracking search finds only with alpha > 1 (taso-search.mlir).
// CHECK-LABEL: func.func @fire_merge
// CHECK-DAG: "taso.enlarge"
// CHECK-DAG: "taso.concat"
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, {{.*}}) {activation = "relu"
// CHECK-NEXT: return %[[C]]
// CHECK-NOT: taso.relu
func.func @fire_merge(%x: tensor<1x8x7x7xf32>) -> tensor<1x16x7x7xf32> {
  %w1 = "taso.weight"() {name = "w1", value = dense<0.5> : tensor<8x8x1x1xf32>} : () -> tensor<8x8x1x1xf32>
  %b1 = "taso.weight"() {name = "b1", value = dense<0.1> : tensor<8xf32>} : () -> tensor<8xf32>
  %w3 = "taso.weight"() {name = "w3", value = dense<0.25> : tensor<8x8x3x3xf32>} : () -> tensor<8x8x3x3xf32>
  %b3 = "taso.weight"() {name = "b3", value = dense<0.2> : tensor<8xf32>} : () -> tensor<8xf32>
  %c1 = "taso.conv2d"(%x, %w1, %b1) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x8x7x7xf32>, tensor<8x8x1x1xf32>, tensor<8xf32>) -> tensor<1x8x7x7xf32>
  %r1 = "taso.relu"(%c1) : (tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32>
  %c3 = "taso.conv2d"(%x, %w3, %b3) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x8x7x7xf32>, tensor<8x8x3x3xf32>, tensor<8xf32>) -> tensor<1x8x7x7xf32>
  %r3 = "taso.relu"(%c3) : (tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32>
  %cat = "taso.concat"(%r1, %r3) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x8x7x7xf32>, tensor<1x8x7x7xf32>) -> tensor<1x16x7x7xf32>
  return %cat : tensor<1x16x7x7xf32>
}

// -----

// Does not fire: one relu of an argument; no rule makes it cheaper, the function stays as it is.
// CHECK-LABEL: func.func @alone
// CHECK-NEXT: %[[R:.*]] = "taso.relu"(%arg0)
// CHECK-NEXT: return %[[R]]
func.func @alone(%x: tensor<1x8xf32>) -> tensor<1x8xf32> {
  %r = "taso.relu"(%x) : (tensor<1x8xf32>) -> tensor<1x8xf32>
  return %r : tensor<1x8xf32>
}
