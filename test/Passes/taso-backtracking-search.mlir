// RUN: taso-opt %s --split-input-file --taso-backtracking-search | FileCheck %s
// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-backtracking-search{cost-model=analytic budget=10})' | FileCheck %s
// taso-backtracking-search runs TASO's cost-based backtracking search with the verified rules on the
// function's graph (the default analytic cost model), then replays the best graph's rewrites on the IR
// as PDL patterns at the chosen sites, checked to give exactly the graph the search scored. Alone it
// does nothing else: no weight folding, no never-worse guard (taso-search wraps it with those).

// Fires: relu(conv(x, w)) = conv(x, w) {activation = "relu"} (axiom 14) saves the relu's launch.
// CHECK-LABEL: func.func @fuse_relu
// CHECK-NEXT: %[[W:.*]] = "taso.weight"() {name = "w"
// CHECK-NEXT: %[[C:.*]] = "taso.conv2d"(%arg0, %[[W]]) {activation = "relu", dilations = array<i64: 1, 1>, group = 1 : i64, {{.*}}pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>}
// CHECK-NEXT: return %[[C]]
// CHECK-NOT: taso.relu
func.func @fuse_relu(%x: tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<8x8x3x3xf32>} : () -> tensor<8x8x3x3xf32>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x8x7x7xf32>, tensor<8x8x3x3xf32>) -> tensor<1x8x7x7xf32>
  %r = "taso.relu"(%c) : (tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32>
  return %r : tensor<1x8x7x7xf32>
}

// -----

// Does not fire: the conv's unfused result is returned too; it is not an output the rule maps (the
// rule's target has no value for it), so the site is refused and the graph stays as it is.
// CHECK-LABEL: func.func @external_use
// CHECK-NEXT: %[[W:.*]] = "taso.weight"() {name = "w"
// CHECK-NEXT: %[[C:.*]] = "taso.conv2d"(%arg0, %[[W]]) {activation = "none"
// CHECK-NEXT: %[[R:.*]] = "taso.relu"(%[[C]])
// CHECK-NEXT: return %[[R]], %[[C]]
func.func @external_use(%x: tensor<1x8x7x7xf32>) -> (tensor<1x8x7x7xf32>, tensor<1x8x7x7xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<8x8x3x3xf32>} : () -> tensor<8x8x3x3xf32>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x8x7x7xf32>, tensor<8x8x3x3xf32>) -> tensor<1x8x7x7xf32>
  %r = "taso.relu"(%c) : (tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32>
  return %r, %c : tensor<1x8x7x7xf32>, tensor<1x8x7x7xf32>
}

// -----

// With a bias operand (the conv-bias family's rule, B14: relu(conv(x, w, b)) = conv_relu(x, w, b)), at
// stride 2 (the rule is stated with a symbolic stride, proved for any stride): fires.
// CHECK-LABEL: func.func @bias_stride2_fusion
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, %{{.*}}, %{{.*}}) {activation = "relu"{{.*}}strides = array<i64: 2, 2>
// CHECK-NOT: taso.relu
// CHECK: return %[[C]]
func.func @bias_stride2_fusion(%x: tensor<1x8x7x7xf32>) -> tensor<1x8x4x4xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<8x8x3x3xf32>} : () -> tensor<8x8x3x3xf32>
  %b = "taso.weight"() {name = "b", value = dense<0.5> : tensor<8xf32>} : () -> tensor<8xf32>
  %c = "taso.conv2d"(%x, %w, %b) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 2, 2>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x8x7x7xf32>, tensor<8x8x3x3xf32>, tensor<8xf32>) -> tensor<1x8x4x4xf32>
  %r = "taso.relu"(%c) : (tensor<1x8x4x4xf32>) -> tensor<1x8x4x4xf32>
  return %r : tensor<1x8x4x4xf32>
}

// -----

// Not at stride 3: a rule's symbolic stride applies at strides 1 and 2, where its axioms were validated.
// CHECK-LABEL: func.func @stride3_blocks_fusion
// CHECK: taso.conv2d{{.*}}activation = "none"
// CHECK: taso.relu
func.func @stride3_blocks_fusion(%x: tensor<1x8x7x7xf32>) -> tensor<1x8x3x3xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<8x8x3x3xf32>} : () -> tensor<8x8x3x3xf32>
  %b = "taso.weight"() {name = "b", value = dense<0.5> : tensor<8xf32>} : () -> tensor<8xf32>
  %c = "taso.conv2d"(%x, %w, %b) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 3, 3>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x8x7x7xf32>, tensor<8x8x3x3xf32>, tensor<8xf32>) -> tensor<1x8x3x3xf32>
  %r = "taso.relu"(%c) : (tensor<1x8x3x3xf32>) -> tensor<1x8x3x3xf32>
  return %r : tensor<1x8x3x3xf32>
}
