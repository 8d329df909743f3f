// MLIR's bytecode reader segfaults on some corrupt files (Inputs/corrupt.mlirbc is a fuzzer's mutation
// of the bytecode of Conversion/onnx-mlir-generic.mlir): taso-opt parses bytecode in a child process
// first, so a corrupt file is one clear line and exit 1, not a crash (`not` fails on a crash).
// RUN: rm -f %t.onnx
// RUN: not taso-opt %S/../Inputs/corrupt.mlirbc -o %t.onnx 2>&1 | FileCheck %s
// RUN: not test -e %t.onnx
// RUN: not taso-opt - --convert-onnx-to-taso < %S/../Inputs/corrupt.mlirbc 2>&1 | FileCheck %s
// CHECK: taso-opt: error: {{.*}}: {{corrupt MLIR bytecode \(MLIR crashed reading it: SIG[A-Z]+\)|cannot parse MLIR}}
// CHECK-NOT: Segmentation
