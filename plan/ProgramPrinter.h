//===- ProgramPrinter.h - A program as text ---------------------*- C++ -*-===//
//
// What sp-opt --lower prints: a lowered program (plan/Program.h) in the
// spelling of the textual IR (ir/AsmFormat.h), so that the lit tests of the
// program passes (tests/lit/lower/) can check a rewrite with FileCheck, and
// a reader can follow a program without its JSON:
//
//   program {
//     input %idx : i64[1, 4] as tokens
//     param %attn.w : f32[24, 8]
//     state %adam.m.attn.w : f32[24, 8]
//     %67 : f32[1, 2, 4, 4] = batch_matmul(%64, %65) {trans_b = 1} [layer = 0, role = "qk"]
//     %68 : f32[1, 2, 4, 4] = softmax(%67) {alpha = 0.5, causal = 1, fill = -inf} [layer = 0, role = "softmax"]
//     %119 : f32[1, 4, 8] = all_gather(%84) {dim = 1, parts = 2} [layer = 0, role = "mlp_f_regather", phase = bwd, beside = %118]
//     %118 : f32[1, 4, 8] = linear(%117, %fc.w) {trans_w = 0} [layer = 0, role = "fc1", phase = bwd]
//     output "loss" = %89
//   }
//
// The persistent buffers (inputs, parameters, state, constants) are declared
// first with their type, sharding and, for an input, what feeds it; then
// each instruction: its results with their types, the op, its operands, its
// attributes (sorted by name), its ONNX name as loc("..."), and the tags
// that are set: layer, role, phase (forward is the default), and for a
// collective the first result of the GEMM it runs beside. A temporary is
// named "%N" (its buffer id); a persistent buffer "%" and its name. A compact
// program's templates each start with a comment line ("// template forward,
// chunk 0"). Offsets and live ranges are not printed: the passes run before
// the memory plan. The text is for reading and FileCheck; nothing parses it.
//
//===----------------------------------------------------------------------===//
#ifndef SP_PLAN_PROGRAMPRINTER_H
#define SP_PLAN_PROGRAMPRINTER_H

#include "plan/Program.h"
#include "llvm/Support/raw_ostream.h"

namespace sp {

void printProgram(const Program &P, llvm::raw_ostream &OS);

} // namespace sp

#endif // SP_PLAN_PROGRAMPRINTER_H
