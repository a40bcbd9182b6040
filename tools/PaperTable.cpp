//===- PaperTable.cpp - sp-compile --paper-table and --figure7 ------------===//
#include "tools/PaperTable.h"
#include "lower/Finalize.h"
#include "lower/LowerGraph.h"
#include "lower/MemoryPlan.h"
#include "lower/UnrollSchedule.h"
#include "reports/Charts.h"
#include "driver/Compile.h"
#include "reports/MemoryReport.h"
#include "tools/ToolSupport.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

using namespace llvm;

namespace sp {

/// One model of --paper-table: our bytes and Table 2's for each
/// configuration.
namespace {
struct PaperRow {
  std::string Name;
  int64_t Ours;
  double Formula;
};
struct PaperModel {
  std::string Name;
  ModelInfo Info;
  int T;
  std::vector<PaperRow> Rows;
};
} // namespace

static Expected<PaperModel> paperTable(StringRef Path, const ImportOptions &IO,
                                       const PassContext &Base) {
  auto Imported = loadGraph(Path, IO);
  if (!Imported)
    return Imported.takeError();
  PaperModel M;
  M.Name = sys::path::stem(Path).str();
  M.T = Base.TensorParallel > 1 ? Base.TensorParallel : 8;
  // The imported graph compiled with Base's options but these parallel ones
  // and fp16 accounting.
  auto Compile = [&](int T, bool SP, RecomputeMode R, bool Fused,
                     bool Pipelined, StringRef What,
                     int Context = 1) -> Expected<std::unique_ptr<Graph>> {
    std::unique_ptr<Graph> G = (*Imported)->clone();
    PassContext Ctx = Base;
    if (!Pipelined)
      Ctx.Pipeline = PipelineOptions(); // one layer, one microbatch
    Ctx.TensorParallel = T;
    Ctx.SequenceParallel = SP;
    Ctx.Recompute = RecomputeOptions();
    Ctx.Recompute.Mode = R;
    Ctx.FusedAttention = Fused;
    Ctx.ContextParallel = Context;
    Ctx.ActivationDtype = DType::F16;
    if (auto E = runPasses(*G, Ctx, CompileOptions()))
      return createStringError(inconvertibleErrorCode(), "%s (%s): %s",
                               Path.str().c_str(), What.str().c_str(),
                               toString(std::move(E)).c_str());
    return G;
  };
  for (const PaperConfig &C : paperConfigs()) {
    auto G =
        Compile(C.TensorParallel ? M.T : 1, C.SequenceParallel, C.Recompute,
                C.FusedAttention, /*Pipelined=*/false, C.Name, C.Context);
    if (!G)
      return G.takeError();
    auto Info = summarizeModel(**G);
    if (!Info)
      return Info.takeError();
    if (C.Context == 1) // (a cp graph's sequence is one rank's)
      M.Info = *Info;
    auto Prog = lowerGraph(**G, DType::F16);
    if (!Prog)
      return Prog.takeError();
    finalizeProgram(*Prog);
    ActivationReport R = analyzeActivations(*Prog);
    // (Under cp the graph's sequence is a rank's; the formula takes the
    // model's.)
    M.Rows.push_back({C.Name, R.layerBytes(R.middleLayer()),
                      table2Bytes(C, Info->Heads, Info->Seq * C.Context,
                                  Info->Batch, Info->Hidden, M.T)});
  }
  // With --pp: the whole first stage (Eq. 5 and 6), from rank 0's expanded
  // program alone.
  const PipelineOptions &PO = Base.Pipeline;
  if (PO.Stages < 2)
    return M;
  for (bool Selective : {false, true}) {
    auto G = Compile(M.T, /*SP=*/true,
                     Selective ? RecomputeMode::Selective : RecomputeMode::None,
                     /*Fused=*/false, /*Pipelined=*/true, "pipeline");
    if (!G)
      return G.takeError();
    auto S = buildSchedule(scheduleKind(PO.Schedule), PO.Stages,
                           PO.Interleave, PO.Microbatches);
    if (!S)
      return S.takeError();
    auto Compact = lowerPipelineRank(**G, DType::F16, computeSteps(*S), 0);
    if (!Compact)
      return Compact.takeError();
    finalizeProgram(*Compact);
    auto Prog = expandProgram(*Compact);
    if (!Prog)
      return Prog.takeError();
    ActivationReport R = analyzeActivations(*Prog);
    const ModelInfo &I = M.Info;
    double SBH = double(I.Seq) * I.Batch * I.Hidden, T = M.T,
           P = PO.Stages, Ms = PO.Interleave;
    double PerLayer = Selective ? 34 : 34 + 5.0 * I.Heads * I.Seq / I.Hidden;
    double Factor = Ms > 1 ? 1 + (P - 1) / (P * Ms) : 1;
    // Eq. 5/6, and the embedding dropout's 1-byte mask (s b h / t) for each
    // microbatch the first chunk holds: p in the paper, which assumes no
    // interleaving; the schedule's own count here.
    int FirstChunk = 0, Live = 0;
    for (const ScheduleStep &St : S->Steps[0])
      if (St.Chunk == 0 && St.Kind == StepKind::Forward)
        FirstChunk = std::max(FirstChunk, ++Live);
      else if (St.Chunk == 0 && S->endsMicrobatch(St))
        --Live;
    double Formula =
        SBH * I.Layers / T * PerLayer * Factor + SBH * FirstChunk / T;
    M.Rows.push_back({formatv("first stage, TP+SP{0}, p {1} m {2} (Eq. {3})",
                              Selective ? "+selective" : "", PO.Stages,
                              PO.Interleave, Selective ? 6 : 5)
                          .str(),
                      R.StoredPeakBytes, Formula});
  }
  return M;
}

/// The paper's Figure 7: for each model, each configuration's bytes as a
/// percentage of the tensor-parallel baseline; ours as bars, Table 2's as a
/// tick on each bar.
static Error writeFigure7(ArrayRef<PaperModel> Models, raw_ostream &OS) {
  BarChart C;
  C.Title = "Activation memory per layer, as a percentage of the "
            "tensor-parallel baseline";
  C.YLabel = "% of tensor parallel (t = " +
             std::to_string(Models.empty() ? 8 : Models[0].T) + ")";
  C.MarkerLabel = "Table 2";
  C.YMax = 100;
  C.Width = 900;
  for (size_t K = 1; K < paperConfigs().size(); ++K)
    C.Series.push_back(paperConfigs()[K].Short);
  for (const PaperModel &M : Models) {
    C.Groups.push_back(M.Name);
    std::vector<double> Ours, Paper;
    double Base = M.Rows[1].Ours, BaseF = M.Rows[1].Formula;
    for (size_t K = 1; K < paperConfigs().size(); ++K) {
      Ours.push_back(100 * double(M.Rows[K].Ours) / Base);
      Paper.push_back(100 * M.Rows[K].Formula / BaseF);
    }
    C.Values.push_back(std::move(Ours));
    C.Markers.push_back(std::move(Paper));
  }
  return writeBarChartSvg(OS, C);
}

Error runPaperTable(ArrayRef<std::string> Inputs, const ImportOptions &IO,
                    const PassContext &Base, StringRef Figure7,
                    StringRef Report, raw_ostream &Out) {
  std::vector<PaperModel> Models;
  nlohmann::json J = nlohmann::json::array();
  for (const std::string &Path : Inputs) {
    auto M = paperTable(Path, IO, Base);
    if (!M)
      return M.takeError();
    const ModelInfo &I = M->Info;
    Out << formatv("{0}: a {1}, s {2}, b {3}, h {4}, L {5}, t {6}; "
                      "activation bytes of layer {7} per rank, fp16 "
                      "activations and 1-byte masks\n",
                      M->Name, I.Heads, I.Seq, I.Batch, I.Hidden, I.Layers,
                      M->T, I.Layers / 2);
    Out << formatv("  {0,-50} {1,16} {2,16} {3,9}\n", "configuration",
                      "ours", "Table 2", "diff");
    nlohmann::json Rows = nlohmann::json::array();
    for (const PaperRow &R : M->Rows) {
      double Diff = R.Ours / R.Formula - 1;
      Out << formatv("  {0,-50} {1,16} {2,16:F0} {3,8:F3}%\n", R.Name,
                        R.Ours, R.Formula, 100 * Diff);
      Rows.push_back({{"configuration", R.Name},
                      {"bytes", R.Ours},
                      {"table2_bytes", R.Formula},
                      {"relative_difference", Diff}});
    }
    J.push_back({{"model", M->Name},
                 {"heads", I.Heads},
                 {"seq", I.Seq},
                 {"batch", I.Batch},
                 {"hidden", I.Hidden},
                 {"layers", I.Layers},
                 {"tp", M->T},
                 {"rows", Rows}});
    Models.push_back(std::move(*M));
  }
  Out << "the residual is the LayerNorm statistics (mean and 1/std, f32, "
            "per row), which Table 2 ignores\n";
  if (!Figure7.empty()) {
    std::string Svg;
    raw_string_ostream SvgOS(Svg);
    if (auto E = writeFigure7(Models, SvgOS))
      return E;
    if (auto E = writeFileAtomically(Figure7, [&](raw_ostream &OS) {
          OS << SvgOS.str();
        }))
      return E;
  }
  if (!Report.empty())
    return writeFileAtomically(Report, [&](raw_ostream &OS) {
      OS << nlohmann::json({{"paper_table", J}}).dump(2) << "\n";
    });
  return Error::success();
}

} // namespace sp
