// RUN: taso-opt %s --split-input-file --taso-search | FileCheck %s
// RUN: taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-search{report=-})' -o /dev/null 2>&1 | FileCheck %s --check-prefix=REPORT
// RUN: env CUDA_VISIBLE_DEVICES=-1 not taso-opt %s --split-input-file --pass-pipeline='builtin.module(taso-search{cost-model=cuda})' 2>&1 | FileCheck %s --check-prefix=CUDA
// taso-search rewrites with the proved rules, applied as PDL patterns, where the cost model gains.

// Fused activation: the prepare pass taso-fuse-activation fuses the relu before the search (as runtimes
// run a model), and the report's prepared cost, the search's baseline, is the fused conv's. (The rules'
// fusion, axiom 14, is in taso-backtracking-search.mlir.)
// CHECK-LABEL: func.func @fuse_relu
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, %{{.*}}) {activation = "relu"
// CHECK-NOT: taso.relu
// CHECK: return %[[C]]
// REPORT: @fuse_relu: cost [[IN:[0-9.e-]+]] -> [[OUT:[0-9.e-]+]] ms ({{[0-9.]+}}% less, estimated; prepared [[OUT]] ms, 0.0% less by the search), ops 3 -> 2 ({{.*}} without weights), 0 rewrites applied
// REPORT-NEXT: taso-fuse-activation: 1 relus fused into the convolutions and matmuls before them
// CUDA: taso-opt: error: cost model 'cuda' is not available on this machine: {{.*}}; it measures on the GPU this process runs on
func.func @fuse_relu(%x: tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<8x8x3x3xf32>} : () -> tensor<8x8x3x3xf32>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x8x7x7xf32>, tensor<8x8x3x3xf32>) -> tensor<1x8x7x7xf32>
  %r = "taso.relu"(%c) : (tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32>
  return %r : tensor<1x8x7x7xf32>
}

// -----

// Not when the unfused result is used too: it is not a mapped output of the rule.
// CHECK-LABEL: func.func @external_use
// CHECK: taso.relu
// REPORT: @external_use: {{.*}} 0 rewrites applied
func.func @external_use(%x: tensor<1x8x7x7xf32>) -> (tensor<1x8x7x7xf32>, tensor<1x8x7x7xf32>) {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<8x8x3x3xf32>} : () -> tensor<8x8x3x3xf32>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x8x7x7xf32>, tensor<8x8x3x3xf32>) -> tensor<1x8x7x7xf32>
  %r = "taso.relu"(%c) : (tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32>
  return %r, %c : tensor<1x8x7x7xf32>, tensor<1x8x7x7xf32>
}

// -----

// Matmul sum (axiom 20): x @ W1 + h @ W2 = concat(x, h) @ concat(W1, W2); the weight concat is folded.
// CHECK-LABEL: func.func @matmul_sum
// CHECK-DAG: %[[W:.*]] = "taso.weight"() {name = "taso_folded_{{[0-9]+}}"{{.*}}tensor<1024x512xf32>
// CHECK-DAG: %[[X:.*]] = "taso.concat"(%arg0, %arg1
// CHECK: %[[M:.*]] = "taso.matmul"(%[[X]], %[[W]])
// CHECK-NOT: taso.ewadd
// CHECK: return %[[M]]
func.func @matmul_sum(%x: tensor<1x512xf32>, %h: tensor<1x512xf32>) -> tensor<1x512xf32> {
  %w1 = "taso.weight"() {name = "w1", value = dense<0.5> : tensor<512x512xf32>} : () -> tensor<512x512xf32>
  %w2 = "taso.weight"() {name = "w2", value = dense<0.25> : tensor<512x512xf32>} : () -> tensor<512x512xf32>
  %a = "taso.matmul"(%x, %w1) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  %b = "taso.matmul"(%h, %w2) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  %s = "taso.ewadd"(%a, %b) : (tensor<1x512xf32>, tensor<1x512xf32>) -> tensor<1x512xf32>
  return %s : tensor<1x512xf32>
}

// -----

// Transpose of a transpose (axiom 30) is the identity: both go.
// CHECK-LABEL: func.func @double_transpose
// CHECK-NOT: taso.transpose
// CHECK: return %arg0
func.func @double_transpose(%x: tensor<4x6xf32>) -> tensor<4x6xf32> {
  %a = "taso.transpose"(%x) {perm = array<i64: 1, 0>} : (tensor<4x6xf32>) -> tensor<6x4xf32>
  %b = "taso.transpose"(%a) {perm = array<i64: 1, 0>} : (tensor<6x4xf32>) -> tensor<4x6xf32>
  return %b : tensor<4x6xf32>
}

// -----

// A fire module (SqueezeNet): two biased convolutions of one input, a 1x1 and a 3x3, each with relu,
// concatenated on channels. taso-fuse-activation fuses each relu before the search, and one conv-bias
// rule merges the two fused convolutions into one whose kernel is concat(enlarge(1x1), 3x3) and whose
// bias is the concat of the biases: the concat disappears; the weight ops are folded into new weights.
// CHECK-LABEL: func.func @fire_merge
// CHECK-DAG: %[[W:.*]] = "taso.weight"() {name = "taso_folded_{{[0-9]+}}"{{.*}}tensor<16x8x3x3xf32>
// CHECK-DAG: %[[B:.*]] = "taso.weight"() {name = "taso_folded_{{[0-9]+}}"{{.*}}tensor<16xf32>
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, %[[W]], %[[B]]) {activation = "relu"
// CHECK-NOT: taso.concat
// CHECK-NOT: taso.relu
// CHECK: return %[[C]]
// REPORT: @fire_merge: {{.*}} 1 rewrites applied
// REPORT-NEXT: taso-fuse-activation: 2 relus fused
// REPORT: rules applied: B{{[0-9]+}}f x1
func.func @fire_merge(%x: tensor<1x8x7x7xf32>) -> tensor<1x16x7x7xf32> {
  %w1 = "taso.weight"() {name = "w1", value = dense<0.5> : tensor<8x8x1x1xf32>} : () -> tensor<8x8x1x1xf32>
  %b1 = "taso.weight"() {name = "b1", value = dense<0.1> : tensor<8xf32>} : () -> tensor<8xf32>
  %w3 = "taso.weight"() {name = "w3", value = dense<0.25> : tensor<8x8x3x3xf32>} : () -> tensor<8x8x3x3xf32>
  %b3 = "taso.weight"() {name = "b3", value = dense<0.2> : tensor<8xf32>} : () -> tensor<8xf32>
  %c1 = "taso.conv2d"(%x, %w1, %b1) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x8x7x7xf32>, tensor<8x8x1x1xf32>, tensor<8xf32>) -> tensor<1x8x7x7xf32>
  %r1 = "taso.relu"(%c1) : (tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32>
  %c3 = "taso.conv2d"(%x, %w3, %b3) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x8x7x7xf32>, tensor<8x8x3x3xf32>, tensor<8xf32>) -> tensor<1x8x7x7xf32>
  %r3 = "taso.relu"(%c3) : (tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32>
  %cat = "taso.concat"(%r1, %r3) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x8x7x7xf32>, tensor<1x8x7x7xf32>) -> tensor<1x16x7x7xf32>
  return %cat : tensor<1x16x7x7xf32>
}

// -----

// Three expand convolutions of one input, 1x1, 3x3 and 1x1, concatenated: merging them takes two merges,
// the first of which alone does not pay. The backtracking search makes both (it looks past a merge that
// does not pay); the merged convolution's channels come out in another order, put back by a split and a
// concat (the rules have no permutation of a convolution's kernels).
// CHECK-LABEL: func.func @fire_three
// CHECK: %[[C:.*]] = "taso.conv2d"(%arg0, %{{.*}}, %{{.*}}) {activation = "relu"{{.*}} -> tensor<1x24x7x7xf32>
// CHECK-NEXT: %[[S:.*]]:3 = "taso.split"(%[[C]])
// CHECK-NEXT: "taso.concat"(%[[S]]#1, %[[S]]#0, %[[S]]#2)
// REPORT: @fire_three: {{.*}} 2 rewrites applied
// REPORT: merge pairs queued by looking past a merge that does not pay
func.func @fire_three(%x: tensor<1x8x7x7xf32>) -> tensor<1x24x7x7xf32> {
  %w0 = "taso.weight"() {name = "w0", value = dense<0.1> : tensor<8x8x1x1xf32>} : () -> tensor<8x8x1x1xf32>
  %b0 = "taso.weight"() {name = "b0", value = dense<0.1> : tensor<8xf32>} : () -> tensor<8xf32>
  %c0 = "taso.conv2d"(%x, %w0, %b0) {activation = "relu", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x8x7x7xf32>, tensor<8x8x1x1xf32>, tensor<8xf32>) -> tensor<1x8x7x7xf32>
  %w1 = "taso.weight"() {name = "w1", value = dense<0.2> : tensor<8x8x3x3xf32>} : () -> tensor<8x8x3x3xf32>
  %b1 = "taso.weight"() {name = "b1", value = dense<0.2> : tensor<8xf32>} : () -> tensor<8xf32>
  %c1 = "taso.conv2d"(%x, %w1, %b1) {activation = "relu", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x8x7x7xf32>, tensor<8x8x3x3xf32>, tensor<8xf32>) -> tensor<1x8x7x7xf32>
  %w2 = "taso.weight"() {name = "w2", value = dense<0.3> : tensor<8x8x1x1xf32>} : () -> tensor<8x8x1x1xf32>
  %b2 = "taso.weight"() {name = "b2", value = dense<0.3> : tensor<8xf32>} : () -> tensor<8xf32>
  %c2 = "taso.conv2d"(%x, %w2, %b2) {activation = "relu", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<1x8x7x7xf32>, tensor<8x8x1x1xf32>, tensor<8xf32>) -> tensor<1x8x7x7xf32>
  %cat = "taso.concat"(%c0, %c1, %c2) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x8x7x7xf32>, tensor<1x8x7x7xf32>, tensor<1x8x7x7xf32>) -> tensor<1x24x7x7xf32>
  return %cat : tensor<1x24x7x7xf32>
}

// -----

// Four matmuls sharing an input merge into one (axiom: mm(x, w1), mm(x, w2) = split(mm(x, cat(w1, w2))),
// applied three times); the tree of three binary splits the rules leave is written as one split
// into four pieces, which is what the search costed (one launch, the same bytes).
// CHECK-LABEL: func.func @merge_four_matmuls
// CHECK: %[[M:.*]] = "taso.matmul"(%arg0, %{{.*}}) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x512xf32>, tensor<512x2048xf32>) -> tensor<1x2048xf32>
// CHECK-NEXT: %[[S:.*]]:4 = "taso.split"(%[[M]]) {axis = 1 : i64, {{.*}}sizes = array<i64: 512, 512, 512, 512>}
// CHECK-NOT: taso.split
// CHECK-NOT: taso.matmul
// CHECK: return %[[S]]#{{[0-3]}}, %[[S]]#{{[0-3]}}, %[[S]]#{{[0-3]}}, %[[S]]#{{[0-3]}}
// REPORT: @merge_four_matmuls: {{.*}} ops 8 -> 3 ({{.*}} without weights), 3 rewrites applied
// REPORT-NOT: nested concats fused
// REPORT: taso-fuse-split-trees: 2 nested splits fused
// REPORT-NOT: nested concats fused
// REPORT: total time
func.func @merge_four_matmuls(%x: tensor<1x512xf32>) -> (tensor<1x512xf32>, tensor<1x512xf32>, tensor<1x512xf32>, tensor<1x512xf32>) {
  %w1 = "taso.weight"() {name = "w1", value = dense<0.5> : tensor<512x512xf32>} : () -> tensor<512x512xf32>
  %w2 = "taso.weight"() {name = "w2", value = dense<0.25> : tensor<512x512xf32>} : () -> tensor<512x512xf32>
  %w3 = "taso.weight"() {name = "w3", value = dense<0.125> : tensor<512x512xf32>} : () -> tensor<512x512xf32>
  %w4 = "taso.weight"() {name = "w4", value = dense<2.0> : tensor<512x512xf32>} : () -> tensor<512x512xf32>
  %a = "taso.matmul"(%x, %w1) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  %b = "taso.matmul"(%x, %w2) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  %c = "taso.matmul"(%x, %w3) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  %d = "taso.matmul"(%x, %w4) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  return %a, %b, %c, %d : tensor<1x512xf32>, tensor<1x512xf32>, tensor<1x512xf32>, tensor<1x512xf32>
}

// -----

// An op a rewrite would make again is the op the function has: merging x1's two matmuls and x2's two
// makes concat(w1, w2) twice, and with one shared weight the two merged matmuls merge by rows.
// CHECK-LABEL: func.func @shared_weight_concat
// CHECK-COUNT-1: taso.matmul
// CHECK-NOT: taso.matmul
// REPORT: @shared_weight_concat: {{.*}} 3 rewrites applied
func.func @shared_weight_concat(%x1: tensor<1x512xf32>, %x2: tensor<1x512xf32>) -> (tensor<1x512xf32>, tensor<1x512xf32>, tensor<1x512xf32>, tensor<1x512xf32>) {
  %w1 = "taso.weight"() {name = "w1", value = dense<0.5> : tensor<512x512xf32>} : () -> tensor<512x512xf32>
  %w2 = "taso.weight"() {name = "w2", value = dense<0.25> : tensor<512x512xf32>} : () -> tensor<512x512xf32>
  %a = "taso.matmul"(%x1, %w1) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  %b = "taso.matmul"(%x1, %w2) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  %c = "taso.matmul"(%x2, %w1) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  %d = "taso.matmul"(%x2, %w2) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  return %a, %b, %c, %d : tensor<1x512xf32>, tensor<1x512xf32>, tensor<1x512xf32>, tensor<1x512xf32>
}

// -----

// Matmuls of a shared 3-D input (a transformer's Q, K, V projections) are flattened to 2-D for the
// search, where the 2-D merge rule applies: one matmul on the concatenated weights, one split, the
// pieces reshaped back. The merged matmul then reads the 3-D input again and splits on its last axis,
// so that the flattening's reshapes go (unflatten_split_matmuls).
// CHECK-LABEL: func.func @qkv_3d
// CHECK: %[[M:.*]] = "taso.matmul"(%arg0, %{{.*}}) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x64x1024xf32>, tensor<1024x3072xf32>) -> tensor<1x64x3072xf32>
// CHECK: "taso.split"(%[[M]]) {axis = 2 : i64, {{.*}}sizes = array<i64: 1024, 1024, 1024>}
// CHECK-NOT: taso.matmul
// CHECK-NOT: taso.reshape
// REPORT: @qkv_3d: {{.*}} 2 rewrites applied
// REPORT: taso-flatten-matmuls: 3 matmuls of a shared input of rank 3 or more flattened to 2-D for the search
// REPORT-NOT: left alone restored
// REPORT: taso-unflatten-matmuls: 1 merged flattened matmuls made to read the 3-D input again
func.func @qkv_3d(%x: tensor<1x64x1024xf32>) -> (tensor<1x64x1024xf32>, tensor<1x64x1024xf32>, tensor<1x64x1024xf32>) {
  %wq = "taso.weight"() {name = "wq", value = dense<0.5> : tensor<1024x1024xf32>} : () -> tensor<1024x1024xf32>
  %wk = "taso.weight"() {name = "wk", value = dense<0.25> : tensor<1024x1024xf32>} : () -> tensor<1024x1024xf32>
  %wv = "taso.weight"() {name = "wv", value = dense<0.125> : tensor<1024x1024xf32>} : () -> tensor<1024x1024xf32>
  %q = "taso.matmul"(%x, %wq) {activation = "none"} : (tensor<1x64x1024xf32>, tensor<1024x1024xf32>) -> tensor<1x64x1024xf32>
  %k = "taso.matmul"(%x, %wk) {activation = "none"} : (tensor<1x64x1024xf32>, tensor<1024x1024xf32>) -> tensor<1x64x1024xf32>
  %v = "taso.matmul"(%x, %wv) {activation = "none"} : (tensor<1x64x1024xf32>, tensor<1024x1024xf32>) -> tensor<1x64x1024xf32>
  return %q, %k, %v : tensor<1x64x1024xf32>, tensor<1x64x1024xf32>, tensor<1x64x1024xf32>
}

// -----

// The matmul-bias family: each bias add is folded into its matmul before the search (matmul_bias),
// relu fuses into the biased matmul (M14) and the two layers on one input merge into one matmul with
// the weights and the biases concatenated (M28), then a split: fires.
// CHECK-LABEL: func.func @merge_biased_linears
// CHECK: %[[M:.*]] = "taso.matmul"(%arg0, %{{.*}}, %{{.*}}) {activation = "relu", operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<4x256xf32>, tensor<256x512xf32>, tensor<512xf32>) -> tensor<4x512xf32>
// CHECK-NEXT: %[[S:.*]]:2 = "taso.split"(%[[M]])
// CHECK-NOT: taso.ewadd
// CHECK-NOT: taso.relu
// CHECK: return %[[S]]#0, %[[S]]#1
// REPORT: @merge_biased_linears:
// REPORT: taso-fold-matmul-bias: 2 bias adds folded into matmuls
// REPORT: rules applied: {{.*}}M{{[0-9]+}}
func.func @merge_biased_linears(%x: tensor<4x256xf32>) -> (tensor<4x256xf32>, tensor<4x256xf32>) {
  %w1 = "taso.weight"() {name = "w1", value = dense<0.5> : tensor<256x256xf32>} : () -> tensor<256x256xf32>
  %w2 = "taso.weight"() {name = "w2", value = dense<0.25> : tensor<256x256xf32>} : () -> tensor<256x256xf32>
  %b1 = "taso.weight"() {name = "b1", value = dense<1.0> : tensor<256xf32>} : () -> tensor<256xf32>
  %b2 = "taso.weight"() {name = "b2", value = dense<-1.0> : tensor<256xf32>} : () -> tensor<256xf32>
  %m1 = "taso.matmul"(%x, %w1) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<4x256xf32>, tensor<256x256xf32>) -> tensor<4x256xf32>
  %a1 = "taso.ewadd"(%m1, %b1) : (tensor<4x256xf32>, tensor<256xf32>) -> tensor<4x256xf32>
  %r1 = "taso.relu"(%a1) : (tensor<4x256xf32>) -> tensor<4x256xf32>
  %m2 = "taso.matmul"(%x, %w2) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<4x256xf32>, tensor<256x256xf32>) -> tensor<4x256xf32>
  %a2 = "taso.ewadd"(%b2, %m2) : (tensor<256xf32>, tensor<4x256xf32>) -> tensor<4x256xf32>
  %r2 = "taso.relu"(%a2) : (tensor<4x256xf32>) -> tensor<4x256xf32>
  return %r1, %r2 : tensor<4x256xf32>, tensor<4x256xf32>
}

// -----

// Not when the bias is a row (1 x N) rather than one value per column ([N]): the add stays an add,
// and the matmul's relu cannot fuse across it.
// CHECK-LABEL: func.func @row_bias_is_not_folded
// CHECK: taso.matmul
// CHECK: taso.ewadd
// CHECK: taso.relu
// REPORT: @row_bias_is_not_folded:
// REPORT-NOT: bias adds folded into matmuls
// REPORT: total time
func.func @row_bias_is_not_folded(%x: tensor<4x256xf32>) -> tensor<4x256xf32> {
  %w1 = "taso.weight"() {name = "w1", value = dense<0.5> : tensor<256x256xf32>} : () -> tensor<256x256xf32>
  %b1 = "taso.weight"() {name = "b1", value = dense<1.0> : tensor<1x256xf32>} : () -> tensor<1x256xf32>
  %m1 = "taso.matmul"(%x, %w1) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<4x256xf32>, tensor<256x256xf32>) -> tensor<4x256xf32>
  %a1 = "taso.ewadd"(%m1, %b1) : (tensor<4x256xf32>, tensor<1x256xf32>) -> tensor<4x256xf32>
  %r1 = "taso.relu"(%a1) : (tensor<4x256xf32>) -> tensor<4x256xf32>
  return %r1 : tensor<4x256xf32>
}

// -----

// Elementwise ops on the pieces of two splits (an RNN cell's gates after its projections merged) lift to
// one op on the whole tensor and a split (lift_elementwise.py), and then the sigmoids on the sum's
// pieces (the sum's own split is then dead). Where it gains: three ops on 256-element pieces cost three
// launches, one op on the whole and a split two. Then the multiply of the one piece pair left: the two
// input splits only feed it, so they go with it (three launches), and one op on the whole and a split
// (two) replace them.
// CHECK-LABEL: func.func @lift_over_splits
// CHECK: %[[S:.*]] = "taso.ewadd"(%arg0, %arg1) : (tensor<1x1024xf32>, tensor<1x1024xf32>) -> tensor<1x1024xf32>
// CHECK-NEXT: %[[G:.*]] = "taso.sigmoid"(%[[S]]) : (tensor<1x1024xf32>)
// CHECK: %[[Q:.*]]:4 = "taso.split"(%[[G]])
// CHECK: %[[M:.*]] = "taso.ewmul"(%arg0, %arg1) : (tensor<1x1024xf32>, tensor<1x1024xf32>)
// CHECK: %[[P:.*]]:4 = "taso.split"(%[[M]])
// CHECK: return %[[Q]]#0, %[[Q]]#1, %[[P]]#2, %[[Q]]#3
// REPORT: @lift_over_splits: {{.*}} ops 9 -> 5
// REPORT: taso-lift-elementwise: 7 elementwise ops on split pieces lifted to one op on the whole tensor
// REPORT-NOT: weights' column blocks permuted
// REPORT: total time
func.func @lift_over_splits(%x: tensor<1x1024xf32>, %h: tensor<1x1024xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>) {
  %xs:4 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 256, 256, 256, 256>, resultSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x1024xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>)
  %hs:4 = "taso.split"(%h) {axis = 1 : i64, sizes = array<i64: 256, 256, 256, 256>, resultSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x1024xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>)
  %a0 = "taso.ewadd"(%xs#0, %hs#0) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  %a1 = "taso.ewadd"(%hs#1, %xs#1) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  %a3 = "taso.ewadd"(%xs#3, %hs#3) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  %g0 = "taso.sigmoid"(%a0) : (tensor<1x256xf32>) -> tensor<1x256xf32>
  %g1 = "taso.sigmoid"(%a1) : (tensor<1x256xf32>) -> tensor<1x256xf32>
  %g3 = "taso.sigmoid"(%a3) : (tensor<1x256xf32>) -> tensor<1x256xf32>
  %m2 = "taso.ewmul"(%xs#2, %hs#2) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  return %g0, %g1, %m2, %g3 : tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>
}

// -----

// Two ops on two pieces: the split only feeds them, so it goes with them (three launches), and one op
// on the whole and a split (two) replace them: fires.
// CHECK-LABEL: func.func @two_pieces_lift_with_their_split
// CHECK: "taso.tanh"(%arg0) : (tensor<1x512xf32>)
// REPORT: @two_pieces_lift_with_their_split: {{.*}} ops 3 -> 2
func.func @two_pieces_lift_with_their_split(%x: tensor<1x512xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>) {
  %xs:2 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 256, 256>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x512xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>)
  %t0 = "taso.tanh"(%xs#0) : (tensor<1x256xf32>) -> tensor<1x256xf32>
  %t1 = "taso.tanh"(%xs#1) : (tensor<1x256xf32>) -> tensor<1x256xf32>
  return %t0, %t1 : tensor<1x256xf32>, tensor<1x256xf32>
}

// -----

// Not where the split stays (its third piece is used as it is): two ops on two pieces cost as much as
// one op on the whole and its split (two launches).
// CHECK-LABEL: func.func @two_pieces_do_not_lift
// CHECK-COUNT-2: "taso.tanh"(%{{.*}}#{{[0-9]}}) : (tensor<1x256xf32>)
// REPORT: @two_pieces_do_not_lift: {{.*}} ops 3 -> 3
func.func @two_pieces_do_not_lift(%x: tensor<1x768xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>) {
  %xs:3 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 256, 256, 256>, resultSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x768xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>)
  %t0 = "taso.tanh"(%xs#0) : (tensor<1x256xf32>) -> tensor<1x256xf32>
  %t1 = "taso.tanh"(%xs#1) : (tensor<1x256xf32>) -> tensor<1x256xf32>
  return %t0, %t1, %xs#2 : tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>
}

// -----

// Not when the two splits cut different sizes: the pieces do not line up (and neither side is a matmul
// whose weight could be permuted).
// CHECK-LABEL: func.func @no_lift_across_different_cuts
// CHECK-COUNT-3: "taso.ewadd"(%{{.*}}#{{[0-9]}}, %{{.*}}#{{[0-9]}}) : (tensor<1x256xf32>
// REPORT: @no_lift_across_different_cuts: {{.*}} ops 5 -> 5
func.func @no_lift_across_different_cuts(%x: tensor<1x1024xf32>, %h: tensor<1x1024xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>) {
  %xs:4 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 256, 256, 256, 256>, resultSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x1024xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>)
  %hs:3 = "taso.split"(%h) {axis = 1 : i64, sizes = array<i64: 256, 256, 512>, resultSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x1024xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x512xf32>)
  %a0 = "taso.ewadd"(%xs#0, %hs#0) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  %a1 = "taso.ewadd"(%xs#1, %hs#1) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  %a2 = "taso.ewadd"(%xs#2, %hs#1) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  return %a0, %a1, %a2 : tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>
}

// -----

// Lifting layout ops over a split (lift_layout, after the search): attention heads. Each piece of the
// split goes through a like reshape and a like transpose; one reshape and one transpose of the whole
// and a split of the result replace them (the split axis moves to 2, then to 1): fires.
// CHECK-LABEL: func.func @heads
// CHECK: %[[R:.*]] = "taso.reshape"(%arg0) {shape = array<i64: 1, 64, 12, 16>}
// CHECK: %[[T:.*]] = "taso.transpose"(%[[R]]) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x64x12x16xf32>) -> tensor<1x12x64x16xf32>
// CHECK: "taso.split"(%[[T]]) {axis = 1 : i64, {{.*}}sizes = array<i64: 4, 4, 4>}
// CHECK-NOT: taso.transpose
// REPORT: @heads: {{.*}} 0 rewrites applied
// REPORT: taso-lift-layout: 6 reshapes and transposes of split pieces lifted to one op on the whole tensor
// REPORT-NOT: reshape chains composed
// REPORT: total time
func.func @heads(%x: tensor<64x192xf32>) -> (tensor<1x4x64x16xf32>, tensor<1x4x64x16xf32>, tensor<1x4x64x16xf32>) {
  %s:3 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 64, 64, 64>, resultSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<64x192xf32>) -> (tensor<64x64xf32>, tensor<64x64xf32>, tensor<64x64xf32>)
  %r0 = "taso.reshape"(%s#0) {shape = array<i64: 1, 64, 4, 16>} : (tensor<64x64xf32>) -> tensor<1x64x4x16xf32>
  %r1 = "taso.reshape"(%s#1) {shape = array<i64: 1, 64, 4, 16>} : (tensor<64x64xf32>) -> tensor<1x64x4x16xf32>
  %r2 = "taso.reshape"(%s#2) {shape = array<i64: 1, 64, 4, 16>} : (tensor<64x64xf32>) -> tensor<1x64x4x16xf32>
  %t0 = "taso.transpose"(%r0) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x64x4x16xf32>) -> tensor<1x4x64x16xf32>
  %t1 = "taso.transpose"(%r1) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x64x4x16xf32>) -> tensor<1x4x64x16xf32>
  %t2 = "taso.transpose"(%r2) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x64x4x16xf32>) -> tensor<1x4x64x16xf32>
  return %t0, %t1, %t2 : tensor<1x4x64x16xf32>, tensor<1x4x64x16xf32>, tensor<1x4x64x16xf32>
}

// -----

// The pieces go through different reshapes (no one reshape of the whole gives both layouts):
// nothing lifts.
// CHECK-LABEL: func.func @heads_different_layouts
// CHECK-COUNT-2: "taso.reshape"
// CHECK-NOT: "taso.reshape"
// REPORT-NOT: reshapes and transposes of split pieces lifted
func.func @heads_different_layouts(%x: tensor<64x128xf32>) -> (tensor<1x64x4x16xf32>, tensor<1x64x16x4xf32>) {
  %s:2 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 64, 64>, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<64x128xf32>) -> (tensor<64x64xf32>, tensor<64x64xf32>)
  %r0 = "taso.reshape"(%s#0) {shape = array<i64: 1, 64, 4, 16>} : (tensor<64x64xf32>) -> tensor<1x64x4x16xf32>
  %r1 = "taso.reshape"(%s#1) {shape = array<i64: 1, 64, 16, 4>} : (tensor<64x64xf32>) -> tensor<1x64x16x4xf32>
  return %r0, %r1 : tensor<1x64x4x16xf32>, tensor<1x64x16x4xf32>
}

// -----

// Gathers at constant indices covering an axis (torch's packed Q/K/V taken apart) are one split
// before the search (pieces of 1 x 4 x 8, each reshaped to 4 x 8; the layout lifting then makes the
// reshapes one, of the whole); a gather of one row of another tensor stays.
// CHECK-LABEL: func.func @gathers_to_split
// CHECK: %[[R:.*]] = "taso.reshape"(%arg0) {shape = array<i64: 12, 8>}
// CHECK: "taso.split"(%[[R]]) {axis = 0 : i64, {{.*}}sizes = array<i64: 4, 4, 4>}
// CHECK: "onnx.Gather"(%arg1
// CHECK-NOT: "onnx.Gather"
// REPORT: @gathers_to_split:
// REPORT-NOT: taso-raise-views
// REPORT: taso-raise-gathers: 3 Gathers of every index of an axis raised to splits
func.func @gathers_to_split(%x: tensor<3x4x8xf32>, %y: tensor<3x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) {
  %i0 = "taso.weight"() {name = "i0", value = dense<0> : tensor<si64>} : () -> tensor<si64>
  %i1 = "taso.weight"() {name = "i1", value = dense<1> : tensor<si64>} : () -> tensor<si64>
  %i2 = "taso.weight"() {name = "i2", value = dense<-1> : tensor<si64>} : () -> tensor<si64>
  %q = "onnx.Gather"(%x, %i0) {axis = 0 : si64} : (tensor<3x4x8xf32>, tensor<si64>) -> tensor<4x8xf32>
  %k = "onnx.Gather"(%x, %i1) {axis = 0 : si64} : (tensor<3x4x8xf32>, tensor<si64>) -> tensor<4x8xf32>
  %v = "onnx.Gather"(%x, %i2) {axis = 0 : si64} : (tensor<3x4x8xf32>, tensor<si64>) -> tensor<4x8xf32>
  %r = "onnx.Gather"(%y, %i1) {axis = 0 : si64} : (tensor<3x8xf32>, tensor<si64>) -> tensor<8xf32>
  return %q, %k, %v, %r : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>
}

// -----

// A scale computed from a static shape (nn.MultiheadAttention's 1 / sqrt(d)) is a constant; the
// Unsqueeze and Squeeze around a transpose are reshapes, and the three one transpose.
// CHECK-LABEL: func.func @shape_constants
// CHECK: "taso.weight"() {name = "taso_folded_{{[0-9]+}}", value = dense<1.250000e-01> : tensor<1xf32>}
// CHECK-NOT: "onnx.
// CHECK: "taso.transpose"(%{{.*}}) {perm = array<i64: 1, 0>} : (tensor<2x64xf32>) -> tensor<64x2xf32>
// CHECK-NEXT: return
// REPORT: @shape_constants: {{.*}}
// REPORT: taso-fold-constants: 4 generic ONNX ops with constant results folded into weights
// REPORT: taso-raise-views: 2 Squeeze/Unsqueeze/Flatten raised to reshapes
// REPORT-NOT: taso-raise-gathers
// REPORT: 1 reshape/transpose chains made one transpose
func.func @shape_constants(%x: tensor<2x64xf32>) -> tensor<64x2xf32> {
  %s = "onnx.Shape"(%x) {start = -1 : si64} : (tensor<2x64xf32>) -> tensor<1xsi64>
  %c = "onnx.Cast"(%s) {to = 1 : si64} : (tensor<1xsi64>) -> tensor<1xf32>
  %q = "onnx.Sqrt"(%c) : (tensor<1xf32>) -> tensor<1xf32>
  %r = "onnx.Reciprocal"(%q) : (tensor<1xf32>) -> tensor<1xf32>
  %y = "taso.ewmul"(%x, %r) : (tensor<2x64xf32>, tensor<1xf32>) -> tensor<2x64xf32>
  %ax = "taso.weight"() {name = "ax", value = dense<0> : tensor<1xsi64>} : () -> tensor<1xsi64>
  %u = "onnx.Unsqueeze"(%y, %ax) : (tensor<2x64xf32>, tensor<1xsi64>) -> tensor<1x2x64xf32>
  %t = "taso.transpose"(%u) {perm = array<i64: 0, 2, 1>} : (tensor<1x2x64xf32>) -> tensor<1x64x2xf32>
  %z = "onnx.Squeeze"(%t, %ax) : (tensor<1x64x2xf32>, tensor<1xsi64>) -> tensor<64x2xf32>
  return %z : tensor<64x2xf32>
}

// -----

// Two transposes with a reshape between them (heads first, then Q/K/V first) are one transpose.
// CHECK-LABEL: func.func @layout_chain
// CHECK: "taso.reshape"(%arg0) {shape = array<i64: 8, 3, 2, 4>}
// CHECK: "taso.transpose"({{.*}}) {perm = array<i64: 2, 1, 0, 3>}
// CHECK-NOT: "taso.transpose"
// REPORT: 1 reshape/transpose chains made one transpose
func.func @layout_chain(%x: tensor<8x24xf32>) -> tensor<2x24x4xf32> {
  %r = "taso.reshape"(%x) {shape = array<i64: 8, 3, 8>} : (tensor<8x24xf32>) -> tensor<8x3x8xf32>
  %t = "taso.transpose"(%r) {perm = array<i64: 1, 0, 2>} : (tensor<8x3x8xf32>) -> tensor<3x8x8xf32>
  %r2 = "taso.reshape"(%t) {shape = array<i64: 24, 2, 4>} : (tensor<3x8x8xf32>) -> tensor<24x2x4xf32>
  %t2 = "taso.transpose"(%r2) {perm = array<i64: 1, 0, 2>} : (tensor<24x2x4xf32>) -> tensor<2x24x4xf32>
  return %t2 : tensor<2x24x4xf32>
}

// -----

// Sequence-first projections in a batch-first model: the transpose into the matmul moves below it
// (it moves whole rows) and joins the heads transpose after it; one transpose is left.
// CHECK-LABEL: func.func @row_chain
// CHECK: %[[M:.*]] = "taso.matmul"(%arg0, %{{.*}}) {activation = "none"{{.*}}} : (tensor<2x4x8xf32>, tensor<8x6xf32>) -> tensor<2x4x6xf32>
// CHECK: "taso.transpose"
// CHECK-NOT: "taso.transpose"
// REPORT: 1 row reshapes/transposes moved across matmuls
func.func @row_chain(%x: tensor<2x4x8xf32>) -> tensor<2x3x4x2xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<8x6xf32>} : () -> tensor<8x6xf32>
  %t = "taso.transpose"(%x) {perm = array<i64: 1, 0, 2>} : (tensor<2x4x8xf32>) -> tensor<4x2x8xf32>
  %m = "taso.matmul"(%t, %w) {activation = "none"} : (tensor<4x2x8xf32>, tensor<8x6xf32>) -> tensor<4x2x6xf32>
  %r = "taso.reshape"(%m) {shape = array<i64: 4, 2, 3, 2>} : (tensor<4x2x6xf32>) -> tensor<4x2x3x2xf32>
  %u = "taso.transpose"(%r) {perm = array<i64: 1, 2, 0, 3>} : (tensor<4x2x3x2xf32>) -> tensor<2x3x4x2xf32>
  return %u : tensor<2x3x4x2xf32>
}

// -----

// Attention's scale: a division of the scores by 8 is a multiply by 0.125 bit for bit, and the factor
// goes up through the heads transpose and reshape into the query projection's weight and bias
// (fold_scale); the division by 3 has no exact reciprocal and stays.
// CHECK-LABEL: func.func @attention_scale
// CHECK: "taso.weight"() {name = "wq.scaled{{[0-9]*}}", value = dense<6.250000e-02> : tensor<8x4xf32>}
// CHECK: "taso.weight"() {name = "bq.scaled{{[0-9]*}}", value = dense<1.250000e-01> : tensor<4xf32>}
// CHECK-NOT: taso.smul
// CHECK: "onnx.Div"
// REPORT: taso-raise-divs: 1 divisions by a power of two made scalar multiplies
// REPORT: taso-fold-scales: 1 scalar multiplies folded into the weights they scale
func.func @attention_scale(%x: tensor<1x4x8xf32>, %k: tensor<1x2x2x4xf32>) -> (tensor<1x2x4x4xf32>, tensor<1x2x2x4xf32>) {
  %wq = "taso.weight"() {name = "wq", value = dense<0.5> : tensor<8x4xf32>} : () -> tensor<8x4xf32>
  %bq = "taso.weight"() {name = "bq", value = dense<1.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %eight = "taso.weight"() {name = "eight", value = dense<8.0> : tensor<f32>} : () -> tensor<f32>
  %three = "taso.weight"() {name = "three", value = dense<3.0> : tensor<f32>} : () -> tensor<f32>
  %q = "taso.matmul"(%x, %wq, %bq) {activation = "none"} : (tensor<1x4x8xf32>, tensor<8x4xf32>, tensor<4xf32>) -> tensor<1x4x4xf32>
  %r = "taso.reshape"(%q) {shape = array<i64: 1, 4, 2, 2>} : (tensor<1x4x4xf32>) -> tensor<1x4x2x2xf32>
  %t = "taso.transpose"(%r) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x4x2x2xf32>) -> tensor<1x2x4x2xf32>
  %s = "taso.matmul"(%t, %k) {activation = "none"} : (tensor<1x2x4x2xf32>, tensor<1x2x2x4xf32>) -> tensor<1x2x4x4xf32>
  %y = "onnx.Div"(%s, %eight) : (tensor<1x2x4x4xf32>, tensor<f32>) -> tensor<1x2x4x4xf32>
  %z = "onnx.Div"(%k, %three) : (tensor<1x2x2x4xf32>, tensor<f32>) -> tensor<1x2x2x4xf32>
  return %y, %z : tensor<1x2x4x4xf32>, tensor<1x2x2x4xf32>
}

// -----

// A rule stated on 2-D tensors whose target makes a constant from the input's dimension 1 (an
// identity matrix the size of a row) matches a 1-D scalar multiply by its rank-polymorphic source: the
// site is rejected (the target does not type-check) instead of stopping the search.
// CHECK-LABEL: func.func @smul_rank1
// CHECK: "taso.smul"
// REPORT: @smul_rank1: cost {{.*}} 0 rewrites applied
func.func @smul_rank1(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> {
  %s = "taso.weight"() {name = "s", value = dense<0.5> : tensor<f32>} : () -> tensor<f32>
  %a = "taso.ewadd"(%x, %y) : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %m = "taso.smul"(%a, %s) : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  return %m : tensor<8xf32>
}
