// RUN: taso-opt %s --split-input-file --taso-fold-scales | FileCheck %s
// taso-fold-scales drops taso.smul(v, s), s a constant float scalar (finite, nonzero), where v is a
// linear function of weights that can take the factor: (x @ W + b) * s = x @ (W * s) + b * s. The
// scaled weights are new (<name>.scaled<i>); every value on the path up from v must have one use.

// Fires: the factor 0.25 goes into the matmul's weight (0.5 -> 0.125) and bias (1 -> 0.25).
// CHECK-LABEL: func.func @into_weight_and_bias
// CHECK-NEXT: %[[W:.*]] = "taso.weight"() {name = "w.scaled{{[0-9]+}}", value = dense<1.250000e-01> : tensor<4x3xf32>}
// CHECK-NEXT: %[[B:.*]] = "taso.weight"() {name = "b.scaled{{[0-9]+}}", value = dense<2.500000e-01> : tensor<3xf32>}
// CHECK-NEXT: %[[M:.*]] = "taso.matmul"(%arg0, %[[W]], %[[B]]) {activation = "none"}
// CHECK-NEXT: return %[[M]]
// CHECK-NOT: taso.smul
func.func @into_weight_and_bias(%x: tensor<2x4xf32>) -> tensor<2x3xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x3xf32>} : () -> tensor<4x3xf32>
  %b = "taso.weight"() {name = "b", value = dense<1.0> : tensor<3xf32>} : () -> tensor<3xf32>
  %s = "taso.weight"() {name = "s", value = dense<0.25> : tensor<f32>} : () -> tensor<f32>
  %m = "taso.matmul"(%x, %w, %b) {activation = "none"} : (tensor<2x4xf32>, tensor<4x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  %y = "taso.smul"(%m, %s) : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}

// -----

// Does not fire: the first matmul's result is returned too (scaling its weight would change that
// use); an argument has no weight above it; a fused relu takes only a positive factor
// (relu(v) * -2 != relu(v * -2)).
// CHECK-LABEL: func.func @not_folded
// CHECK: %[[M:.*]] = "taso.matmul"(%arg0, %{{.*}}) {activation = "none"}
// CHECK-NEXT: %[[Y:.*]] = "taso.smul"(%[[M]], %{{.*}})
// CHECK-NEXT: %[[Z:.*]] = "taso.smul"(%arg0, %{{.*}})
// CHECK: %[[R:.*]] = "taso.matmul"(%arg0, %{{.*}}) {activation = "relu"}
// CHECK-NEXT: %[[Q:.*]] = "taso.smul"(%[[R]], %{{.*}})
// CHECK-NEXT: return %[[M]], %[[Y]], %[[Z]], %[[Q]]
// CHECK-NOT: scaled
func.func @not_folded(%x: tensor<2x4xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x4xf32>, tensor<2x3xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x3xf32>} : () -> tensor<4x3xf32>
  %s = "taso.weight"() {name = "s", value = dense<0.25> : tensor<f32>} : () -> tensor<f32>
  %neg = "taso.weight"() {name = "neg", value = dense<-2.0> : tensor<f32>} : () -> tensor<f32>
  %m = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %y = "taso.smul"(%m, %s) : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  %z = "taso.smul"(%x, %s) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2x4xf32>
  %w2 = "taso.weight"() {name = "w2", value = dense<0.5> : tensor<4x3xf32>} : () -> tensor<4x3xf32>
  %r = "taso.matmul"(%x, %w2) {activation = "relu"} : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %q = "taso.smul"(%r, %neg) : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  return %m, %y, %z, %q : tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x4xf32>, tensor<2x3xf32>
}
