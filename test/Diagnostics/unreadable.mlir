// RUN: not taso-opt %s --split-input-file 2>&1 | FileCheck %s
// What the MLIR Python bindings cannot hand to Python without aborting the whole process (strings that
// are not UTF-8, complex-valued dense attributes) and what numpy cannot read is one clear line each;
// no abort, no traceback.

// CHECK: unreadable.mlir: the string "\FF\FE.x" (an op, attribute or symbol name or a string attribute) is not UTF-8 text
func.func @op_name(%x: tensor<2xf32>) -> tensor<2xf32> {
  %q = "\FF\FE.x"(%x) : (tensor<2xf32>) -> tensor<2xf32>
  return %q : tensor<2xf32>
}

// -----

// CHECK: unreadable.mlir: the string "onnx.\FF" {{.*}}is not UTF-8 text
func.func @onnx_op_name(%x: tensor<2xf32>) -> tensor<2xf32> {
  %q = "onnx.\FF"(%x) : (tensor<2xf32>) -> tensor<2xf32>
  return %q : tensor<2xf32>
}

// -----

// CHECK: unreadable.mlir: the string "\FF" {{.*}}is not UTF-8 text
func.func @attr_name(%x: tensor<2xf32>) -> tensor<2xf32> {
  %q = "taso.relu"(%x) {"\FF" = 1} : (tensor<2xf32>) -> tensor<2xf32>
  return %q : tensor<2xf32>
}

// -----

// CHECK: unreadable.mlir: the string "\FF\FE" {{.*}}is not UTF-8 text
func.func @weight_name() -> tensor<2xf32> {
  %w = "taso.weight"() {name = "\FF\FE", value = dense<1.0> : tensor<2xf32>} : () -> tensor<2xf32>
  return %w : tensor<2xf32>
}

// -----

// CHECK: unreadable.mlir: the string "\FF\FE" {{.*}}is not UTF-8 text
func.func @"\FF\FE"(%x: tensor<2xf32>) -> tensor<2xf32> {
  return %x : tensor<2xf32>
}

// -----

// CHECK: unreadable.mlir: complex-valued dense attributes are not supported
func.func @complex_weight() -> tensor<2xcomplex<f32>> {
  %w = "taso.weight"() {name = "w", value = dense<(1.0,2.0)> : tensor<2xcomplex<f32>>} : () -> tensor<2xcomplex<f32>>
  return %w : tensor<2xcomplex<f32>>
}

// -----

// CHECK: unreadable.mlir: complex-valued dense attributes are not supported
func.func @complex_attr(%x: tensor<2xf32>) -> tensor<2xf32> {
  %q = "onnx.Relu"(%x) {foo = [dense<(1.0,2.0)> : tensor<2xcomplex<f32>>]} : (tensor<2xf32>) -> tensor<2xf32>
  return %q : tensor<2xf32>
}

// -----

// CHECK: unreadable.mlir:[[# @LINE + 2]]:{{[0-9]+}}: 'taso.relu' op: element type complex<f32> is not supported
func.func @complex_relu(%x: tensor<2xcomplex<f32>>) -> tensor<2xcomplex<f32>> {
  %q = "taso.relu"(%x) : (tensor<2xcomplex<f32>>) -> tensor<2xcomplex<f32>>
  return %q : tensor<2xcomplex<f32>>
}

// -----

// CHECK: unreadable.mlir:[[# @LINE + 2]]:{{[0-9]+}}: 'taso.matmul' op: attribute 'extra': dense attribute of type tensor<2xi4>: element type i4 is not supported
func.func @unreadable_extra_attr(%x: tensor<2x3xf32>, %y: tensor<3x3xf32>) -> tensor<2x3xf32> {
  %m = "taso.matmul"(%x, %y) {extra = dense<1> : tensor<2xi4>, activation = "none"} : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>
  return %m : tensor<2x3xf32>
}

// -----

// CHECK: unreadable.mlir:[[# @LINE + 2]]:{{[0-9]+}}: 'taso.conv2d' op: attribute 'strides': unsupported attribute array<f32: 1.000000e+00, 1.000000e+00>
func.func @float_array(%x: tensor<1x4x8x8xf32>, %w: tensor<8x4x3x3xf32>) -> tensor<1x8x6x6xf32> {
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0>, pads = array<i64: 0, 0, 0, 0>, strides = array<f32: 1.0, 1.0>} : (tensor<1x4x8x8xf32>, tensor<8x4x3x3xf32>) -> tensor<1x8x6x6xf32>
  return %c : tensor<1x8x6x6xf32>
}

// -----

// a location name that is not UTF-8 is fine (it only names an ONNX node)
// (printed last: stdout comes after the errors)
// CHECK-NOT: Traceback
// CHECK-NOT: terminate called
// CHECK-LABEL: func.func @loc_name
func.func @loc_name(%x: tensor<2xf32> loc("\FF")) -> tensor<2xf32> {
  %q = "taso.relu"(%x) : (tensor<2xf32>) -> tensor<2xf32> loc("\FF\FE")
  return %q : tensor<2xf32>
}
