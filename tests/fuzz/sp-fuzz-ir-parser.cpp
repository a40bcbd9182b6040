//===- sp-fuzz-ir-parser.cpp - Fuzz the textual IR parser and verifier ----===//
//
// An input is textual IR, as sp-opt reads it (ir/AsmFormat.h): it is
// parsed, and a graph that parses is verified (ir/Verifier.cpp, which runs
// shape inference on every node). Besides crashes, leaks and sanitizer
// reports, these abort: a verified graph whose printed form does not parse
// back, or parses into a graph that prints differently (the format
// round-trips: print(parse(print(G))) == print(G)) or does not verify.
//
//===----------------------------------------------------------------------===//
#include "FuzzSupport.h"
#include "ir/AsmFormat.h"
#include "ir/Verifier.h"
#include <cstdint>

using namespace llvm;
using namespace sp;
using namespace sp::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  StringRef Text(reinterpret_cast<const char *>(Data), Size);
  auto G = parseGraph(Text, "fuzz.sp");
  if (!G) {
    checkMessage(G.takeError());
    return 0;
  }
  if (Error E = verifyGraph(**G)) {
    checkMessage(std::move(E));
    return 0;
  }
  std::string Printed = graphToString(**G);
  auto Again = parseGraph(Printed, "printed.sp");
  if (!Again)
    invariantFailed("the printed graph does not parse: " +
                    toString(Again.takeError()) + "\n" + Printed);
  if (Error E = verifyGraph(**Again))
    invariantFailed("the printed graph does not verify: " +
                    toString(std::move(E)) + "\n" + Printed);
  std::string Reprinted = graphToString(**Again);
  if (Reprinted != Printed)
    invariantFailed("the graph prints differently after a round trip:\n" +
                    Printed + "--- then ---\n" + Reprinted);
  return 0;
}
