// RUN: taso-opt %s --split-input-file --taso-flatten-matmuls | FileCheck %s
// taso-flatten-matmuls rewrites two or more matmuls reading one static [..., K] value (rank >= 3) with
// static 2-D right operands (a transformer's Q, K, V projections) as matmuls of one shared reshape of
// it to [rows, K], each reshaped back: matmul(x, W) = reshape(matmul(reshape(x, [rows, K]), W)). The
// rule library's matmul rules are stated on 2-D operands; taso-unflatten-matmuls undoes what the search
// leaves alone.

// Fires: two projections of a [2, 3, 4] input share one [6, 4] reshape; the activation is kept.
// CHECK-LABEL: func.func @shared_3d_input
// CHECK-NEXT: %[[WA:.*]] = "taso.weight"() {name = "wa"
// CHECK-NEXT: %[[WB:.*]] = "taso.weight"() {name = "wb"
// CHECK-NEXT: %[[R:.*]] = "taso.reshape"(%arg0) {shape = array<i64: 6, 4>} : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
// CHECK-NEXT: %[[A:.*]] = "taso.matmul"(%[[R]], %[[WA]]) {activation = "none"{{.*}}} : (tensor<6x4xf32>, tensor<4x5xf32>) -> tensor<6x5xf32>
// CHECK-NEXT: %[[A3:.*]] = "taso.reshape"(%[[A]]) {shape = array<i64: 2, 3, 5>} : (tensor<6x5xf32>) -> tensor<2x3x5xf32>
// CHECK-NEXT: %[[B:.*]] = "taso.matmul"(%[[R]], %[[WB]]) {activation = "relu"{{.*}}} : (tensor<6x4xf32>, tensor<4x6xf32>) -> tensor<6x6xf32>
// CHECK-NEXT: %[[B3:.*]] = "taso.reshape"(%[[B]]) {shape = array<i64: 2, 3, 6>} : (tensor<6x6xf32>) -> tensor<2x3x6xf32>
// CHECK-NEXT: return %[[A3]], %[[B3]]
func.func @shared_3d_input(%x: tensor<2x3x4xf32>) -> (tensor<2x3x5xf32>, tensor<2x3x6xf32>) {
  %wa = "taso.weight"() {name = "wa", value = dense<0.5> : tensor<4x5xf32>} : () -> tensor<4x5xf32>
  %wb = "taso.weight"() {name = "wb", value = dense<0.25> : tensor<4x6xf32>} : () -> tensor<4x6xf32>
  %a = "taso.matmul"(%x, %wa) {activation = "none"} : (tensor<2x3x4xf32>, tensor<4x5xf32>) -> tensor<2x3x5xf32>
  %b = "taso.matmul"(%x, %wb) {activation = "relu"} : (tensor<2x3x4xf32>, tensor<4x6xf32>) -> tensor<2x3x6xf32>
  return %a, %b : tensor<2x3x5xf32>, tensor<2x3x6xf32>
}

// -----

// Does not fire: %arg0 has one matmul reader (nothing to share, no rule to enable); %arg1 is 2-D
// already; %arg2's right operands are batched [2, 4, 5] weights (batch b pairs with rows b*S..b*S+S-1,
// which the flat matmul does not).
// CHECK-LABEL: func.func @not_flattened
// CHECK: %[[A:.*]] = "taso.matmul"(%arg0, %{{.*}}) {activation = "none"} : (tensor<2x3x4xf32>, tensor<4x5xf32>)
// CHECK-NEXT: %[[B:.*]] = "taso.matmul"(%arg1, %{{.*}}) {activation = "none"} : (tensor<3x4xf32>, tensor<4x5xf32>)
// CHECK-NEXT: %[[C:.*]] = "taso.matmul"(%arg1, %{{.*}}) {activation = "relu"} : (tensor<3x4xf32>, tensor<4x5xf32>)
// CHECK-NEXT: %[[D:.*]] = "taso.matmul"(%arg2, %{{.*}}) {activation = "none"} : (tensor<2x3x4xf32>, tensor<2x4x5xf32>)
// CHECK-NEXT: %[[E:.*]] = "taso.matmul"(%arg2, %{{.*}}) {activation = "relu"} : (tensor<2x3x4xf32>, tensor<2x4x5xf32>)
// CHECK-NEXT: return %[[A]], %[[B]], %[[C]], %[[D]], %[[E]]
// CHECK-NOT: taso.reshape
func.func @not_flattened(%x: tensor<2x3x4xf32>, %y: tensor<3x4xf32>, %z: tensor<2x3x4xf32>) -> (tensor<2x3x5xf32>, tensor<3x5xf32>, tensor<3x5xf32>, tensor<2x3x5xf32>, tensor<2x3x5xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x5xf32>} : () -> tensor<4x5xf32>
  %wb = "taso.weight"() {name = "wb", value = dense<0.5> : tensor<2x4x5xf32>} : () -> tensor<2x4x5xf32>
  %a = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x3x4xf32>, tensor<4x5xf32>) -> tensor<2x3x5xf32>
  %b = "taso.matmul"(%y, %w) {activation = "none"} : (tensor<3x4xf32>, tensor<4x5xf32>) -> tensor<3x5xf32>
  %c = "taso.matmul"(%y, %w) {activation = "relu"} : (tensor<3x4xf32>, tensor<4x5xf32>) -> tensor<3x5xf32>
  %d = "taso.matmul"(%z, %wb) {activation = "none"} : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
  %e = "taso.matmul"(%z, %wb) {activation = "relu"} : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
  return %a, %b, %c, %d, %e : tensor<2x3x5xf32>, tensor<3x5xf32>, tensor<3x5xf32>, tensor<2x3x5xf32>, tensor<2x3x5xf32>
}
