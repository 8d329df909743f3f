// RUN: taso-opt %s --split-input-file --taso-fold-constants | FileCheck %s
// taso-fold-constants replaces the generic ONNX ops with constant results (Shape/Size of a static
// tensor, any op all of whose operands are weights) and the taso ops computing only from weights by new
// weights (taso_folded_<i>), until none is left, then drops the identities that reveals (x + 0, x * 1)
// and the ops left unused.

// Fires: the Shape of a tensor of static type is a constant.
// CHECK-LABEL: func.func @shape_of_static
// CHECK-NEXT: %[[S:.*]] = "taso.weight"() {name = "taso_folded_{{[0-9]+}}", value = dense<[2, 4]> : tensor<2xsi64>}
// CHECK-NEXT: return %[[S]]
func.func @shape_of_static(%x: tensor<2x4xf32>) -> tensor<2xsi64> {
  %s = "onnx.Shape"(%x) : (tensor<2x4xf32>) -> tensor<2xsi64>
  return %s : tensor<2xsi64>
}

// -----

// Fires on a chain: sqrt(4) = 2 (a generic op on a weight), then 2 * 3 = 6 (a taso op on the folded
// weight and a weight); the input weights and the folded intermediate go.
// CHECK-LABEL: func.func @ops_on_weights
// CHECK-NEXT: %[[W:.*]] = "taso.weight"() {name = "taso_folded_{{[0-9]+}}", value = dense<6.000000e+00> : tensor<4xf32>}
// CHECK-NEXT: %[[Y:.*]] = "taso.ewadd"(%arg0, %[[W]]) : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: return %[[Y]]
func.func @ops_on_weights(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %a = "taso.weight"() {name = "a", value = dense<4.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %b = "taso.weight"() {name = "b", value = dense<3.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %r = "onnx.Sqrt"(%a) : (tensor<4xf32>) -> tensor<4xf32>
  %m = "taso.ewmul"(%r, %b) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %y = "taso.ewadd"(%x, %m) : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}

// -----

// Fires, and reveals an identity: 1 + -1 folds to a zero weight of x's type, and x + 0 is x.
// CHECK-LABEL: func.func @identity_revealed
// CHECK-NEXT: return %arg0
func.func @identity_revealed(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %a = "taso.weight"() {name = "a", value = dense<1.0> : tensor<2x4xf32>} : () -> tensor<2x4xf32>
  %b = "taso.weight"() {name = "b", value = dense<-1.0> : tensor<2x4xf32>} : () -> tensor<2x4xf32>
  %z = "taso.ewadd"(%a, %b) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %y = "taso.ewadd"(%x, %z) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}

// -----

// Does not fire: the Shape of a dynamic tensor is known only at run time; an add of an argument is not
// computed from weights only; RandomNormalLike is not a function of its operand (randomness); the
// Neg's result has 256 x 512 elements, more than MAX_ELEMENTS (65536: a folded activation-sized
// constant would be written into the model). Nothing changes, no weight is added.
// CHECK-LABEL: func.func @no_fold
// CHECK-NEXT: %[[S:.*]] = "onnx.Shape"(%arg0)
// CHECK-NEXT: %[[A:.*]] = "taso.weight"() {name = "a"
// CHECK-NEXT: %[[Y:.*]] = "taso.ewadd"(%arg1, %[[A]])
// CHECK-NEXT: %[[R:.*]] = "onnx.RandomNormalLike"(%[[A]])
// CHECK-NEXT: %[[B:.*]] = "taso.weight"() {name = "big"
// CHECK-NEXT: %[[N:.*]] = "onnx.Neg"(%[[B]])
// CHECK-NEXT: return %[[S]], %[[Y]], %[[R]], %[[N]]
// CHECK-NOT: taso_folded
func.func @no_fold(%x: tensor<?x4xf32>, %v: tensor<4xf32>) -> (tensor<2xsi64>, tensor<4xf32>, tensor<4xf32>, tensor<256x512xf32>) {
  %s = "onnx.Shape"(%x) : (tensor<?x4xf32>) -> tensor<2xsi64>
  %a = "taso.weight"() {name = "a", value = dense<1.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %y = "taso.ewadd"(%v, %a) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %r = "onnx.RandomNormalLike"(%a) : (tensor<4xf32>) -> tensor<4xf32>
  %big = "taso.weight"() {name = "big", value = dense<1.0> : tensor<256x512xf32>} : () -> tensor<256x512xf32>
  %n = "onnx.Neg"(%big) : (tensor<256x512xf32>) -> tensor<256x512xf32>
  return %s, %y, %r, %n : tensor<2xsi64>, tensor<4xf32>, tensor<4xf32>, tensor<256x512xf32>
}
