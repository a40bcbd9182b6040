//===- PassManager.cpp ----------------------------------------------------===//
#include "passes/PassManager.h"
#include "ir/AsmFormat.h"
#include "ir/Verifier.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include <chrono>
#include <optional>

using namespace llvm;

namespace sp {

namespace {
struct CLOptions {
  cl::OptionCategory Cat{"Pass manager options"};
  cl::opt<std::string> Passes{
      "passes", cl::desc("Comma-separated pass pipeline (see --list-passes)"),
      cl::value_desc("a,b,c"), cl::cat(Cat)};
  cl::opt<bool> PrintAfterAll{"print-after-all",
                              cl::desc("Print the IR after every pass"),
                              cl::cat(Cat)};
  cl::list<std::string> PrintAfter{
      "print-after", cl::desc("Print the IR after the named pass"),
      cl::value_desc("pass"), cl::CommaSeparated, cl::cat(Cat)};
  cl::opt<std::string> DumpDir{
      "dump-dir", cl::desc("Write the IR after every pass to DIR/NN-pass.sp"),
      cl::value_desc("dir"), cl::cat(Cat)};
  cl::opt<bool> VerifyEach{"verify-each",
                           cl::desc("Run the verifier after every pass"),
                           cl::cat(Cat)};
  cl::opt<bool> TimePasses{"time-passes",
                           cl::desc("Report the time taken by each pass"),
                           cl::cat(Cat)};
  cl::opt<bool> Remarks{"remarks",
                        cl::desc("Print to stderr what each pass did or "
                                 "left alone (cores fused or not and why, "
                                 "nodes folded or erased, inputs bound)"),
                        cl::cat(Cat)};
  cl::list<std::string> InputBindings{
      "input",
      cl::desc("What a graph input is, where the model's structure cannot "
               "tell (bind-inputs): ROLE is tokens, positions, mask or "
               "token_types"),
      cl::value_desc("NAME=ROLE"), cl::cat(Cat)};
  cl::opt<int> TP{"tp", cl::desc("Tensor-parallel size T (tensor-parallel pass)"),
                  cl::value_desc("T"), cl::init(1), cl::cat(Cat)};
  cl::opt<int> DP{"dp",
                  cl::desc("Data-parallel replicas D (data-parallel pass): "
                           "the grid is D x P x T ranks, each replica "
                           "training on its own rows of the step's batch"),
                  cl::value_desc("D"), cl::init(1), cl::cat(Cat)};
  cl::opt<int> CP{
      "cp",
      cl::desc("Context-parallel size C (context-parallel pass): every "
               "activation holds 1/C of the sequence, and attention passes "
               "keys and values around the C ranks; the grid is D x P x C x "
               "T ranks"),
      cl::value_desc("C"), cl::init(1), cl::cat(Cat)};
  cl::opt<std::string> CPComm{
      "cp-comm",
      cl::desc("With --cp: how attention gets the other ranks' keys and "
               "values: ring (point to point, each block's transfer "
               "overlapping the previous block's attention; the default) or "
               "a2a (all-to-all, DeepSpeed-Ulysses: heads traded for "
               "positions; C must divide the heads and key/value heads of a "
               "tensor-parallel rank) or a2a+ring (hierarchical: the "
               "all-to-all inside groups of --cp-a2a K consecutive ranks, "
               "one node's, and the ring across the C / K groups)"),
      cl::value_desc("ring|a2a|a2a+ring"), cl::init("ring"), cl::cat(Cat)};
  cl::opt<int> CPA2a{
      "cp-a2a",
      cl::desc("With --cp-comm a2a+ring: the size K of the all-to-all groups "
               "(K consecutive context-parallel ranks; 1 < K < C, K divides "
               "C and the heads and key/value heads of a tensor-parallel "
               "rank)"),
      cl::value_desc("K"), cl::init(1), cl::cat(Cat)};
  cl::opt<std::string> DPBucket{
      "dp-bucket",
      cl::desc("With --dp: the largest gradient bucket summed over the "
               "replicas by one all-reduce, in bytes (suffixes as "
               "--memory-budget; default 25MiB)"),
      cl::value_desc("bytes"), cl::cat(Cat)};
  cl::opt<int> Zero{
      "zero",
      cl::desc("With --dp: ZeRO stage. 1 shards the AdamW moments over the "
               "replicas (gradients reduce-scattered, each rank updating its "
               "chunk of every parameter, the chunks all-gathered); 0 keeps "
               "them whole on every rank (default)"),
      cl::value_desc("0|1"), cl::init(0), cl::cat(Cat)};
  cl::opt<bool> SP{"sp",
                   cl::desc("Sequence parallelism in the LayerNorm and dropout "
                            "regions (needs --tp T > 1)"),
                   cl::cat(Cat)};
  cl::opt<bool> TpCommOverlap{
      "tp-comm-overlap",
      cl::desc("With --sp: cut each forward all-gather feeding a linear into "
               "a ring of T chunk shifts and T chunk GEMMs, so a GPU sends "
               "the next chunk while it multiplies this one "
               "(collective-matmul pass)"),
      cl::cat(Cat)};
  enum class Attention { Unfused, Fused };
  cl::opt<Attention> FusedAttention{
      "attention",
      cl::desc("The attention core: unfused (the paper's ops, each stored "
               "or recomputed) or fused (one blockwise op storing q, k, v, "
               "its output and a log-sum-exp per row; fuse-attention pass)"),
      cl::values(clEnumValN(Attention::Unfused, "unfused",
                            "the paper's ops"),
                 clEnumValN(Attention::Fused, "fused",
                            "one attention op, no [s, s] tensor stored (default)")),
      cl::init(Attention::Fused), cl::cat(Cat)};
  cl::opt<RecomputeMode> Recompute{
      "recompute", cl::desc("Activation recomputation (recompute pass)"),
      cl::values(
          clEnumValN(RecomputeMode::None, "none", "store every saved value"),
          clEnumValN(RecomputeMode::Selective, "selective",
                     "recompute the attention core (QK^T, scale, mask, "
                     "softmax, dropout) from the stored Q, K and V"),
          clEnumValN(RecomputeMode::Full, "full",
                     "store only the input of every --recompute-layers "
                     "layers"),
          clEnumValN(RecomputeMode::Auto, "auto",
                     "the least extra FLOPs that fit --memory-budget")),
      cl::init(RecomputeMode::None), cl::cat(Cat)};
  cl::opt<int> RecomputeLayers{
      "recompute-layers",
      cl::desc("With --recompute full: checkpoint every K layers"),
      cl::value_desc("K"), cl::init(1), cl::cat(Cat)};
  cl::opt<std::string> MemoryBudget{
      "memory-budget",
      cl::desc("With --recompute auto or --schedule zb1p: the largest "
               "planned peak per rank, in bytes (suffixes K, M, G, T, KiB, "
               "MiB, GiB, TiB)"),
      cl::value_desc("bytes"), cl::cat(Cat)};
  cl::opt<int> PP{"pp", cl::desc("Pipeline-parallel stages P (pipeline pass)"),
                  cl::value_desc("P"), cl::init(1), cl::cat(Cat)};
  cl::opt<int> Interleave{
      "interleave",
      cl::desc("Model chunks (virtual stages) per pipeline rank M; M > 1 uses "
               "the interleaved 1F1B schedule"),
      cl::value_desc("M"), cl::init(1), cl::cat(Cat)};
  cl::opt<int> Microbatches{
      "microbatches",
      cl::desc("Microbatches per step N (the model's batch is the microbatch; "
               "gradients accumulate over N)"),
      cl::value_desc("N"), cl::init(1), cl::cat(Cat)};
  cl::opt<PipelineSchedule> Schedule{
      "schedule", cl::desc("Pipeline schedule"),
      cl::values(clEnumValN(PipelineSchedule::GPipe, "gpipe",
                            "all forwards, then all backwards (reference)"),
                 clEnumValN(PipelineSchedule::OneFOneB, "1f1b",
                            "one forward, one backward (default)"),
                 clEnumValN(PipelineSchedule::Interleaved, "interleaved",
                            "interleaved 1F1B over --interleave chunks "
                            "(default when M > 1)"),
                 clEnumValN(PipelineSchedule::ZeroBubbleH1, "zb1p",
                            "zero-bubble ZB-H1: 1F1B with each backward "
                            "split into input and weight gradients, the "
                            "latter filling the bubble")),
      cl::init(PipelineSchedule::OneFOneB), cl::cat(Cat)};
  cl::opt<std::string> Partition{
      "pp-partition",
      cl::desc("How layers are split over the stages: balanced (a cost "
               "model, default) or uniform"),
      cl::value_desc("balanced|uniform"), cl::init("balanced"), cl::cat(Cat)};
};
CLOptions *CL = nullptr;

/// "123", "1.5GiB", "800M" -> bytes.
std::optional<int64_t> parseBytes(StringRef S) {
  S = S.trim();
  size_t End = S.find_first_not_of("0123456789.eE+");
  StringRef Num = S.substr(0, End), Unit = S.substr(std::min(End, S.size()));
  double V;
  if (Num.empty() || Num.getAsDouble(V) || V < 0)
    return std::nullopt;
  Unit = Unit.trim();
  static const std::pair<const char *, double> Units[] = {
      {"", 1},         {"B", 1},           {"K", 1e3},         {"KB", 1e3},
      {"M", 1e6},      {"MB", 1e6},        {"G", 1e9},         {"GB", 1e9},
      {"T", 1e12},     {"TB", 1e12},       {"KiB", 1024.0},    {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (auto &[Name, Scale] : Units)
    if (Unit == Name)
      return int64_t(V * Scale);
  return std::nullopt;
}

} // namespace

Expected<int64_t> byteFlag(StringRef Flag, const std::string &Value,
                           StringRef Examples) {
  auto B = parseBytes(Value);
  if (!B || *B <= 0)
    return createStringError(inconvertibleErrorCode(),
                             "%s: '%s' is not a byte count (use e.g. %s)",
                             Flag.str().c_str(), Value.c_str(),
                             Examples.str().c_str());
  return *B;
}

cl::OptionCategory &registerPassManagerCLOptions() {
  static CLOptions Options;
  CL = &Options;
  return Options.Cat;
}

PassManagerOptions passManagerOptionsFromCL() {
  assert(CL && "call registerPassManagerCLOptions first");
  PassManagerOptions O;
  O.PrintAfterAll = CL->PrintAfterAll;
  O.PrintAfter.assign(CL->PrintAfter.begin(), CL->PrintAfter.end());
  O.DumpDir = CL->DumpDir;
  O.VerifyEach = CL->VerifyEach;
  O.TimePasses = CL->TimePasses;
  return O;
}

std::string passesFromCL(StringRef Default) {
  assert(CL && "call registerPassManagerCLOptions first");
  return CL->Passes.getNumOccurrences() ? CL->Passes.getValue()
                                        : Default.str();
}

Error passOptionsFromCL(PassContext &Ctx) {
  assert(CL && "call registerPassManagerCLOptions first");
  if (CL->TP < 1)
    return createStringError(inconvertibleErrorCode(),
                             "--tp must be a positive integer, got %d",
                             CL->TP.getValue());
  if (CL->SP && CL->TP == 1)
    return createStringError(inconvertibleErrorCode(),
                             "--sp shards the LayerNorm and dropout regions "
                             "over the tensor-parallel group; it needs --tp "
                             "T with T > 1");
  if (CL->TpCommOverlap && !CL->SP)
    return createStringError(inconvertibleErrorCode(),
                             "--tp-comm-overlap cuts sequence parallelism's "
                             "forward all-gathers into a ring; it needs --sp "
                             "(and --tp T with T > 1), which --auto does not "
                             "take");
  if (CL->DP < 1)
    return createStringError(inconvertibleErrorCode(),
                             "--dp must be a positive integer, got %d",
                             CL->DP.getValue());
  if (CL->CP < 1)
    return createStringError(inconvertibleErrorCode(),
                             "--cp must be a positive integer, got %d",
                             CL->CP.getValue());
  if (CL->CPComm.getNumOccurrences() && CL->CP == 1)
    return createStringError(inconvertibleErrorCode(),
                             "--cp-comm chooses how context-parallel ranks "
                             "exchange keys and values; it needs --cp C with "
                             "C > 1");
  if (CL->CPComm != "ring" && CL->CPComm != "a2a" && CL->CPComm != "a2a+ring")
    return createStringError(inconvertibleErrorCode(),
                             "--cp-comm '%s': expected ring, a2a or a2a+ring",
                             CL->CPComm.getValue().c_str());
  const bool Hierarchical = CL->CPComm == "a2a+ring";
  if (CL->CPA2a.getNumOccurrences() && !Hierarchical)
    return createStringError(inconvertibleErrorCode(),
                             "--cp-a2a sizes the all-to-all groups of the "
                             "hierarchical --cp-comm a2a+ring; pass that too "
                             "(or drop --cp-a2a)");
  if (Hierarchical && !CL->CPA2a.getNumOccurrences())
    return createStringError(inconvertibleErrorCode(),
                             "--cp-comm a2a+ring needs --cp-a2a K, the size "
                             "of its all-to-all groups (K consecutive "
                             "context-parallel ranks, e.g. one node's)");
  // Gradients are summed over the data-parallel x context-parallel ranks.
  const int GradRanks = CL->DP * CL->CP;
  if (CL->DPBucket.getNumOccurrences()) {
    if (GradRanks == 1)
      return createStringError(inconvertibleErrorCode(),
                               "--dp-bucket sizes the data-parallel gradient "
                               "sums; it needs --dp D or --cp C above 1");
    auto B = byteFlag("--dp-bucket", CL->DPBucket, "1000000, 25MiB");
    if (!B)
      return B.takeError();
    Ctx.DataParallelBucketBytes = *B;
  }
  if (CL->Zero != 0 && CL->Zero != 1)
    return createStringError(inconvertibleErrorCode(),
                             "--zero must be 0 or 1 (ZeRO stage 1: the "
                             "optimizer state sharded over the replicas), "
                             "got %d",
                             CL->Zero.getValue());
  if (CL->Zero && GradRanks == 1)
    return createStringError(inconvertibleErrorCode(),
                             "--zero 1 shards the optimizer state over the "
                             "data-parallel (and context-parallel) ranks; it "
                             "needs --dp D or --cp C above 1");
  Ctx.Zero = CL->Zero;
  Ctx.TensorParallel = CL->TP;
  Ctx.DataParallel = CL->DP;
  Ctx.ContextParallel = CL->CP;
  Ctx.ContextComm = CL->CPComm;
  Ctx.ContextAllToAll = CL->CPA2a;
  Ctx.SequenceParallel = CL->SP;
  Ctx.TpCommOverlap = CL->TpCommOverlap;
  Ctx.FusedAttention = CL->FusedAttention == CLOptions::Attention::Fused;
  if (CL->Remarks)
    Ctx.Remarks = &errs();
  for (StringRef B : CL->InputBindings) {
    auto [Name, RoleName] = B.split('=');
    auto Role = parseInputRole(RoleName);
    if (Name.empty() || !Role ||
        !isModelInputRole(*Role))
      return createStringError(inconvertibleErrorCode(),
                               "--input '%s': expected NAME=ROLE with ROLE "
                               "tokens, positions, mask or token_types",
                               B.str().c_str());
    Ctx.InputBindings.push_back({Name.str(), *Role});
  }
  RecomputeOptions &R = Ctx.Recompute;
  R.Mode = CL->Recompute;
  if (CL->RecomputeLayers < 1)
    return createStringError(inconvertibleErrorCode(),
                             "--recompute-layers must be a positive integer, "
                             "got %d",
                             CL->RecomputeLayers.getValue());
  if (CL->RecomputeLayers.getNumOccurrences() &&
      R.Mode != RecomputeMode::Full)
    return createStringError(inconvertibleErrorCode(),
                             "--recompute-layers K needs --recompute full");
  R.Layers = CL->RecomputeLayers;
  if (R.Mode == RecomputeMode::Selective && Ctx.FusedAttention)
    errs() << "note: --recompute selective recomputes the paper's attention "
              "core, which the fused core (--attention fused, the default) "
              "does not store: nothing is recomputed; use --attention "
              "unfused for the paper's selective recomputation\n";
  bool HasBudget = CL->MemoryBudget.getNumOccurrences();
  if (R.Mode == RecomputeMode::Auto && !HasBudget)
    return createStringError(inconvertibleErrorCode(),
                             "--recompute auto needs --memory-budget BYTES");
  bool ZeroBubble = CL->Schedule.getNumOccurrences() &&
                    CL->Schedule.getValue() == PipelineSchedule::ZeroBubbleH1;
  if (HasBudget && R.Mode != RecomputeMode::Auto && !ZeroBubble)
    return createStringError(inconvertibleErrorCode(),
                             "--memory-budget needs --recompute auto or "
                             "--schedule zb1p");
  if (HasBudget) {
    auto B = byteFlag("--memory-budget", CL->MemoryBudget,
                      "6000000, 512MiB or 80GB");
    if (!B)
      return B.takeError();
    R.MemoryBudget = *B;
  }
  PipelineOptions &PO = Ctx.Pipeline;
  for (auto [Flag, Value] : {std::pair<const char *, int>{"--pp", CL->PP},
                             {"--interleave", CL->Interleave},
                             {"--microbatches", CL->Microbatches}})
    if (Value < 1)
      return createStringError(inconvertibleErrorCode(),
                               "%s must be a positive integer, got %d", Flag,
                               Value);
  PO.Stages = CL->PP;
  PO.Interleave = CL->Interleave;
  PO.Microbatches = CL->Microbatches;
  PO.Schedule = CL->Schedule.getNumOccurrences()
                    ? CL->Schedule.getValue()
                    : (PO.Interleave > 1 ? PipelineSchedule::Interleaved
                                         : PipelineSchedule::OneFOneB);
  if (CL->Partition != "balanced" && CL->Partition != "uniform")
    return createStringError(inconvertibleErrorCode(),
                             "--pp-partition must be balanced or uniform, got "
                             "'%s'",
                             CL->Partition.c_str());
  PO.Uniform = CL->Partition == "uniform";
  if (PO.Interleave > 1 && PO.Schedule != PipelineSchedule::Interleaved)
    return createStringError(inconvertibleErrorCode(),
                             "--interleave %d needs --schedule interleaved",
                             PO.Interleave);
  if (PO.Schedule == PipelineSchedule::Interleaved) {
    if (PO.Interleave < 2 || PO.Stages < 2)
      return createStringError(
          inconvertibleErrorCode(),
          "--schedule interleaved needs --pp P > 1 and --interleave M > 1 "
          "(got P %d, M %d)",
          PO.Stages, PO.Interleave);
    if (PO.Microbatches % PO.Stages)
      return createStringError(
          inconvertibleErrorCode(),
          "the interleaved schedule needs --microbatches to be a multiple of "
          "--pp %d, got %d; use %d, for example",
          PO.Stages, PO.Microbatches,
          (PO.Microbatches / PO.Stages + 1) * PO.Stages);
  }
  return Error::success();
}

Error PassManager::addPasses(StringRef Pipeline) {
  SmallVector<StringRef, 8> Names;
  Pipeline.split(Names, ',', -1, /*KeepEmpty=*/false);
  for (StringRef Name : Names) {
    Name = Name.trim();
    const PassInfo *Info = lookupPass(Name);
    if (!Info) {
      std::string Known;
      for (const PassInfo &P : registeredPasses())
        Known += (Known.empty() ? "" : ", ") + std::string(P.Name);
      return createStringError(inconvertibleErrorCode(),
                               "unknown pass '%s' in --passes; known passes: "
                               "%s",
                               Name.str().c_str(), Known.c_str());
    }
    addPass(Info->Create());
  }
  for (const std::string &P : Opts.PrintAfter)
    if (!lookupPass(P))
      return createStringError(inconvertibleErrorCode(),
                               "unknown pass '%s' in --print-after",
                               P.c_str());
  return Error::success();
}

static Error writeDump(StringRef Dir, unsigned Index, StringRef Name,
                       const Graph &G) {
  SmallString<128> Path(Dir);
  sys::path::append(Path, (Index < 10 ? "0" : "") + Twine(Index) + "-" +
                              Name + ".sp");
  std::string File = std::string(Path);
  std::error_code EC;
  raw_fd_ostream OS(File, EC);
  if (EC)
    return createStringError(EC, "cannot write '%s': %s", File.c_str(),
                             EC.message().c_str());
  printGraph(G, OS);
  return Error::success();
}

Error PassManager::run(Graph &G, PassContext &Ctx) {
  using Clock = std::chrono::steady_clock;
  if (!Opts.DumpDir.empty()) {
    if (std::error_code EC = sys::fs::create_directories(Opts.DumpDir))
      return createStringError(EC, "cannot create --dump-dir '%s': %s",
                               Opts.DumpDir.c_str(), EC.message().c_str());
    if (auto E = writeDump(Opts.DumpDir, 0, "input", G))
      return E;
  }
  std::vector<std::pair<std::string, double>> Times;
  unsigned Index = 0;
  for (const auto &P : Passes) {
    ++Index;
    auto Start = Clock::now();
    Error E = P->run(G, Ctx);
    Times.push_back(
        {P->name().str(),
         std::chrono::duration<double>(Clock::now() - Start).count()});
    if (E)
      return createStringError(inconvertibleErrorCode(), "%s: %s",
                               P->name().str().c_str(),
                               toString(std::move(E)).c_str());
#ifndef NDEBUG
    bool Verify = true;
#else
    bool Verify = Opts.VerifyEach;
#endif
    if (Verify)
      if (Error VE = verifyGraph(G))
        return createStringError(inconvertibleErrorCode(),
                                 "after pass '%s': %s",
                                 P->name().str().c_str(),
                                 toString(std::move(VE)).c_str());
    if (Opts.PrintAfterAll || is_contained(Opts.PrintAfter, P->name())) {
      *Opts.PrintStream << "// ----- IR after " << P->name() << " ----- //\n";
      printGraph(G, *Opts.PrintStream);
    }
    if (!Opts.DumpDir.empty())
      if (auto DE = writeDump(Opts.DumpDir, Index, P->name(), G))
        return DE;
  }
  if (Opts.TimePasses) {
    double Total = 0;
    for (auto &T : Times)
      Total += T.second;
    raw_ostream &OS = errs();
    OS << "===-------------------------------------------------------===\n"
       << "                      Pass execution time\n"
       << "===-------------------------------------------------------===\n";
    OS << formatv("  Total: {0:F4} s\n", Total);
    OS << "   Wall time (s)   (%)  Name\n";
    for (auto &T : Times)
      OS << formatv("  {0,12:F4}  {1,5:F1}  {2}\n", T.second,
                    Total > 0 ? 100 * T.second / Total : 0.0, T.first);
  }
  return Error::success();
}

} // namespace sp
