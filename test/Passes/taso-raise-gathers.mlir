// RUN: taso-opt %s --split-input-file --taso-raise-gathers | FileCheck %s
// taso-raise-gathers replaces a group of onnx.Gather ops of one static tensor on one axis, each at a
// constant one-element index, that together use every index of the axis (2 to 16 of them) by one
// taso.split into pieces of size 1 (each reshaped to the Gather's result where that drops the axis):
// Gather(X, i, axis) is piece i of split(X, axis, [1] * n). torch's unbind of a packed Q/K/V exports so.

// Fires: indices 0, 1 and -1 (= 2, counted from the end) cover axis 0 of size 3. A scalar index drops
// the axis (a reshape of the piece); a [1] index keeps it with size 1 (the piece itself).
// CHECK-LABEL: func.func @every_index
// CHECK: %[[S:.*]]:3 = "taso.split"(%arg0) {axis = 0 : i64, {{.*}}sizes = array<i64: 1, 1, 1>} : (tensor<3x4xf32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4xf32>)
// CHECK-NEXT: %[[A:.*]] = "taso.reshape"(%[[S]]#0) {shape = array<i64: 4>} : (tensor<1x4xf32>) -> tensor<4xf32>
// CHECK-NEXT: %[[B:.*]] = "taso.reshape"(%[[S]]#1) {shape = array<i64: 4>} : (tensor<1x4xf32>) -> tensor<4xf32>
// CHECK-NEXT: return %[[A]], %[[B]], %[[S]]#2
// CHECK-NOT: onnx.Gather
func.func @every_index(%x: tensor<3x4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<1x4xf32>) {
  %i0 = "taso.weight"() {name = "i0", value = dense<0> : tensor<si64>} : () -> tensor<si64>
  %i1 = "taso.weight"() {name = "i1", value = dense<1> : tensor<si64>} : () -> tensor<si64>
  %i2 = "taso.weight"() {name = "i2", value = dense<-1> : tensor<1xsi64>} : () -> tensor<1xsi64>
  %a = "onnx.Gather"(%x, %i0) {axis = 0 : si64} : (tensor<3x4xf32>, tensor<si64>) -> tensor<4xf32>
  %b = "onnx.Gather"(%x, %i1) {axis = 0 : si64} : (tensor<3x4xf32>, tensor<si64>) -> tensor<4xf32>
  %c = "onnx.Gather"(%x, %i2) {axis = 0 : si64} : (tensor<3x4xf32>, tensor<1xsi64>) -> tensor<1x4xf32>
  return %a, %b, %c : tensor<4xf32>, tensor<4xf32>, tensor<1x4xf32>
}

// -----

// Does not fire: the constant indices 0 and 1 do not cover axis 0 (size 3), and the third Gather's
// index is an argument, not a constant. (A split would move every row where the gathers move two.)
// CHECK-LABEL: func.func @missing_index
// CHECK: %[[A:.*]] = "onnx.Gather"(%arg0, %{{.*}}) {axis = 0 : si64}
// CHECK-NEXT: %[[B:.*]] = "onnx.Gather"(%arg0, %{{.*}}) {axis = 0 : si64}
// CHECK-NEXT: %[[C:.*]] = "onnx.Gather"(%arg0, %arg1) {axis = 0 : si64}
// CHECK-NEXT: return %[[A]], %[[B]], %[[C]]
// CHECK-NOT: taso.split
func.func @missing_index(%x: tensor<3x4xf32>, %j: tensor<si64>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %i0 = "taso.weight"() {name = "i0", value = dense<0> : tensor<si64>} : () -> tensor<si64>
  %i1 = "taso.weight"() {name = "i1", value = dense<1> : tensor<si64>} : () -> tensor<si64>
  %a = "onnx.Gather"(%x, %i0) {axis = 0 : si64} : (tensor<3x4xf32>, tensor<si64>) -> tensor<4xf32>
  %b = "onnx.Gather"(%x, %i1) {axis = 0 : si64} : (tensor<3x4xf32>, tensor<si64>) -> tensor<4xf32>
  %c = "onnx.Gather"(%x, %j) {axis = 0 : si64} : (tensor<3x4xf32>, tensor<si64>) -> tensor<4xf32>
  return %a, %b, %c : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
