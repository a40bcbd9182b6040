//===- sp-fuzz-plan-reader.cpp - Fuzz the plan reader ---------------------===//
//
// An input is a plan directory in one buffer: its files separated by NUL
// bytes (which JSON text cannot hold), handed out in the order the reader
// asks for them: manifest.json first, then program.json, then the stage
// programs the manifest names. A plan that reads (plan/Plan.cpp, with
// plan/Program.cpp) is then used as sp-run uses it before it allocates
// anything: every manifest entry the runtime and sp-run read, with the
// same json::value calls (which throw on another type), and the plan's
// checkpoint fingerprint. Besides crashes, leaks, sanitizer reports and
// uncaught exceptions, this aborts: a program that, written back to JSON,
// does not read back the same.
//
//===----------------------------------------------------------------------===//
#include "FuzzSupport.h"
#include "plan/Plan.h"
#include "runtime/Checkpoint.h"
#include <cstdint>

using namespace llvm;
using namespace sp;
using namespace sp::fuzz;
using json = nlohmann::json;

namespace {

/// The reads of tools/sp-run.cpp, train/ and
/// runtime/Executor.cpp, with the defaults they use.
void readLikeTheRuntime(const Plan &P) {
  const json &M = P.Manifest;
  (void)M.value("dtype", "f32");
  (void)M.value("tp", 1);
  (void)M.value("microbatches", int64_t(1));
  (void)M.value("microbatches", 1);
  (void)M.value("arena_bytes", P.Prog.ArenaBytes);
  (void)M.value("source", "");
  (void)M.value("source", std::string("model"));
  const json &Model = M.value("model", json());
  if (Model.is_object())
    for (const char *Field : {"vocab", "batch", "seq"})
      (void)Model.value(Field, int64_t(0));
  json Planned = M.value("memory", json::object());
  (void)Planned.value("activation_layer", 0);
  (void)Planned.value("first_stage_activation_bytes", int64_t(-1));
  (void)Planned.value("activation_bytes_per_layer", int64_t(-1));
  (void)Planned.value("stored_bytes_by_layer", json::array());
  for (int K = 0; K < P.numStages(); ++K) {
    (void)planFingerprint(P.stage(K));
    // The executor walks a compact program's steps (prepareCompactRun, the
    // CPU backend) or writes them out on that walk (expandProgram, the CUDA
    // one) before it allocates.
    auto Flat = expandProgram(P.stage(K));
    if (!Flat)
      checkMessage(Flat.takeError());
  }
}

void checkRoundTrip(const Program &Prog) {
  json J = programToJson(Prog);
  auto Again = programFromJson(J);
  if (!Again)
    invariantFailed("a program read from a plan does not read back: " +
                    toString(Again.takeError()));
  if (programToJson(*Again) != J)
    invariantFailed("a program read from a plan reads back differently");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  SmallVector<StringRef, 4> Files;
  StringRef(reinterpret_cast<const char *>(Data), Size).split(Files, '\0');
  size_t Next = 0;
  auto ReadFile = [&](StringRef Name) -> Expected<std::string> {
    if (Next == Files.size())
      return createStringError(inconvertibleErrorCode(),
                               "cannot read 'fuzz.plan/%s': no such file",
                               Name.str().c_str());
    return Files[Next++].str();
  };
  auto P = readPlan("fuzz.plan", ReadFile);
  if (!P) {
    checkMessage(P.takeError());
    return 0;
  }
  readLikeTheRuntime(*P);
  for (int K = 0; K < P->numStages(); ++K)
    checkRoundTrip(P->stage(K));
  return 0;
}
