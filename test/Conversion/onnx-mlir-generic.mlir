// RUN: taso-opt %s --convert-onnx-to-taso | FileCheck %s
// onnx-mlir's ONNX dialect in generic form is accepted as input: TASO's operators become taso ops,
// the rest stay generic onnx ops with their attributes; names come from the onnx.name attributes.

module {
  // CHECK-LABEL: func.func @main_graph
  // CHECK-SAME: taso.input_names = ["x"]
  // CHECK-SAME: taso.output_names = ["y"]
  func.func @main_graph(%arg0: tensor<1x3x8x8xf32> {onnx.name = "x"}) -> (tensor<1x4x4x4xf32> {onnx.name = "y"}) {
    // CHECK: %[[W:.*]] = "taso.weight"() {name = "const_1", value = dense<1.000000e+00> : tensor<4x3x3x3xf32>}
    %0 = "onnx.Constant"() {value = dense<1.0> : tensor<4x3x3x3xf32>} : () -> tensor<4x3x3x3xf32>
    %1 = "onnx.NoValue"() {value} : () -> none
    // CHECK: %[[C:.*]] = "taso.conv2d"(%{{.*}}, %[[W]]) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0>, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>}
    %2 = "onnx.Conv"(%arg0, %0, %1) {auto_pad = "NOTSET", group = 1 : si64, kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [1, 1], onnx_node_name = "conv"} : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>, none) -> tensor<1x4x8x8xf32>
    // CHECK: %[[E:.*]] = "onnx.Elu"(%[[C]]) {alpha = 1.000000e+00 : f32}
    %3 = "onnx.Elu"(%2) {alpha = 1.0 : f32, onnx_node_name = "elu"} : (tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
    // CHECK: "taso.maxpool2d"(%[[E]]) {kernel_shape = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>}
    %4 = "onnx.MaxPool"(%3) {auto_pad = "NOTSET", ceil_mode = 0 : si64, kernel_shape = [2, 2], storage_order = 0 : si64, strides = [2, 2]} : (tensor<1x4x8x8xf32>) -> tensor<1x4x4x4xf32>
    "onnx.Return"(%4) : (tensor<1x4x4x4xf32>) -> ()
  }
  "onnx.EntryPoint"() {func = @main_graph} : () -> ()
}
