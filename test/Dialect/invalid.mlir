// RUN: not taso-opt %s --split-input-file 2>&1 | FileCheck %s
// Invalid taso ops: one clear line each, pointing at the line of the op.

func.func @bad_shape(%x: tensor<1x4x8x8xf32>, %w: tensor<8x4x3x3xf32>) -> tensor<1x8x8x8xf32> {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: 'taso.conv2d' op: result shapes {{\[\[}}1, 8, 8, 8]] differ from the spec's {{\[\[}}1, 8, 6, 6]]
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1>} : (tensor<1x4x8x8xf32>, tensor<8x4x3x3xf32>) -> tensor<1x8x8x8xf32>
  return %c : tensor<1x8x8x8xf32>
}

// -----

func.func @bad_activation(%x: tensor<2x3xf32>, %y: tensor<3x4xf32>) -> tensor<2x4xf32> {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: {{.*}}does not satisfy the constraint
  %m = "taso.matmul"(%x, %y) {activation = "gelu"} : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  return %m : tensor<2x4xf32>
}

// -----

func.func @missing_attr(%x: tensor<2x3xf32>) -> tensor<3x2xf32> {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: {{.*}}attribute "perm" is expected but not provided
  %t = "taso.transpose"(%x) : (tensor<2x3xf32>) -> tensor<3x2xf32>
  return %t : tensor<3x2xf32>
}

// -----

func.func @concat_mismatch(%x: tensor<2x3xf32>, %y: tensor<3x3xf32>) -> tensor<2x6xf32> {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: 'taso.concat' op: concat: shapes {{.*}} disagree outside axis 1
  %c = "taso.concat"(%x, %y) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x6xf32>
  return %c : tensor<2x6xf32>
}

// -----

func.func @weight_type() -> tensor<2x2xf32> {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: 'taso.weight' op: value type tensor<4xf32> differs from result type tensor<2x2xf32>
  %w = "taso.weight"() {name = "w", value = dense<1.0> : tensor<4xf32>} : () -> tensor<2x2xf32>
  return %w : tensor<2x2xf32>
}

// -----

func.func @operand_count(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{.*}}op expects exactly 1 operands, but got 2
  %r = "taso.relu"(%x, %x) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  return %r : tensor<2x3xf32>
}

// -----

func.func @dynamic(%x: tensor<?x3xf32>) -> tensor<?x3xf32> {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: 'taso.relu' op: operand type tensor<?x3xf32> is not a statically shaped tensor
  %r = "taso.relu"(%x) : (tensor<?x3xf32>) -> tensor<?x3xf32>
  return %r : tensor<?x3xf32>
}

// -----

func.func @unregistered(%x: tensor<2xf32>) -> tensor<2xf32> {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: unregistered operation 'foo.bar' (pass --allow-unregistered-dialect to allow it)
  %r = "foo.bar"(%x) : (tensor<2xf32>) -> tensor<2xf32>
  return %r : tensor<2xf32>
}

// -----

// CHECK: invalid.mlir:[[# @LINE + 2]]:{{[0-9]+}}: expected '>' in tensor type
func.func @syntax(%x: tensor<2xf32>) -> tensor<2xf32> {
  return %x : tensor<2xf32
}
