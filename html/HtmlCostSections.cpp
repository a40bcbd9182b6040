//===- HtmlCostSections.cpp - The plan's cost sections of the page ----------===//
//
// The collectives per layer, the pipeline and its Gantt chart, the FLOPs,
// the cost model's estimate and the layout search.
//
//===----------------------------------------------------------------------===//
#include "html/HtmlParts.h"
#include "plan/AtomicFile.h"
#include "support/Format.h"
#include "support/Xml.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include <algorithm>
#include <cmath>

using namespace llvm;
using json = nlohmann::json;

namespace sp {
namespace html {

Section collectivesSection(const ReportPage &P) {
  const json *C = get(&P.Facts, "collectives");
  auto T = integer(get(&P.Facts, "parallel", "tp"));
  std::string H = formatv("<p>Bytes one rank sends per microbatch, ring "
                          "algorithms{0}. Regather is communication "
                          "recomputation: the backward all-gathers that "
                          "rebuild a saved sequence shard.</p>\n",
                          T ? formatv(", t = {0}", *T).str() : "")
                      .str();
  const json *Layers = array(get(C, "per_layer"));
  if (!Layers) {
    H += "<p class=\"note\">The facts hold no collective report.</p>\n";
    return {"collectives", "Collectives", H};
  }
  double Max = 0;
  for (const json &L : *Layers)
    Max = std::max(Max, num(get(&L, "forward_bytes")).value_or(0) +
                            num(get(&L, "backward_bytes")).value_or(0) +
                            num(get(&L, "regather_bytes")).value_or(0));
  Table Tab({"layer", "forward", "backward", "regather", "beside a GEMM",
             "total", ""},
            /*Sortable=*/true);
  for (const json &L : *Layers) {
    auto Index = integer(get(&L, "layer"));
    if (!Index)
      continue;
    double Fw = num(get(&L, "forward_bytes")).value_or(0),
           Bw = num(get(&L, "backward_bytes")).value_or(0),
           Rg = num(get(&L, "regather_bytes")).value_or(0),
           Ov = num(get(&L, "overlapped_bytes")).value_or(0);
    Tab.row({label(double(*Index),
                   *Index < 0 ? "outside the layers <span class=\"note\">"
                                "(embedding, head, gradient sums)</span>"
                              : "layer " + std::to_string(*Index)),
             bytes(Fw), bytes(Bw), bytes(Rg), bytes(Ov), bytes(Fw + Bw + Rg),
             html(bar(
                 Fw + Bw + Rg, Max, std::nullopt, CommColour,
                 formatv("layer {0}: {1} sent", *Index, bytesText(Fw + Bw + Rg))
                     .str()))});
  }
  double TF = num(get(C, "total_forward_bytes")).value_or(0),
         TB = num(get(C, "total_backward_bytes")).value_or(0),
         TR = num(get(C, "total_regather_bytes")).value_or(0),
         TO = num(get(C, "total_overlapped_bytes")).value_or(0);
  Tab.footer({text("all"), bytes(TF), bytes(TB), bytes(TR), bytes(TO),
              bytes(TF + TB + TR), text("")});
  H += Tab.str();
  std::string Calls = str(get(&P.Facts, "collective_calls"));
  if (!Calls.empty())
    H += "<details><summary>Each call of rank 0's program</summary><pre>" +
         esc(Calls) + "</pre></details>\n";
  return {"collectives", "Collectives", H};
}

Section pipelineSection(const ReportPage &P) {
  const json &F = P.Facts;
  const json *Par = get(&F, "parallel"), *Bubble = get(&F, "bubble"),
             *Mem = get(&F, "memory");
  Facts T;
  T.addText("schedule", str(get(Bubble, "schedule")).empty()
                            ? str(get(&F, "schedule"))
                            : str(get(Bubble, "schedule")));
  T.add("pipeline ranks p", optCount(get(Par, "pp")));
  T.add("model chunks per rank", optCount(get(Par, "interleave")));
  T.add("microbatches per step", optCount(get(Par, "microbatches")));
  if (auto S = num(get(Bubble, "simulated")))
    T.add("bubble (simulated)", esc(percentText(*S)),
          "of the ideal time, from each stage's GEMM work");
  if (auto O = num(get(Bubble, "one_f_one_b")))
    T.add("1F1B's (p - 1) / N", esc(percentText(*O)));
  T.add("microbatch-chunks in flight on the first stage",
        optCount(get(Mem, "microbatches_in_flight")));
  std::string H = T.str();
  const json *Arena = array(get(Mem, "stage_arena_bytes")),
             *Stored = array(get(Mem, "stage_activation_bytes"));
  if (Arena) {
    double Max = 0;
    for (const json &B : *Arena)
      Max = std::max(Max, num(&B).value_or(0));
    Table Tab({"pipeline rank", "arena", "stored activations (whole step)", ""},
              /*Sortable=*/true);
    for (size_t K = 0; K < Arena->size(); ++K) {
      auto A = num(&(*Arena)[K]);
      if (!A)
        continue;
      auto S = Stored && K < Stored->size() ? num(&(*Stored)[K]) : std::nullopt;
      Tab.row(
          {label(double(K), "rank " + std::to_string(K)), bytes(*A),
           S ? bytes(*S) : none(),
           html(bar(*A, Max, std::nullopt, PlanColour,
                    formatv("rank {0}: arena {1}", K, bytesText(*A)).str()))});
    }
    H += "<h3>Memory by pipeline rank</h3>" + Tab.str();
  }
  if (!P.Schedule.empty())
    H += "<h3>Schedule</h3>" +
         figure(P.Schedule, "chart-schedule", "pipeline schedule");
  else
    H += "<p class=\"note\">No schedule chart: the plan directory holds no "
         "schedule.svg.</p>\n";
  return {"pipeline", "Pipeline", H};
}

Section flopsSection(const ReportPage &P) {
  const json *Fl = get(&P.Facts, "flops");
  Facts T;
  auto Model = num(get(Fl, "model_flops_per_iteration"));
  auto Add = [&](StringRef Label, const json *J, StringRef Note = "") {
    if (auto V = num(J))
      T.add(
          Label,
          esc(siText(*V, "FLOP")) +
              formatv(" <span class=\"note\">({0})</span>", cformat("%.4e", *V))
                  .str(),
          Note);
  };
  Add("model FLOPs per iteration", get(Fl, "model_flops_per_iteration"),
      "forward and backward");
  Add("hardware FLOPs per iteration", get(Fl, "hardware_flops_per_iteration"),
      "with recomputation");
  if (auto R = num(get(Fl, "recompute_flops_per_iteration")))
    T.add("recompute FLOPs per iteration", esc(siText(*R, "FLOP")),
          num(get(Fl, "recompute_overhead"))
              ? "+" + percentText(*num(get(Fl, "recompute_overhead")), 2) +
                    " over the model FLOPs"
              : "");
  if (auto Paper = num(get(Fl, "paper_model_flops_per_iteration")))
    T.add("the paper's 72 B L s h\u00b2 (1 + s/6h + v/12hL)",
          esc(siText(*Paper, "FLOP")),
          Model && *Paper > 0
              ? "the plan is " + diffText(100 * (*Model / *Paper - 1)) +
                    " from it"
              : "");
  if (auto S = num(get(Fl, "paper_selective_overhead")))
    T.add("the paper's selective-recompute overhead s/6h",
          esc(percentText(*S, 2)));
  std::string H = T.str();
  if (const json *G = get(&P.Facts, "gemm_flops_per_rank")) {
    Table Tab({"GEMM FLOPs per rank, one microbatch", "FLOP", ""});
    double Fw = num(get(G, "forward")).value_or(0),
           Bw = num(get(G, "backward")).value_or(0),
           Rc = num(get(G, "recompute")).value_or(0);
    double Max = std::max({Fw, Bw, Rc});
    for (auto [Label, V] :
         {std::pair{"forward", Fw}, {"backward", Bw}, {"recompute", Rc}})
      Tab.row({text(Label), number(V, siText(V, "FLOP")),
               html(bar(V, Max, std::nullopt, PlanColour,
                        std::string(Label) + ": " + siText(V, "FLOP")))});
    H += Tab.str();
  }
  std::string Counted = str(get(Fl, "counted"));
  if (!Counted.empty())
    H += "<p class=\"note\">Counted: " + esc(Counted) + ".</p>\n";
  if (H.empty())
    H = "<p class=\"note\">The facts hold no FLOP report.</p>\n";
  return {"flops", "FLOPs", H};
}

Section estimateSection(const json &E) {
  Facts T;
  T.addText("cluster", str(get(&E, "cluster")));
  T.add("GPUs", optCount(get(&E, "gpus")));
  auto Sec = [&](StringRef Label, StringRef Key, StringRef Note = "") {
    if (auto V = num(get(&E, Key)))
      T.add(Label, esc(humanSeconds(*V)), Note);
  };
  Sec("step", "step_seconds");
  Sec("pipeline", "pipeline_seconds");
  if (auto B = num(get(&E, "bubble")))
    T.add("bubble", esc(percentText(*B)));
  Sec("GEMMs (busiest rank)", "gemm_seconds");
  Sec("memory-bound ops", "memory_bound_seconds");
  Sec("tensor collectives", "tensor_comm_seconds");
  Sec("exposed data-parallel sum", "data_parallel_seconds");
  Sec("optimizer", "optimizer_seconds");
  if (auto M = num(get(&E, "mfu")))
    T.add("MFU", esc(percentText(*M)));
  if (auto M = num(get(&E, "hfu")))
    T.add("HFU", esc(percentText(*M)), "recomputation counted");
  return {"estimate", "Estimate on a GPU cluster",
          "<p>The plan's step by the cost model of <code>--estimate</code> "
          "(passes/CostModel.h).</p>\n" +
              T.str()};
}

Section searchSection(const json &A) {
  Facts T;
  T.add("GPUs", optCount(get(&A, "gpus")));
  T.add("memory per GPU", optBytes(get(&A, "gpu_memory_bytes")));
  T.addText("cluster", str(get(&A, "cluster")));
  T.add("layouts compiled", optCount(get(&A, "compiled")));
  T.add("layouts skipped", optCount(get(&A, "skipped")),
        "ruled out before compiling");
  if (auto S = num(get(&A, "seconds")))
    T.add("search time", esc(humanSeconds(*S)));
  std::string H = T.str();
  if (const json *Fits = array(get(&A, "fits"))) {
    Table Tab({"rank", "t", "SP", "p", "m", "d", "ZeRO",
               "microbatches", "recompute", "peak per GPU", "step", "MFU",
               "bubble"},
              /*Sortable=*/true);
    int Rank = 0;
    for (const json &C : *Fits) {
      ++Rank;
      auto Int = [&](StringRef K) {
        auto V = integer(get(&C, K));
        return V ? number(double(*V), std::to_string(*V)) : noNumber();
      };
      // Stage-aware recomputation: the first ranks recompute in full.
      std::string Recompute = str(get(&C, "recompute"));
      if (auto Full = integer(get(&C, "full_recompute_ranks")); Full && *Full)
        Recompute += formatv(" (full on rank{0} 0{1})", *Full > 1 ? "s" : "",
                             *Full > 1 ? formatv("-{0}", *Full - 1).str()
                                       : std::string())
                         .str();
      auto Step = num(get(&C, "step_seconds")), Mfu = num(get(&C, "mfu")),
           Bub = num(get(&C, "bubble")), Peak = num(get(&C, "peak_bytes"));
      Tab.row({number(Rank, Rank == 1 ? "1 (chosen)" : std::to_string(Rank)),
               Int("tp"),
               text(yesNo(flag(get(&C, "sp")))), Int("pp"), Int("interleave"),
               Int("dp"), Int("zero"), Int("microbatches"),
               text(Recompute), Peak ? bytes(*Peak) : noNumber(),
               Step ? number(*Step, humanSeconds(*Step)) : noNumber(),
               Mfu ? number(*Mfu, percentText(*Mfu)) : noNumber(),
               Bub ? number(*Bub, percentText(*Bub)) : noNumber()},
              Rank == 1 ? "chosen" : "");
    }
    H += "<h3>Layouts that fit, fastest first</h3>" + Tab.str() +
         "<p class=\"note\">This page describes the chosen layout, rank "
         "1.</p>\n";
  }
  if (const json *Rejected = array(get(&A, "rejected"));
      Rejected && !Rejected->empty()) {
    H += formatv("<details><summary>Why the other {0} were not taken"
                 "</summary><ul>",
                 Rejected->size())
             .str();
    for (const json &R : *Rejected)
      H += "<li>" + esc(R.is_string() ? R.get<std::string>() : R.dump()) +
           "</li>";
    H += "</ul></details>\n";
  }
  return {"search", "Layout search (--auto)", H};
}

/// Where the run stands, when the caller did not say.

} // namespace html
} // namespace sp
