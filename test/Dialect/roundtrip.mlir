// RUN: taso-opt %s | taso-opt | FileCheck %s
// RUN: taso-opt %s --emit-bytecode | taso-opt | FileCheck %s
// Every taso op parses, verifies (IRDL + operator specs) and prints back unchanged.

// CHECK-LABEL: func.func @cnn
func.func @cnn(%x: tensor<1x4x8x8xf32>) -> tensor<1x8x2x2xf32> {
  // CHECK: %[[W:.*]] = "taso.weight"() {name = "w", value = dense<1.000000e+00> : tensor<8x4x3x3xf32>}
  %w = "taso.weight"() {name = "w", value = dense<1.0> : tensor<8x4x3x3xf32>} : () -> tensor<8x4x3x3xf32>
  // CHECK: %[[C:.*]] = "taso.conv2d"(%{{.*}}, %[[W]]) {activation = "relu", dilations = array<i64: 1, 1>, group = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0>, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 2, 2>}
  %c = "taso.conv2d"(%x, %w) {activation = "relu", dilations = array<i64: 1, 1>, group = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0>, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 2, 2>} : (tensor<1x4x8x8xf32>, tensor<8x4x3x3xf32>) -> tensor<1x8x4x4xf32>
  // CHECK: "taso.maxpool2d"(%[[C]]) {kernel_shape = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>}
  %p = "taso.maxpool2d"(%c) {kernel_shape = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<1x8x4x4xf32>) -> tensor<1x8x2x2xf32>
  // CHECK: "taso.avgpool2d"
  %a = "taso.avgpool2d"(%p) {count_include_pad = 0 : i64, kernel_shape = array<i64: 3, 3>, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x8x2x2xf32>) -> tensor<1x8x2x2xf32>
  // CHECK: "taso.batchnorm"
  %s = "taso.weight"() {name = "s", value = dense<1.0> : tensor<8xf32>} : () -> tensor<8xf32>
  %bn = "taso.batchnorm"(%a, %s, %s, %s, %s) {epsilon = 1.0e-05 : f32} : (tensor<1x8x2x2xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<1x8x2x2xf32>
  return %bn : tensor<1x8x2x2xf32>
}

// CHECK-LABEL: func.func @shapes
func.func @shapes(%x: tensor<2x6xf32>, %y: tensor<6x4xf32>, %s: tensor<f32>) -> (tensor<2x6xf32>, tensor<4x2xf32>, tensor<8xf32>) {
  // CHECK: "taso.matmul"(%{{.*}}, %{{.*}}) {activation = "none"}
  %m = "taso.matmul"(%x, %y) {activation = "none"} : (tensor<2x6xf32>, tensor<6x4xf32>) -> tensor<2x4xf32>
  // CHECK: "taso.transpose"(%{{.*}}) {perm = array<i64: 1, 0>}
  %t = "taso.transpose"(%m) {perm = array<i64: 1, 0>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
  // CHECK: "taso.reshape"(%{{.*}}) {shape = array<i64: 8>}
  %r = "taso.reshape"(%t) {shape = array<i64: 8>} : (tensor<4x2xf32>) -> tensor<8xf32>
  // CHECK: "taso.split"(%{{.*}}) {axis = 1 : i64, resultSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>, sizes = array<i64: 1, 2, 3>}
  %p:3 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 1, 2, 3>, resultSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<2x6xf32>) -> (tensor<2x1xf32>, tensor<2x2xf32>, tensor<2x3xf32>)
  // CHECK: "taso.concat"(%{{.*}}, %{{.*}}, %{{.*}}) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 0
  %c = "taso.concat"(%p#2, %p#0, %p#1) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<2x3xf32>, tensor<2x1xf32>, tensor<2x2xf32>) -> tensor<2x6xf32>
  // CHECK: "taso.ewadd"
  %e = "taso.ewadd"(%c, %x) : (tensor<2x6xf32>, tensor<2x6xf32>) -> tensor<2x6xf32>
  // CHECK: "taso.ewmul"
  %f = "taso.ewmul"(%e, %x) : (tensor<2x6xf32>, tensor<2x6xf32>) -> tensor<2x6xf32>
  // CHECK: "taso.smul"
  %g = "taso.smul"(%f, %s) : (tensor<2x6xf32>, tensor<f32>) -> tensor<2x6xf32>
  // CHECK: "taso.relu"
  %h = "taso.relu"(%g) : (tensor<2x6xf32>) -> tensor<2x6xf32>
  // CHECK: "taso.sigmoid"
  %i = "taso.sigmoid"(%h) : (tensor<2x6xf32>) -> tensor<2x6xf32>
  // CHECK: "taso.tanh"
  %j = "taso.tanh"(%i) : (tensor<2x6xf32>) -> tensor<2x6xf32>
  return %j, %t, %r : tensor<2x6xf32>, tensor<4x2xf32>, tensor<8xf32>
}

// CHECK-LABEL: func.func @constants
func.func @constants() -> (tensor<4x1x3x3xf32>, tensor<4x4x3x3xf32>, tensor<5x5xf32>, tensor<2x3xf32>, tensor<4x4x3x3xf32>) {
  // CHECK: "taso.const_pool"() : () -> tensor<4x1x3x3xf32>
  %0 = "taso.const_pool"() : () -> tensor<4x1x3x3xf32>
  // CHECK: "taso.const_iconv"() : () -> tensor<4x4x3x3xf32>
  %1 = "taso.const_iconv"() : () -> tensor<4x4x3x3xf32>
  // CHECK: "taso.const_imatmul"() : () -> tensor<5x5xf32>
  %2 = "taso.const_imatmul"() : () -> tensor<5x5xf32>
  // CHECK: "taso.const_iewmul"() : () -> tensor<2x3xf32>
  %3 = "taso.const_iewmul"() : () -> tensor<2x3xf32>
  %w = "taso.weight"() {name = "k", value = dense<2.0> : tensor<4x4x1x1xf32>} : () -> tensor<4x4x1x1xf32>
  // CHECK: "taso.enlarge"(%{{.*}}) {kernel_shape = array<i64: 3, 3>}
  %4 = "taso.enlarge"(%w) {kernel_shape = array<i64: 3, 3>} : (tensor<4x4x1x1xf32>) -> tensor<4x4x3x3xf32>
  return %0, %1, %2, %3, %4 : tensor<4x1x3x3xf32>, tensor<4x4x3x3xf32>, tensor<5x5xf32>, tensor<2x3xf32>, tensor<4x4x3x3xf32>
}
