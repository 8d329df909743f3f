// Bad input gets one clear line on stderr and a non-zero exit; no traceback, no partial output,
// the input file is left untouched.
// RUN: rm -rf %t && mkdir -p %t
// RUN: %python %S/../Inputs/make_model.py %t/good.onnx
// RUN: not taso-opt %t/missing.onnx 2>&1 | FileCheck %s --check-prefix=MISSING
// MISSING: taso-opt: error: {{.*}}missing.onnx: no such file
// RUN: head -c 300 %t/good.onnx > %t/truncated.onnx
// RUN: not taso-opt %t/truncated.onnx -o %t/out1.onnx 2>&1 | FileCheck %s --check-prefix=TRUNC
// RUN: not test -e %t/out1.onnx
// TRUNC: taso-opt: error: {{.*}}truncated.onnx: {{.*}}
// TRUNC-NOT: Traceback
// RUN: printf 'this is not a protobuf' > %t/garbage.onnx
// RUN: not taso-opt %t/garbage.onnx 2>&1 | FileCheck %s --check-prefix=GARBAGE
// GARBAGE: taso-opt: error: {{.*}}garbage.onnx: {{.*}}
// GARBAGE-NOT: Traceback
// RUN: not taso-opt %t/good.onnx -o %t/no/such/dir/out.onnx 2>&1 | FileCheck %s --check-prefix=NODIR
// NODIR: taso-opt: error: {{.*}}out.onnx: directory does not exist
// RUN: not taso-opt %t/good.onnx -o %t/good.onnx 2>&1 | FileCheck %s --check-prefix=SAME
// SAME: taso-opt: error: {{.*}}good.onnx: refusing to overwrite the input file
// RUN: %python %S/../Inputs/make_model.py %t/dyn.onnx dynamic
// RUN: not taso-opt %t/dyn.onnx 2>&1 | FileCheck %s --check-prefix=DYN
// DYN: taso-opt: error: {{.*}}dyn.onnx: graph input 'x' has a dynamic dimension 0 ('N'); dynamic shapes are not supported: give a static shape with --input-shape x=<d0>x<d1>x...
// RUN: taso-opt %t/dyn.onnx --input-shape x=1x3x8x8 | FileCheck %s --check-prefix=FIXED
// FIXED: func.func @lit_model(%{{.*}}: tensor<1x3x8x8xf32>)
// RUN: not taso-opt %t/dyn.onnx --input-shape y=1x3x8x8 2>&1 | FileCheck %s --check-prefix=BADNAME
// BADNAME: taso-opt: error: {{.*}}--input-shape names unknown graph input(s): y
// RUN: cp %t/good.onnx %t/copy.onnx
// RUN: not taso-opt %t/copy.onnx -o /proc/taso-unwritable.onnx 2>&1 | FileCheck %s --check-prefix=RO
// RUN: not taso-opt %t/copy.onnx -o /proc/taso-unwritable.mlir 2>&1 | FileCheck %s --check-prefix=RO
// RO: taso-opt: error: /proc/taso-unwritable.{{onnx|mlir}}: cannot write
// RUN: cmp %t/good.onnx %t/copy.onnx
// RUN: not taso-opt %t 2>&1 | FileCheck %s --check-prefix=DIR
// DIR: taso-opt: error: {{.*}}: is a directory
// RUN: %python %S/../Inputs/make_model.py %t/cyclic.onnx cyclic
// RUN: not taso-opt %t/cyclic.onnx 2>&1 | FileCheck %s --check-prefix=CYCLE
// CYCLE: taso-opt: error: {{.*}}cyclic.onnx: invalid ONNX model: {{.*}}topologically sorted{{.*}}
// RUN: %python %S/../Inputs/make_model.py %t/unknown.onnx unknown-op
// RUN: not taso-opt %t/unknown.onnx 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// UNKNOWN: taso-opt: error: {{.*}}unknown.onnx: invalid ONNX model: {{.*}}NoSuchOp{{.*}}
