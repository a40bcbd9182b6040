//===- sp-fuzz-onnx-import.cpp - Fuzz the ONNX importer -------------------===//
//
// An input is an .onnx file. It goes where sp-compile sends a model before
// the parallel passes: the importer (frontend/OnnxImporter.cpp, with ONNX's
// shape inference), then constant-fold, canonicalize, dce,
// detect-transformer and bind-inputs with the verifier after each. A graph
// that gets through is summarised and printed as sp-compile --report and
// sp-opt would.
//
// Besides crashes, leaks and sanitizer reports, these abort:
//   - a pass leaving a graph the verifier refuses ("after pass '...'"), or
//     the importer producing one ("internal error");
//   - an imported graph holding a string that is not UTF-8: every name can
//     reach the plan's JSON, which holds nothing else;
//   - a printed graph that does not parse back into a valid graph.
//
// Symbolic dimensions named batch and seq are bound to 2 and 8, so that the
// seeds exported with --dynamic import too.
//
//===----------------------------------------------------------------------===//
#include "FuzzSupport.h"
#include "frontend/OnnxImporter.h"
#include "ir/AsmFormat.h"
#include "ir/Verifier.h"
#include "driver/Compile.h"
#include "analysis/ModelInfo.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include <cstdint>

using namespace llvm;
using namespace sp;
using namespace sp::fuzz;

namespace {

/// The importer reads files: every input is written to one file in a
/// directory of this process, removed at exit.
class ModelFile {
public:
  ModelFile() {
    if (std::error_code EC =
            sys::fs::createUniqueDirectory("sp-fuzz-onnx", Dir))
      invariantFailed("cannot create a temporary directory: " + EC.message());
    Path = Dir;
    sys::path::append(Path, "model.onnx");
  }
  ~ModelFile() { sys::fs::remove_directories(Dir); }

  StringRef write(StringRef Bytes) {
    std::error_code EC;
    raw_fd_ostream OS(Path, EC);
    if (EC)
      invariantFailed("cannot write " + Path + ": " + EC.message());
    OS << Bytes;
    OS.close();
    if (OS.has_error())
      invariantFailed("cannot write " + Path);
    // The same path with new contents: what the lazy loader cached for the
    // last input is stale.
    forgetOnnxModels();
    return Path;
  }

private:
  SmallString<128> Dir, Path;
};

void checkUtf8(const Graph &G) {
  auto Check = [](StringRef What, StringRef S) {
    if (!isUtf8(S))
      invariantFailed(What + " '" + S + "' is not valid UTF-8");
  };
  Check("the graph name", G.name());
  for (auto Leaves : {G.inputs(), G.params(), G.consts(), G.states()})
    for (const auto &V : Leaves) {
      Check("a leaf name", V->name());
      if (V->data()) {
        Check("a data path", V->data()->ref().Path);
        Check("a data key", V->data()->ref().Key);
      }
    }
  for (const Node &N : G.nodes()) {
    Check("a node name", N.name());
    for (const auto &[Name, A] : N.attrs().entries()) {
      Check("an attribute name", Name);
      if (auto *S = std::get_if<std::string>(&A))
        Check("an attribute", *S);
    }
  }
  for (const Graph::Output &O : G.outputs())
    Check("an output name", O.Name);
}

/// What sp-opt prints of a valid graph reads back as a valid graph.
void checkRoundTrip(const Graph &G) {
  std::string Text = graphToString(G);
  auto Again = parseGraph(Text, "printed.sp");
  if (!Again)
    invariantFailed("the printed graph does not parse: " +
                    toString(Again.takeError()) + "\n" + Text);
  if (Error E = verifyGraph(**Again))
    invariantFailed("the printed graph does not verify: " +
                    toString(std::move(E)) + "\n" + Text);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  static ModelFile File;
  StringRef Path =
      File.write(StringRef(reinterpret_cast<const char *>(Data), Size));

  ImportOptions IO;
  IO.DimValues["batch"] = 2;
  IO.DimValues["seq"] = 8;
  auto G = importOnnx(Path, IO);
  if (!G) {
    // Only the prefix is ours: the rest of a message quotes the model.
    std::string Msg = messageOf(G.takeError());
    if (StringRef(Msg).startswith((Path + ": internal error: ").str()))
      invariantFailed("the importer made an invalid graph: " + Msg);
    return 0;
  }
  checkUtf8(**G);
  checkRoundTrip(**G);

  PassContext Ctx;
  CompileOptions CO;
  CO.Passes = "constant-fold,canonicalize,dce,detect-transformer,bind-inputs";
  CO.PassManager.VerifyEach = true;
  if (Error E = runPasses(**G, Ctx, CO)) {
    std::string Msg = messageOf(std::move(E));
    if (StringRef(Msg).startswith("after pass '"))
      invariantFailed("a pass made an invalid graph: " + Msg);
    return 0;
  }
  checkUtf8(**G);
  checkRoundTrip(**G);
  if (auto Info = summarizeModel(**G))
    // sp-compile --report; dump throws on a string that is not UTF-8.
    (void)modelInfoToJson(*Info).dump();
  else
    checkMessage(Info.takeError());
  return 0;
}
