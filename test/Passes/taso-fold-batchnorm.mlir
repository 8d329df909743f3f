// RUN: taso-opt %s --split-input-file --taso-fold-batchnorm | FileCheck %s
// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-search{report=-})' -o /dev/null 2>&1 | FileCheck %s --check-prefix=SEARCH
// taso-fold-batchnorm folds inference batchnorm into the conv before it (TASO's conv + batchnorm rule):
// per output channel o, k = scale[o] / sqrt(var[o] + eps), w'[o] = w[o] * k, b'[o] = (b[o] - mean[o]) * k + bias[o].
// Here k = 3 / sqrt(3 + 1) = 1.5. taso-search runs it first; its cost before is the input's.

// No conv bias: w' = 2 * 1.5 = 3, b' = (0 - 1) * 1.5 + 0.5 = -1.
// CHECK-LABEL: func.func @fold
// CHECK-DAG: %[[W:.*]] = "taso.weight"() {name = "w.bn", value = dense<3.000000e+00> : tensor<4x2x3x3xf32>}
// CHECK-DAG: %[[B:.*]] = "taso.weight"() {name = "bias.bn", value = dense<-1.000000e+00> : tensor<4xf32>}
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, %[[W]], %[[B]]) {activation = "none"{{.*}}pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>}
// CHECK-NOT: taso.batchnorm
// CHECK: return %[[C]]
// SEARCH: @fold: cost {{.*}} ops 7 -> 3
// SEARCH: 1 batchnorms folded into convolutions
func.func @fold(%x: tensor<1x2x5x5xf32>) -> tensor<1x4x5x5xf32> {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x2x3x3xf32>} : () -> tensor<4x2x3x3xf32>
  %s = "taso.weight"() {name = "scale", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %b = "taso.weight"() {name = "bias", value = dense<0.5> : tensor<4xf32>} : () -> tensor<4xf32>
  %m = "taso.weight"() {name = "mean", value = dense<1.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %v = "taso.weight"() {name = "var", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x5x5xf32>
  %y = "taso.batchnorm"(%c, %s, %b, %m, %v) {epsilon = 1.0 : f32} : (tensor<1x4x5x5xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x4x5x5xf32>
  return %y : tensor<1x4x5x5xf32>
}

// -----

// A conv bias, group 2, stride 2: w' = 2 * 1.5 = 3, b' = (0.25 - 1) * 1.5 + 0.5 = -0.625; attributes kept.
// CHECK-LABEL: func.func @fold_bias_grouped_strided
// CHECK-DAG: %[[W:.*]] = "taso.weight"() {name = "w.bn", value = dense<3.000000e+00> : tensor<4x1x3x3xf32>}
// CHECK-DAG: %[[B:.*]] = "taso.weight"() {name = "bias.bn", value = dense<-6.250000e-01> : tensor<4xf32>}
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, %[[W]], %[[B]]) {activation = "none"{{.*}}group = 2 : i64{{.*}}strides = array<i64: 2, 2>}
// CHECK-NOT: taso.batchnorm
// CHECK: return %[[C]]
// SEARCH: 1 batchnorms folded into convolutions
func.func @fold_bias_grouped_strided(%x: tensor<1x2x5x5xf32>) -> tensor<1x4x3x3xf32> {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x1x3x3xf32>} : () -> tensor<4x1x3x3xf32>
  %cb = "taso.weight"() {name = "conv_bias", value = dense<0.25> : tensor<4xf32>} : () -> tensor<4xf32>
  %s = "taso.weight"() {name = "scale", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %b = "taso.weight"() {name = "bias", value = dense<0.5> : tensor<4xf32>} : () -> tensor<4xf32>
  %m = "taso.weight"() {name = "mean", value = dense<1.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %v = "taso.weight"() {name = "var", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %c = "taso.conv2d"(%x, %w, %cb) {activation = "none", dilations = array<i64: 1, 1>, group = 2 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 2, 2>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x2x5x5xf32>, tensor<4x1x3x3xf32>, tensor<4xf32>) -> tensor<1x4x3x3xf32>
  %y = "taso.batchnorm"(%c, %s, %b, %m, %v) {epsilon = 1.0 : f32} : (tensor<1x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x4x3x3xf32>
  return %y : tensor<1x4x3x3xf32>
}

// -----

// Not after a conv with a fused relu: batchnorm(relu(conv)) is not a conv.
// CHECK-LABEL: func.func @fused_relu
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, %{{.*}}) {activation = "relu"
// CHECK: "taso.batchnorm"(%[[C]],
// SEARCH: @fused_relu: cost
// SEARCH-NOT: batchnorms folded
// SEARCH: total time
func.func @fused_relu(%x: tensor<1x2x5x5xf32>) -> tensor<1x4x5x5xf32> {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x2x3x3xf32>} : () -> tensor<4x2x3x3xf32>
  %s = "taso.weight"() {name = "scale", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %b = "taso.weight"() {name = "bias", value = dense<0.5> : tensor<4xf32>} : () -> tensor<4xf32>
  %m = "taso.weight"() {name = "mean", value = dense<1.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %v = "taso.weight"() {name = "var", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %c = "taso.conv2d"(%x, %w) {activation = "relu", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x5x5xf32>
  %y = "taso.batchnorm"(%c, %s, %b, %m, %v) {epsilon = 1.0 : f32} : (tensor<1x4x5x5xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x4x5x5xf32>
  return %y : tensor<1x4x5x5xf32>
}

// -----

// Not after an op other than conv2d.
// CHECK-LABEL: func.func @after_relu
// CHECK: %[[R:.*]] = "taso.relu"(%arg0)
// CHECK: "taso.batchnorm"(%[[R]],
// SEARCH: @after_relu: cost
// SEARCH-NOT: batchnorms folded
// SEARCH: total time
func.func @after_relu(%x: tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32> {
  %s = "taso.weight"() {name = "scale", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %b = "taso.weight"() {name = "bias", value = dense<0.5> : tensor<4xf32>} : () -> tensor<4xf32>
  %m = "taso.weight"() {name = "mean", value = dense<1.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %v = "taso.weight"() {name = "var", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %r = "taso.relu"(%x) : (tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %y = "taso.batchnorm"(%r, %s, %b, %m, %v) {epsilon = 1.0 : f32} : (tensor<1x4x5x5xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x4x5x5xf32>
  return %y : tensor<1x4x5x5xf32>
}

// -----

// Not when a parameter is not a constant (here the mean is a function argument).
// CHECK-LABEL: func.func @mean_not_constant
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, %{{.*}}) {activation = "none"
// CHECK: "taso.batchnorm"(%[[C]], %{{.*}}, %{{.*}}, %arg1, %{{.*}})
// SEARCH: @mean_not_constant: cost
// SEARCH-NOT: batchnorms folded
// SEARCH: total time
func.func @mean_not_constant(%x: tensor<1x2x5x5xf32>, %mean: tensor<4xf32>) -> tensor<1x4x5x5xf32> {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x2x3x3xf32>} : () -> tensor<4x2x3x3xf32>
  %s = "taso.weight"() {name = "scale", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %b = "taso.weight"() {name = "bias", value = dense<0.5> : tensor<4xf32>} : () -> tensor<4xf32>
  %v = "taso.weight"() {name = "var", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x5x5xf32>
  %y = "taso.batchnorm"(%c, %s, %b, %mean, %v) {epsilon = 1.0 : f32} : (tensor<1x4x5x5xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x4x5x5xf32>
  return %y : tensor<1x4x5x5xf32>
}

// -----

// Not when the conv result has another use: the unfolded conv would be computed anyway.
// CHECK-LABEL: func.func @conv_used_twice
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, %{{.*}}) {activation = "none"
// CHECK: %[[Y:.*]] = "taso.batchnorm"(%[[C]],
// CHECK: return %[[Y]], %[[C]]
// SEARCH: @conv_used_twice: cost
// SEARCH-NOT: batchnorms folded
// SEARCH: total time
func.func @conv_used_twice(%x: tensor<1x2x5x5xf32>) -> (tensor<1x4x5x5xf32>, tensor<1x4x5x5xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x2x3x3xf32>} : () -> tensor<4x2x3x3xf32>
  %s = "taso.weight"() {name = "scale", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %b = "taso.weight"() {name = "bias", value = dense<0.5> : tensor<4xf32>} : () -> tensor<4xf32>
  %m = "taso.weight"() {name = "mean", value = dense<1.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %v = "taso.weight"() {name = "var", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x5x5xf32>
  %y = "taso.batchnorm"(%c, %s, %b, %m, %v) {epsilon = 1.0 : f32} : (tensor<1x4x5x5xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x4x5x5xf32>
  return %y, %c : tensor<1x4x5x5xf32>, tensor<1x4x5x5xf32>
}
