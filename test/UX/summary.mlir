// What taso-opt tells people (issue 22): one summary line after taso-search, progress where asked for
// (plain lines in a log), --version, and one-line errors for an empty input and for the importer's form.
// RUN: taso-opt %s --taso-search -o /dev/null 2>&1 | FileCheck %s
// CHECK: taso-opt: target analytic:t4 (estimated): cost {{[0-9.e-]+}} -> {{[0-9.e-]+}} ms, ops 3 -> 2, 1 rewrite, {{[0-9.]+}} s
// RUN: taso-opt %s --taso-search --progress -o /dev/null 2>&1 | FileCheck %s --check-prefix=PROGRESS
// PROGRESS: taso-opt: [{{ *[0-9.]+}} s] parse {{.*}}summary.mlir
// PROGRESS-NEXT: taso-opt: [{{ *[0-9.]+}} s] taso-search
// PROGRESS: taso-opt: [{{ *[0-9.]+}} s] write /dev/null
// PROGRESS-NEXT: taso-opt: target analytic:t4
// RUN: taso-opt --version | FileCheck %s --check-prefix=VERSION
// VERSION: taso-opt {{[0-9]+\.[0-9]+}}
// RUN: printf '// a comment, and nothing else\n\n' > %t.mlir
// RUN: not taso-opt %t.mlir 2>&1 | FileCheck %s --check-prefix=EMPTY
// EMPTY: taso-opt: error: {{.*}}.mlir: empty input: no module
// RUN: not taso-opt %S/../Conversion/onnx-to-taso.mlir --taso-search 2>&1 | FileCheck %s --check-prefix=TORCH
// TORCH: taso-opt: error: {{.*}}: the input is the ONNX importer's form (torch.operator "onnx.*" ops): add --convert-onnx-to-taso before --taso-search
// RUN: taso-opt %S/../Conversion/onnx-to-taso.mlir --convert-onnx-to-taso --taso-search | FileCheck %s --check-prefix=CONVERTED
// CONVERTED: "taso.conv2d"

func.func @cell(%x: tensor<1x64xf32>, %h: tensor<1x64xf32>) -> tensor<1x64xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<64x64xf32>} : () -> tensor<64x64xf32>
  %u = "taso.weight"() {name = "u", value = dense<0.25> : tensor<64x64xf32>} : () -> tensor<64x64xf32>
  %a = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<1x64xf32>, tensor<64x64xf32>) -> tensor<1x64xf32>
  %b = "taso.matmul"(%h, %u) {activation = "none"} : (tensor<1x64xf32>, tensor<64x64xf32>) -> tensor<1x64xf32>
  %s = "taso.ewadd"(%a, %b) : (tensor<1x64xf32>, tensor<1x64xf32>) -> tensor<1x64xf32>
  return %s : tensor<1x64xf32>
}
