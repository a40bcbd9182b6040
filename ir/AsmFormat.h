//===- AsmFormat.h - Textual IR: printer and parser ------------*- C++ -*-===//
//
// The textual form round-trips: print(parse(print(G))) == print(G).
//
//   graph @gpt {
//     input %idx : i64[4, 64]
//     param %wte : f32[256, 64] = onnx("/m/gpt.onnx", "transformer.wte.weight")
//     param %w1 : f32[64, 192] = external("/m/weights.bin", 0, 49152)
//     const %eps : f32[] = dense<1e-05>
//     const %ones : f32[4, 4] = dense<splat 1.0>
//     state %adam.m.w1 : f32[64, 192]
//     %0 : f32[4, 64, 64] = embedding(%wte, %idx) loc("Gather_3") [role = "embed"]
//     %1 : f32[4, 64, 64] #split(1) = dropout(%0) {ratio = 0.1} [layer = 0]
//     output "logits" = %57
//   }
//
// Results print as %0, %1, ... in program order; inputs, parameters and
// constants keep their (ONNX) names, quoted when they are not identifiers.
// Tags print only when set: layer, role, phase (fwd is the default), stage.
//
//===----------------------------------------------------------------------===//
#ifndef SP_IR_ASMFORMAT_H
#define SP_IR_ASMFORMAT_H

#include "ir/IR.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include <memory>

namespace sp {

void printGraph(const Graph &G, llvm::raw_ostream &OS);
/// A string as the parser reads it: in double quotes, with \\, \", \n, \t
/// and \HH escapes.
void printQuoted(llvm::raw_ostream &OS, llvm::StringRef S);
/// An attribute's value as the textual IR writes it (a float as the
/// shortest decimal that reads back to the same double).
void printAttribute(llvm::raw_ostream &OS, const Attribute &A);
std::string graphToString(const Graph &G);

/// Parses one graph. Errors read "BufferName:line:col: message".
llvm::Expected<std::unique_ptr<Graph>> parseGraph(llvm::StringRef Text,
                                                  llvm::StringRef BufferName);

} // namespace sp

#endif // SP_IR_ASMFORMAT_H
