//===- GraphExport.h - A plan's programs as ONNX graphs to look at -*- C++ -*-===//
//
// sp-compile --export-graphs DIR: every pipeline rank's lowered program
// (forward, backward, recomputation, optimizer and collectives, as sp-run
// runs it) written as an ONNX model that Netron and onnx.checker open:
//
//   DIR/program.onnx      a plan without pipeline stages
//   DIR/program-K.onnx    pipeline rank K's (every tensor- and
//                         data-parallel rank of that stage runs it)
//
// What each file holds:
//   - a node per instruction, in execution order. Add, Mul, Softmax and Relu
//     whose operands share one float type are ONNX's own ops (domain "");
//     every other op (linear, layer_norm, attention, the collectives, send
//     and recv, adamw, ...) is in the custom domain "sp" with its sp
//     attributes. A node's doc_string holds its metadata as
//     "layer=3 role=qkv phase=forward stage=0" (and template=, chunk= in a
//     compact pipelined program, beside= for a collective overlapped with a
//     GEMM), the same fields under keys sp.layer, sp.role, ... as string
//     attributes of the sp-domain nodes;
//   - a value per buffer version: the program writes buffers in place
//     (adamw updates its parameter and moments, accumulate its sum), which
//     ONNX cannot say, so every write after the first makes a new value
//     "NAME@v2", "NAME@v3", ... (static single assignment). Its value_info
//     has the per-rank type and shape and a doc_string
//     "kind=param sharding=#split(dim=0, parts=2) bytes=... offset=..."
//     (the arena offset; scope= and slot region for a compact program);
//   - graph inputs: the parameters, optimizer state, fed inputs and
//     constants the program reads (as inputs, not initializers: no weights
//     are copied); graph outputs: the program's named outputs ("loss",
//     "grad:NAME") and the last version of every buffer updated in place.
//
// A compact pipelined program is written as its templates (each
// instruction once), not unrolled over the microbatches.
//
// Every file is checked with onnx::checker before it is written, and the
// folder is written atomically; an existing folder is replaced only when it
// holds ONNX files alone.
//
//===----------------------------------------------------------------------===//
#ifndef SP_FRONTEND_GRAPHEXPORT_H
#define SP_FRONTEND_GRAPHEXPORT_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <string>
#include <vector>

namespace sp {

struct Plan;
struct Program;

/// The serialized ONNX model of program Prog, pipeline rank Stage of
/// Stages, of plan P (its manifest names the model and the layout). Errors
/// when onnx::checker refuses it (a bug: the message names the node).
llvm::Expected<std::string> programToOnnx(const Plan &P, const Program &Prog,
                                          int Stage, int Stages);

/// Whether exportGraphs can write Dir: it is not a file, the folder it goes
/// in exists, and if it exists it holds ONNX files only (an earlier export:
/// it is replaced whole, so a folder of the user's is refused). The error
/// names Dir and what to do.
llvm::Error checkGraphsOutput(llvm::StringRef Dir);

/// Writes every pipeline rank's program of P into Dir (replaced whole; see
/// checkGraphsOutput); returns the file names written.
llvm::Expected<std::vector<std::string>> exportGraphs(const Plan &P,
                                                      llvm::StringRef Dir);

} // namespace sp

#endif // SP_FRONTEND_GRAPHEXPORT_H
