// RUN: taso-opt %s --split-input-file --taso-fuse-relu6 | FileCheck %s
// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-search{report=-})' -o /dev/null 2>&1 | FileCheck %s --check-prefix=SEARCH
// taso-fuse-relu6 fuses ReLU6 (onnx.Clip with constant bounds 0 and 6, as torch exports nn.ReLU6) into the
// convolution before it: conv2d {activation = "relu6"}. taso-search runs it after the batchnorm folding.

// Fires: Clip(conv, 0, 6); the bounds, now unused, go.
// CHECK-LABEL: func.func @fuse
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, %{{.*}}) {activation = "relu6"
// CHECK-NOT: onnx.Clip
// CHECK-NOT: name = "lo"
// CHECK: return %[[C]]
// SEARCH: @fuse: cost {{.*}} ops 5 -> 2
// SEARCH: 1 ReLU6 (Clip 0..6) fused into the convolutions before them
func.func @fuse(%x: tensor<1x2x5x5xf32>) -> tensor<1x4x5x5xf32> {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x2x3x3xf32>} : () -> tensor<4x2x3x3xf32>
  %lo = "taso.weight"() {name = "lo", value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
  %hi = "taso.weight"() {name = "hi", value = dense<6.0> : tensor<f32>} : () -> tensor<f32>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x5x5xf32>
  %y = "onnx.Clip"(%c, %lo, %hi) : (tensor<1x4x5x5xf32>, tensor<f32>, tensor<f32>) -> tensor<1x4x5x5xf32>
  return %y : tensor<1x4x5x5xf32>
}

// -----

// Fires after a fused relu too (Clip(relu(y), 0, 6) = relu6(y)), on a depthwise conv with a bias.
// CHECK-LABEL: func.func @fuse_after_relu
// CHECK: "taso.conv2d"{{.*}}{activation = "relu6"{{.*}}group = 4 : i64
// CHECK-NOT: onnx.Clip
// SEARCH: @fuse_after_relu:
// SEARCH: 1 ReLU6 (Clip 0..6) fused into the convolutions before them
func.func @fuse_after_relu(%x: tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32> {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x1x3x3xf32>} : () -> tensor<4x1x3x3xf32>
  %b = "taso.weight"() {name = "b", value = dense<0.5> : tensor<4xf32>} : () -> tensor<4xf32>
  %lo = "taso.weight"() {name = "lo", value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
  %hi = "taso.weight"() {name = "hi", value = dense<6.0> : tensor<f32>} : () -> tensor<f32>
  %c = "taso.conv2d"(%x, %w, %b) {activation = "relu", dilations = array<i64: 1, 1>, group = 4 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x4x5x5xf32>, tensor<4x1x3x3xf32>, tensor<4xf32>) -> tensor<1x4x5x5xf32>
  %y = "onnx.Clip"(%c, %lo, %hi) : (tensor<1x4x5x5xf32>, tensor<f32>, tensor<f32>) -> tensor<1x4x5x5xf32>
  return %y : tensor<1x4x5x5xf32>
}

// -----

// Does not fire: the bounds are 0 and 5 (not ReLU6), the conv result has another use, the upper bound
// is an argument (not a constant).
// CHECK-LABEL: func.func @no_fuse
// CHECK-COUNT-3: "onnx.Clip"
// CHECK-NOT: relu6
// SEARCH: @no_fuse:
// SEARCH-NOT: ReLU6
func.func @no_fuse(%x: tensor<1x2x5x5xf32>, %h: tensor<f32>) -> (tensor<1x4x5x5xf32>, tensor<1x4x5x5xf32>, tensor<1x4x5x5xf32>, tensor<1x4x5x5xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x2x3x3xf32>} : () -> tensor<4x2x3x3xf32>
  %lo = "taso.weight"() {name = "lo", value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
  %hi = "taso.weight"() {name = "hi", value = dense<6.0> : tensor<f32>} : () -> tensor<f32>
  %five = "taso.weight"() {name = "five", value = dense<5.0> : tensor<f32>} : () -> tensor<f32>
  %c1 = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x5x5xf32>
  %y1 = "onnx.Clip"(%c1, %lo, %five) : (tensor<1x4x5x5xf32>, tensor<f32>, tensor<f32>) -> tensor<1x4x5x5xf32>
  %c2 = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x5x5xf32>
  %y2 = "onnx.Clip"(%c2, %lo, %hi) : (tensor<1x4x5x5xf32>, tensor<f32>, tensor<f32>) -> tensor<1x4x5x5xf32>
  %c3 = "taso.conv2d"(%x, %w) {activation = "relu", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x5x5xf32>
  %y3 = "onnx.Clip"(%c3, %lo, %h) : (tensor<1x4x5x5xf32>, tensor<f32>, tensor<f32>) -> tensor<1x4x5x5xf32>
  return %y1, %y2, %c2, %y3 : tensor<1x4x5x5xf32>, tensor<1x4x5x5xf32>, tensor<1x4x5x5xf32>, tensor<1x4x5x5xf32>
}

// -----

// Does not fire, and is no error: a bound left out (ONNX's empty optional input, onnx.NoValue of type
// none) is -inf or +inf, not ReLU6.
// CHECK-LABEL: func.func @omitted_bound
// CHECK: "onnx.Clip"(%{{.*}}, %{{.*}}, %{{.*}}) : (tensor<1x4x5x5xf32>, none, tensor<f32>)
// CHECK-NOT: relu6
// SEARCH: @omitted_bound:
// SEARCH-NOT: ReLU6
func.func @omitted_bound(%x: tensor<1x2x5x5xf32>) -> tensor<1x4x5x5xf32> {
  %none = "onnx.NoValue"() {value} : () -> none
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x2x3x3xf32>} : () -> tensor<4x2x3x3xf32>
  %hi = "taso.weight"() {name = "hi", value = dense<6.0> : tensor<f32>} : () -> tensor<f32>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x5x5xf32>
  %y = "onnx.Clip"(%c, %none, %hi) : (tensor<1x4x5x5xf32>, none, tensor<f32>) -> tensor<1x4x5x5xf32>
  return %y : tensor<1x4x5x5xf32>
}

// -----

// Fires through a taso.relu (Clip(relu(y), 0, 6) = relu6(y)): the relu goes too.
// CHECK-LABEL: func.func @through_relu
// CHECK: %[[C:.*]] = "taso.conv2d"{{.*}}{activation = "relu6"
// CHECK-NOT: taso.relu
// CHECK-NOT: onnx.Clip
// CHECK: return %[[C]]
// SEARCH: @through_relu:
// SEARCH: 1 ReLU6 (Clip 0..6) fused into the convolutions before them
func.func @through_relu(%x: tensor<1x2x5x5xf32>) -> tensor<1x4x5x5xf32> {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x2x3x3xf32>} : () -> tensor<4x2x3x3xf32>
  %lo = "taso.weight"() {name = "lo", value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
  %hi = "taso.weight"() {name = "hi", value = dense<6.0> : tensor<f32>} : () -> tensor<f32>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x5x5xf32>
  %r = "taso.relu"(%c) : (tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %y = "onnx.Clip"(%r, %lo, %hi) : (tensor<1x4x5x5xf32>, tensor<f32>, tensor<f32>) -> tensor<1x4x5x5xf32>
  return %y : tensor<1x4x5x5xf32>
}
