// MLIR's parser and printer recurse once per nesting level and overflow the C stack (a segfault) at a
// few thousand levels: deeper nesting than taso-opt's limit is one clear line, exit 1, nothing written.
// RUN: rm -rf %t && mkdir -p %t
// RUN: %python -c "import sys; d = 20000; open(sys.argv[1], 'w').write('func.func @g(%%x: tensor<2xf32>) -> tensor<2xf32> {\n' + '\"onnx.Foo\"() ({\n' * d + '}) : () -> ()\n' * d + 'return %%x : tensor<2xf32>\n}\n')" %t/regions.mlir
// RUN: not taso-opt %t/regions.mlir -o %t/out.onnx 2>&1 | FileCheck %s --check-prefix=REGIONS
// RUN: not test -e %t/out.onnx
// REGIONS: taso-opt: error: {{.*}}regions.mlir:501: brackets nested deeper than 1000 levels (regions, attributes or types) are not supported
// RUN: %python -c "import sys; d = 20000; open(sys.argv[1], 'w').write('func.func @g(%%x: tensor<2xf32>) -> tensor<2xf32> {\n  %%q = \"onnx.Relu\"(%%x) {foo = ' + '[' * d + '1' + ']' * d + '} : (tensor<2xf32>) -> tensor<2xf32>\n  return %%q : tensor<2xf32>\n}\n')" %t/attr.mlir
// RUN: not taso-opt %t/attr.mlir --split-input-file 2>&1 | FileCheck %s --check-prefix=ATTR
// ATTR: taso-opt: error: {{.*}}attr.mlir:2: brackets nested deeper than 1000 levels
// Moderate nesting is fine, and brackets in strings and comments do not count.
// RUN: taso-opt %s | FileCheck %s
// CHECK: "onnx.Relu"(%{{.*}}) {foo = {{\[\[\[\[}}1]]]], note = "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}
func.func @g(%x: tensor<2xf32>) -> tensor<2xf32> {
  // [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
  %q = "onnx.Relu"(%x) {foo = [[[[1]]]], note = "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["} : (tensor<2xf32>) -> tensor<2xf32>
  return %q : tensor<2xf32>
}
