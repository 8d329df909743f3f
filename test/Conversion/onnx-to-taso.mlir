// RUN: taso-opt %s --convert-onnx-to-taso | FileCheck %s
// RUN: taso-opt %s --convert-onnx-to-taso | taso-opt --convert-onnx-to-taso | FileCheck %s
// The upstream importer's form (torch-mlir-import-onnx output): torch.operator "onnx.*" on
// !torch.vtensor. TASO's operators become taso ops, Identity disappears, weights (inline or
// dense_resource) become taso.weight with readable inline values, everything else stays generic.
// Converting twice changes nothing.

// CHECK-LABEL: func.func @g
// CHECK-SAME: (%[[X:.*]]: tensor<1x3x8x8xf32>) -> tensor<1x10xf32>
// CHECK-SAME: taso.opset_imports = {ai.onnx = 17 : i64}
func.func @g(%arg0: !torch.vtensor<[1,3,8,8],f32>) -> !torch.vtensor<[1,10],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 17 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
  // CHECK: %[[N:.*]] = "onnx.NoValue"() {value} : () -> none
  // CHECK: %[[W:.*]] = "taso.weight"() {name = "w1", value = dense<[{{.*}}]> : tensor<1x3x1x1xf32>}
  %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense_resource<w1> : tensor<1x3x1x1xf32>} : () -> !torch.vtensor<[1,3,1,1],f32>
  // CHECK: %[[B:.*]] = "taso.weight"() {name = "const_1", value = dense<5.000000e-01> : tensor<1xf32>}
  %1 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<0.5> : tensor<1xf32>} : () -> !torch.vtensor<[1],f32>
  %2 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[10, 64]> : tensor<2xsi64>} : () -> !torch.vtensor<[2],si64>
  %none = torch.constant.none
  // CHECK: %[[C:.*]] = "taso.conv2d"(%[[X]], %[[W]], %[[B]]) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1>}
  %3 = torch.operator "onnx.Conv"(%arg0, %0, %1) : (!torch.vtensor<[1,3,8,8],f32>, !torch.vtensor<[1,3,1,1],f32>, !torch.vtensor<[1],f32>) -> !torch.vtensor<[1,1,8,8],f32>
  // CHECK-NOT: Identity
  %4 = torch.operator "onnx.Identity"(%3) : (!torch.vtensor<[1,1,8,8],f32>) -> !torch.vtensor<[1,1,8,8],f32>
  // CHECK: %[[R:.*]] = "taso.reshape"(%[[C]]) {shape = array<i64: 1, 64>}
  %5 = torch.operator "onnx.Reshape"(%4, %2) : (!torch.vtensor<[1,1,8,8],f32>, !torch.vtensor<[2],si64>) -> !torch.vtensor<[1,64],f32>
  // CHECK: %[[G:.*]] = "onnx.Clip"(%[[R]], %[[N]], %[[B]])
  %6 = torch.operator "onnx.Clip"(%5, %none, %1) : (!torch.vtensor<[1,64],f32>, !torch.none, !torch.vtensor<[1],f32>) -> !torch.vtensor<[1,64],f32>
  // CHECK: "onnx.LpNormalization"(%[[G]]) {axis = 1 : si64, p = 2 : si64}
  %7 = torch.operator "onnx.LpNormalization"(%6) {torch.onnx.axis = 1 : si64, torch.onnx.p = 2 : si64} : (!torch.vtensor<[1,64],f32>) -> !torch.vtensor<[1,64],f32>
  %8 = torch.operator "onnx.Slice"(%7, %2, %2) : (!torch.vtensor<[1,64],f32>, !torch.vtensor<[2],si64>, !torch.vtensor<[2],si64>) -> !torch.vtensor<[1,10],f32>
  return %8 : !torch.vtensor<[1,10],f32>
}

{-#
  dialect_resources: {
    builtin: {
      w1: "0x080000000000803F0000004000004040"
    }
  }
#-}
