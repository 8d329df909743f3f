// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-fuse-activation{cost-model=analytic:t4})' | FileCheck %s
// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-search{cost-model=analytic:t4 report=-})' -o /dev/null 2>&1 | FileCheck %s --check-prefix=SEARCH
// taso-fuse-activation fuses a taso.relu into the conv2d or matmul before it ({activation = "relu"}) where
// that op has no activation and no other use. taso-search runs it before the search, and its report
// prices that prepared function as the baseline the search's reduction is from.

// Fires: a conv with a bias, and a 3-D matmul with a bias.
// CHECK-LABEL: func.func @fuse
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, %{{.*}}, %{{.*}}) {activation = "relu"
// CHECK: %[[M:.*]] = "taso.matmul"(%arg1, %{{.*}}, %{{.*}}) {activation = "relu"
// CHECK-NOT: taso.relu
// CHECK: return %[[C]], %[[M]]
// SEARCH: @fuse: cost {{.*}}; prepared {{.*}} ms, {{.*}}% less by the search), ops 8 -> 6
// SEARCH: taso-fuse-activation: 2 relus fused into the convolutions and matmuls before them
func.func @fuse(%x: tensor<1x2x5x5xf32>, %m: tensor<2x3x4xf32>) -> (tensor<1x4x5x5xf32>, tensor<2x3x4xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x2x3x3xf32>} : () -> tensor<4x2x3x3xf32>
  %b = "taso.weight"() {name = "b", value = dense<-1.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %mw = "taso.weight"() {name = "mw", value = dense<0.5> : tensor<4x4xf32>} : () -> tensor<4x4xf32>
  %mb = "taso.weight"() {name = "mb", value = dense<0.25> : tensor<4xf32>} : () -> tensor<4xf32>
  %c = "taso.conv2d"(%x, %w, %b) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>, tensor<4xf32>) -> tensor<1x4x5x5xf32>
  %r = "taso.relu"(%c) : (tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %p = "taso.matmul"(%m, %mw, %mb) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<2x3x4xf32>, tensor<4x4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32>
  %q = "taso.relu"(%p) : (tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
  return %r, %q : tensor<1x4x5x5xf32>, tensor<2x3x4xf32>
}

// -----

// Does not fire: the conv result has another use (it is returned too), the conv already has a fused relu,
// the relu follows an op that has no activation (an add).
// CHECK-LABEL: func.func @no_fuse
// CHECK-COUNT-3: "taso.relu"
// SEARCH: @no_fuse:
// SEARCH-NOT: relus fused
func.func @no_fuse(%x: tensor<1x2x5x5xf32>) -> (tensor<1x4x5x5xf32>, tensor<1x4x5x5xf32>, tensor<1x4x3x3xf32>, tensor<1x4x5x5xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x2x3x3xf32>} : () -> tensor<4x2x3x3xf32>
  %c1 = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x5x5xf32>
  %r1 = "taso.relu"(%c1) : (tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %c2 = "taso.conv2d"(%x, %w) {activation = "relu", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x3x3xf32>
  %r2 = "taso.relu"(%c2) : (tensor<1x4x3x3xf32>) -> tensor<1x4x3x3xf32>
  %e = "taso.ewadd"(%c1, %c1) : (tensor<1x4x5x5xf32>, tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %r3 = "taso.relu"(%e) : (tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  return %r1, %c1, %r2, %r3 : tensor<1x4x5x5xf32>, tensor<1x4x5x5xf32>, tensor<1x4x3x3xf32>, tensor<1x4x5x5xf32>
}
