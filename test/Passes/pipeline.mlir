// RUN: taso-opt %s --pass-pipeline='builtin.module(canonicalize,taso-dce,convert-onnx-to-taso{opset=13},cse)' | FileCheck %s
// RUN: taso-opt %s --canonicalize --taso-dce --cse | FileCheck %s --check-prefix=FLAGS
// RUN: taso-opt %s --taso-dce --mlir-print-ir-after-all -o /dev/null 2>&1 | FileCheck %s --check-prefix=PRINT
// RUN: taso-opt %s --taso-dce --taso-verify --mlir-timing -o /dev/null 2>&1 | FileCheck %s --check-prefix=TIMING
// RUN: not taso-opt %s --pass-pipeline='builtin.module(taso-dce{bogus=1})' 2>&1 | FileCheck %s --check-prefix=BADOPT
// RUN: not taso-opt %s --pass-pipeline='builtin.module(no-such-pass)' 2>&1 | FileCheck %s --check-prefix=BADPASS
// RUN: not taso-opt %s --pass-pipeline='builtin.module(func.func(taso-dce))' 2>&1 | FileCheck %s --check-prefix=NESTED
// Our passes mix with upstream ones in one pipeline, as flags or in --pass-pipeline.

// CHECK-LABEL: func.func @f
// CHECK-SAME: taso.opset_imports = {ai.onnx = 13 : i64}
// CHECK-NEXT: %[[A:.*]] = "taso.ewadd"
// CHECK-NEXT: return %[[A]]
// FLAGS-LABEL: func.func @f
// FLAGS-NEXT: %[[A:.*]] = "taso.ewadd"
// FLAGS-NEXT: return %[[A]]
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = "taso.ewadd"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %b = "taso.ewadd"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %dead = "onnx.Neg"(%b) : (tensor<4xf32>) -> tensor<4xf32>
  return %a : tensor<4xf32>
}

// PRINT: IR Dump After taso-dce
// PRINT-NOT: onnx.Neg
// TIMING: Execution time report
// TIMING-DAG: taso-dce
// TIMING-DAG: taso-verify
// BADOPT: taso-opt: error: pass 'taso-dce' has no option 'bogus'
// BADPASS: taso-opt: error: unknown or malformed pass 'no-such-pass'
// NESTED: taso-opt: error: taso pass 'taso-dce' runs on builtin.module, not nested in 'func.func(...)'
