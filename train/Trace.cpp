//===- Trace.cpp - A run's Chrome trace of every rank's instructions -----===//
//
// --trace: every instruction every rank ran in the training steps, as
// complete events of a Chrome trace (chrome://tracing, Perfetto), one
// process per rank with a compute and a communication row; the ranks'
// events are gathered on rank 0, which writes the file.
//
//===----------------------------------------------------------------------===//
#include "train/Agreement.h"
#include "train/RankRun.h"
#include "plan/AtomicFile.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace sp {

/// This rank's instructions as Chrome trace events (complete events, one
/// process per rank).
static nlohmann::json traceEvents(const Executor &E, int Rank, int TP) {
  nlohmann::json Events = nlohmann::json::array();
  std::string Name = formatv("rank {0} (stage {1}, tensor-parallel rank {2})",
                             Rank, Rank / TP, Rank % TP)
                         .str();
  Events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", Rank},
                    {"args", {{"name", Name}}}});
  Events.push_back({{"name", "process_sort_index"},
                    {"ph", "M"},
                    {"pid", Rank},
                    {"args", {{"sort_index", Rank}}}});
  // Two rows per rank: computation, and communication (the CUDA backend's
  // two streams; the CPU backend runs both rows' calls one after another).
  for (int Tid : {0, 1})
    Events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", Rank},
                      {"tid", Tid},
                      {"args", {{"name", Tid ? "communication" : "compute"}}}});
  const Program &P = E.program();
  for (const TraceEvent &T : E.trace()) {
    const Instruction &I = P.Instrs[T.Instruction];
    bool Comm = isCommunicationOp(I.Op);
    std::string Label = opName(I.Op).str();
    if (I.Role != Role::None)
      Label += " " + roleName(I.Role).str();
    nlohmann::json Args = {{"instruction", T.Instruction},
                           {"step", T.Step},
                           {"phase", phaseName(I.Ph).str()}};
    if (I.Layer >= 0)
      Args["layer"] = I.Layer;
    if (T.ScheduleStep >= 0) {
      // A compact program's step: its template's instruction I on the
      // step's microbatch.
      Args["schedule_step"] = T.ScheduleStep;
      if (int Mb = P.Steps[T.ScheduleStep].Microbatch; Mb >= 0)
        Args["microbatch"] = Mb;
    } else if (I.Attrs.has("microbatch")) {
      Args["microbatch"] = I.Attrs.getInt("microbatch", 0);
    }
    if (I.Beside >= 0) {
      // The GEMM the plan runs this collective beside (lower/Overlap.h).
      const Instruction &G = P.Instrs[I.Beside];
      Args["beside"] = formatv("{0} {1} (instruction {2})", opName(G.Op),
                               roleName(G.Role), I.Beside)
                           .str();
    }
    Events.push_back({{"name", Label},
                      {"cat", Comm ? "communication" : phaseName(I.Ph).str()},
                      {"ph", "X"},
                      {"ts", T.StartUs},
                      {"dur", T.DurationUs},
                      {"pid", Rank},
                      {"tid", T.Stream >= 0 ? T.Stream : Comm ? 1 : 0},
                      {"args", Args}});
  }
  return Events;
}

Error writeTrace(StringRef Path, Communicator *World, const Executor &E,
                 int TP) {
  int Rank = World ? World->rank() : 0;
  constexpr int Tag = 32000;
  auto Texts = gatherOnRankZero(World, traceEvents(E, Rank, TP).dump(), Tag);
  if (!Texts)
    return Texts.takeError();
  if (Rank != 0)
    return Error::success();
  nlohmann::json All = nlohmann::json::array();
  for (const std::string &Text : *Texts)
    for (auto &Ev : nlohmann::json::parse(Text))
      All.push_back(std::move(Ev));
  nlohmann::json Trace = {{"traceEvents", All}, {"displayTimeUnit", "ms"}};
  std::string Text = Trace.dump() + "\n";
  return writeFileAtomically(Path, [&](raw_ostream &OS) { OS << Text; });
}

} // namespace sp
