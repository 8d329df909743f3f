// x @ W1 + h @ W2, then relu: an RNN cell's step. taso-opt docs/example.mlir --taso-search --taso-report
func.func @cell(%x: tensor<1x512xf32>, %h: tensor<1x512xf32>) -> tensor<1x512xf32> {
  %w1 = "taso.weight"() {name = "w1", value = dense<0.5> : tensor<512x512xf32>} : () -> tensor<512x512xf32>
  %w2 = "taso.weight"() {name = "w2", value = dense<0.25> : tensor<512x512xf32>} : () -> tensor<512x512xf32>
  %a = "taso.matmul"(%x, %w1) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  %b = "taso.matmul"(%h, %w2) {activation = "none"} : (tensor<1x512xf32>, tensor<512x512xf32>) -> tensor<1x512xf32>
  %s = "taso.ewadd"(%a, %b) : (tensor<1x512xf32>, tensor<1x512xf32>) -> tensor<1x512xf32>
  %r = "taso.relu"(%s) : (tensor<1x512xf32>) -> tensor<1x512xf32>
  return %r : tensor<1x512xf32>
}
