// RUN: taso-opt %s --convert-onnx-to-taso | FileCheck %s
// RUN: taso-opt %s --convert-onnx-to-taso | taso-opt --convert-onnx-to-taso | FileCheck %s
// Gemm (Y = alpha * op(A) @ op(B) + beta * C) on 2-D static operands with alpha = 1 and (no C or
// beta = 1) becomes [taso.transpose of A] -> taso.matmul -> [taso.ewadd C]. op(B) of a weight is a new
// transposed weight "<name>.T" (unique, one per weight however many Gemms read it); op(B) of anything
// else is a taso.transpose. Other alpha/beta, dynamic shapes and 3-D operands stay generic onnx.Gemm.

// CHECK-LABEL: func.func @linear
// CHECK-SAME: (%[[X:.*]]: tensor<2x4xf32>, %[[H:.*]]: tensor<2x4xf32>)
func.func @linear(%x: !torch.vtensor<[2,4],f32>, %h: !torch.vtensor<[2,4],f32>) -> (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>) attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 17 : si64} {
  // the original weight is read only transposed: it is gone
  // CHECK-NOT: name = "w"
  // CHECK: %[[B:.*]] = "taso.weight"() {name = "b", value = dense<[1.000000e+00, 2.000000e+00, 3.000000e+00]> : tensor<3xf32>}
  // CHECK: %[[B2:.*]] = "taso.weight"() {name = "b2", value = dense<{{.*}}> : tensor<1x3xf32>}
  // a weight already named "w.T": the transposed one takes another name
  // CHECK: %[[OTHER:.*]] = "taso.weight"() {name = "w.T", value = dense<0.000000e+00> : tensor<1xf32>}
  %w = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]]> : tensor<3x4xf32>} : () -> !torch.vtensor<[3,4],f32> loc("w")
  %b = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1.0, 2.0, 3.0]> : tensor<3xf32>} : () -> !torch.vtensor<[3],f32> loc("b")
  %b2 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[[1.0, 2.0, 3.0]]> : tensor<1x3xf32>} : () -> !torch.vtensor<[1,3],f32> loc("b2")
  %other = torch.operator "onnx.Constant"() {torch.onnx.value = dense<0.0> : tensor<1xf32>} : () -> !torch.vtensor<[1],f32> loc("w.T")
  // CHECK: %[[WT:.*]] = "taso.weight"() {name = "w.T_1", value = dense<{{\[\[}}1.000000e+00, 5.000000e+00, 9.000000e+00], [2.000000e+00, 6.000000e+00, 1.000000e+01], [3.000000e+00, 7.000000e+00, 1.100000e+01], [4.000000e+00, 8.000000e+00, 1.200000e+01]]> : tensor<4x3xf32>}
  // CHECK: %[[M0:.*]] = "taso.matmul"(%[[X]], %[[WT]]) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  // CHECK: %[[Y0:.*]] = "taso.ewadd"(%[[M0]], %[[B]]) : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  %0 = torch.operator "onnx.Gemm"(%x, %w, %b) {torch.onnx.alpha = 1.0 : f32, torch.onnx.beta = 1.0 : f32, torch.onnx.transB = 1 : si64} : (!torch.vtensor<[2,4],f32>, !torch.vtensor<[3,4],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[2,3],f32> loc("fc")
  // a second Gemm on the same weight reuses the transposed weight; without C, beta does not matter
  // CHECK-NOT: "taso.weight"
  // CHECK: %[[Y1:.*]] = "taso.matmul"(%[[H]], %[[WT]]) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>}
  // CHECK-NOT: "taso.ewadd"
  %none = torch.constant.none
  %1 = torch.operator "onnx.Gemm"(%h, %w, %none) {torch.onnx.beta = 2.0 : f32, torch.onnx.transB = 1 : si64} : (!torch.vtensor<[2,4],f32>, !torch.vtensor<[3,4],f32>, !torch.none) -> !torch.vtensor<[2,3],f32>
  // C of shape (1, N) is kept as it is
  // CHECK: %[[M2:.*]] = "taso.matmul"(%[[H]], %[[WT]]) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>}
  // CHECK: %[[Y2:.*]] = "taso.ewadd"(%[[M2]], %[[B2]]) : (tensor<2x3xf32>, tensor<1x3xf32>) -> tensor<2x3xf32>
  %2 = torch.operator "onnx.Gemm"(%h, %w, %b2) {torch.onnx.transB = 1 : si64} : (!torch.vtensor<[2,4],f32>, !torch.vtensor<[3,4],f32>, !torch.vtensor<[1,3],f32>) -> !torch.vtensor<[2,3],f32>
  %3 = torch.operator "onnx.Add"(%2, %other) : (!torch.vtensor<[2,3],f32>, !torch.vtensor<[1],f32>) -> !torch.vtensor<[2,3],f32>
  // CHECK: return %[[Y0]], %[[Y1]], %{{.*}} :
  return %0, %1, %3 : !torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>
}

// CHECK-LABEL: func.func @transposes
// CHECK-SAME: (%[[A:.*]]: tensor<4x2xf32>, %[[B:.*]]: tensor<3x4xf32>, %[[C:.*]]: tensor<2x3xf32>)
func.func @transposes(%a: !torch.vtensor<[4,2],f32>, %b: !torch.vtensor<[3,4],f32>, %c: !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 17 : si64} {
  // transA and transB of values that are not weights: taso.transpose
  // CHECK: %[[AT:.*]] = "taso.transpose"(%[[A]]) {perm = array<i64: 1, 0>} : (tensor<4x2xf32>) -> tensor<2x4xf32>
  // CHECK: %[[BT:.*]] = "taso.transpose"(%[[B]]) {perm = array<i64: 1, 0>} : (tensor<3x4xf32>) -> tensor<4x3xf32>
  // CHECK: %[[M:.*]] = "taso.matmul"(%[[AT]], %[[BT]]) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  // CHECK: %[[Y:.*]] = "taso.ewadd"(%[[M]], %[[C]]) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  // CHECK: return %[[Y]]
  %0 = torch.operator "onnx.Gemm"(%a, %b, %c) {torch.onnx.transA = 1 : si64, torch.onnx.transB = 1 : si64} : (!torch.vtensor<[4,2],f32>, !torch.vtensor<[3,4],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>
  return %0 : !torch.vtensor<[2,3],f32>
}

// CHECK-LABEL: func.func @stays_generic
func.func @stays_generic(%x: !torch.vtensor<[2,4],f32>, %d: !torch.vtensor<[?,4],f32>, %x3: !torch.vtensor<[2,2,4],f32>, %b: !torch.vtensor<[4,3],f32>, %c: !torch.vtensor<[3],f32>) -> (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[?,3],f32>, !torch.vtensor<[2,2,3],f32>) attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 17 : si64} {
  // CHECK-NOT: taso.matmul
  // alpha != 1: generic (scaling by taso.smul would round differently from onnxruntime's Gemm)
  // CHECK: "onnx.Gemm"(%{{.*}}, %{{.*}}, %{{.*}}) {alpha = 5.000000e-01 : f32}
  %0 = torch.operator "onnx.Gemm"(%x, %b, %c) {torch.onnx.alpha = 0.5 : f32} : (!torch.vtensor<[2,4],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[2,3],f32>
  // beta != 1 with C: generic
  // CHECK: "onnx.Gemm"(%{{.*}}, %{{.*}}, %{{.*}}) {beta = 2.000000e+00 : f32}
  %1 = torch.operator "onnx.Gemm"(%x, %b, %c) {torch.onnx.beta = 2.0 : f32} : (!torch.vtensor<[2,4],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[2,3],f32>
  // a dynamic dimension: generic
  // CHECK: "onnx.Gemm"(%{{.*}}, %{{.*}}, %{{.*}}) : (tensor<?x4xf32>, tensor<4x3xf32>, tensor<3xf32>) -> tensor<?x3xf32>
  %2 = torch.operator "onnx.Gemm"(%d, %b, %c) : (!torch.vtensor<[?,4],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[?,3],f32>
  // not 2-D (ONNX's checker rejects it; the conversion does not guess): generic
  // CHECK: "onnx.Gemm"(%{{.*}}, %{{.*}}, %{{.*}}) : (tensor<2x2x4xf32>, tensor<4x3xf32>, tensor<3xf32>) -> tensor<2x2x3xf32>
  %3 = torch.operator "onnx.Gemm"(%x3, %b, %c) : (!torch.vtensor<[2,2,4],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[2,2,3],f32>
  return %0, %1, %2, %3 : !torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[?,3],f32>, !torch.vtensor<[2,2,3],f32>
}

// onnx-mlir's spelling: the weight has no name of its own (const_<n>), the node's name becomes the location
// CHECK-LABEL: func.func @onnx_mlir_form
// CHECK: %[[WT:.*]] = "taso.weight"() {name = "const_1.T", value = dense<{{\[\[}}1.000000e+00, 3.000000e+00], [2.000000e+00, 4.000000e+00]]> : tensor<2x2xf32>}
// CHECK: %[[M:.*]] = "taso.matmul"(%{{.*}}, %[[WT]]) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>}
// CHECK: "taso.ewadd"(%[[M]], %{{.*}}) :
func.func @onnx_mlir_form(%arg0: tensor<1x2xf32> {onnx.name = "x"}) -> (tensor<1x2xf32> {onnx.name = "y"}) {
  %0 = "onnx.Constant"() {value = dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>} : () -> tensor<2x2xf32>
  %1 = "onnx.Constant"() {value = dense<[0.5, 0.25]> : tensor<2xf32>} : () -> tensor<2xf32>
  %2 = "onnx.Gemm"(%arg0, %0, %1) {alpha = 1.0 : f32, beta = 1.0 : f32, transA = 0 : si64, transB = 1 : si64, onnx_node_name = "fc"} : (tensor<1x2xf32>, tensor<2x2xf32>, tensor<2xf32>) -> tensor<1x2xf32>
  "onnx.Return"(%2) : (tensor<1x2xf32>) -> ()
}
