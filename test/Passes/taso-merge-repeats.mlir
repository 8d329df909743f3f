// RUN: taso-opt %s --split-input-file --taso-merge-repeats | FileCheck %s
// taso-merge-repeats replaces an op that repeats an earlier one (same name, operands, attributes and
// result types) by it: taso ops and ONNX operators are pure, so the repeat computes the same values
// (MLIR's cse leaves them alone: IRDL-defined and unregistered ops declare no memory effects).
// Equal weights the folding made (named taso_folded_*) are merged first; the input's own weights stay
// as they are.

// Fires, transitively: the second relu is the first, and then the second Erf reads what the first does.
// CHECK-LABEL: func.func @repeats
// CHECK-NEXT: %[[R:.*]] = "taso.relu"(%arg0)
// CHECK-NEXT: %[[E:.*]] = "onnx.Erf"(%[[R]])
// CHECK-NEXT: return %[[E]], %[[E]]
func.func @repeats(%x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
  %a = "taso.relu"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %b = "taso.relu"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %c = "onnx.Erf"(%a) : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %d = "onnx.Erf"(%b) : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %c, %d : tensor<2x4xf32>, tensor<2x4xf32>
}

// -----

// Does not fire: the transposes differ in their perm attribute; RandomNormalLike draws anew each time;
// weights are each their own tensor, equal values or not; an op of another domain (taso.domain)
// need not be pure.
// CHECK-LABEL: func.func @not_repeats
// CHECK-NEXT: %[[T:.*]] = "taso.transpose"(%arg0) {perm = array<i64: 1, 0>}
// CHECK-NEXT: %[[I:.*]] = "taso.transpose"(%arg0) {perm = array<i64: 0, 1>}
// CHECK-NEXT: %[[R1:.*]] = "onnx.RandomNormalLike"(%arg0)
// CHECK-NEXT: %[[R2:.*]] = "onnx.RandomNormalLike"(%arg0)
// CHECK-NEXT: %[[W1:.*]] = "taso.weight"() {name = "w1"
// CHECK-NEXT: %[[W2:.*]] = "taso.weight"() {name = "w2"
// CHECK-NEXT: %[[C1:.*]] = "onnx.Custom"(%arg0)
// CHECK-NEXT: %[[C2:.*]] = "onnx.Custom"(%arg0)
// CHECK-NEXT: return %[[T]], %[[I]], %[[R1]], %[[R2]], %[[W1]], %[[W2]], %[[C1]], %[[C2]]
func.func @not_repeats(%x: tensor<2x4xf32>) -> (tensor<4x2xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) {
  %t = "taso.transpose"(%x) {perm = array<i64: 1, 0>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
  %i = "taso.transpose"(%x) {perm = array<i64: 0, 1>} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %r1 = "onnx.RandomNormalLike"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %r2 = "onnx.RandomNormalLike"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %w1 = "taso.weight"() {name = "w1", value = dense<1.0> : tensor<2x4xf32>} : () -> tensor<2x4xf32>
  %w2 = "taso.weight"() {name = "w2", value = dense<1.0> : tensor<2x4xf32>} : () -> tensor<2x4xf32>
  %c1 = "onnx.Custom"(%x) {taso.domain = "my.domain"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %c2 = "onnx.Custom"(%x) {taso.domain = "my.domain"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %t, %i, %r1, %r2, %w1, %w2, %c1, %c2 : tensor<4x2xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
}

// -----

// Fires: two folded weights with the same values become one, and the two multiplies by them one.
// CHECK-LABEL: func.func @folded_weights
// CHECK-NEXT: %[[W:.*]] = "taso.weight"() {name = "taso_folded_1"
// CHECK-NEXT: %[[M:.*]] = "taso.ewmul"(%arg0, %[[W]])
// CHECK-NEXT: return %[[M]], %[[M]]
func.func @folded_weights(%x: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  %a = "taso.weight"() {name = "taso_folded_1", value = dense<3.0> : tensor<2xf32>} : () -> tensor<2xf32>
  %b = "taso.weight"() {name = "taso_folded_2", value = dense<3.0> : tensor<2xf32>} : () -> tensor<2xf32>
  %p = "taso.ewmul"(%x, %a) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  %q = "taso.ewmul"(%x, %b) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  return %p, %q : tensor<2xf32>, tensor<2xf32>
}
