//===- HtmlRunSections.cpp - A training run's sections of the page ----------===//
//
// Where the run stands, its loss curves and rows, and the memory it
// measured against the plan's.
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

std::string runStatus(const ReportPage &P) {
  if (!P.RunStatus.empty() || P.Loss.empty())
    return P.RunStatus;
  int64_t Last = P.Loss.back().Step;
  if (P.Steps > 0 && Last >= P.Steps)
    return formatv("finished: step {0} of {1}", Last, P.Steps).str();
  if (P.Steps > 0)
    return formatv("at step {0} of {1} (still running, or stopped)", Last,
                   P.Steps)
        .str();
  return formatv("at step {0}", Last).str();
}

Section trainingSection(const ReportPage &P) {
  std::string H;
  Facts T;
  T.addText("status", runStatus(P));
  const std::vector<ReportLossRow> &Rows = P.Loss;
  if (!Rows.empty()) {
    T.add("steps logged",
          esc(formatv("{0}-{1}", Rows.front().Step, Rows.back().Step).str()));
    T.add("final training loss", lossText(Rows.back().Loss));
    double Min = INFINITY;
    int64_t MinStep = 0;
    for (const ReportLossRow &R : Rows)
      if (std::isfinite(R.Loss) && R.Loss < Min) {
        Min = R.Loss;
        MinStep = R.Step;
      }
    if (std::isfinite(Min))
      T.add("lowest training loss", lossText(Min),
            formatv("step {0}", MinStep).str());
    for (auto It = Rows.rbegin(); It != Rows.rend(); ++It)
      if (std::isfinite(It->ValLoss)) {
        T.add("last validation loss", lossText(It->ValLoss),
              formatv("step {0}", It->Step).str());
        break;
      }
    std::vector<double> Rates;
    for (const ReportLossRow &R : Rows)
      if (std::isfinite(R.TokensPerSecond))
        Rates.push_back(R.TokensPerSecond);
    if (!Rates.empty()) {
      std::sort(Rates.begin(), Rates.end());
      T.add("throughput (median step)",
            esc(thousands(int64_t(std::llround(Rates[Rates.size() / 2])))) +
                " tok/s");
    }
    std::vector<double> Mfus;
    for (const ReportLossRow &R : Rows)
      if (std::isfinite(R.MFU))
        Mfus.push_back(R.MFU);
    if (!Mfus.empty()) {
      std::sort(Mfus.begin(), Mfus.end());
      T.add("MFU (median step)", esc(percentText(Mfus[Mfus.size() / 2], 2)));
    }
  }
  H += T.grid();
  if (!P.LossChart.empty())
    H += figure(P.LossChart, "chart-loss", "loss chart");
  if (!Rows.empty()) {
    // About twenty rows: every k-th step, the validated ones and the last.
    size_t Every = std::max<size_t>(1, (Rows.size() + 19) / 20);
    Table Tab({"step", "loss", "validation loss", "learning rate",
               "gradient norm", "tok/s"},
              /*Sortable=*/true);
    for (size_t K = 0; K < Rows.size(); ++K) {
      const ReportLossRow &R = Rows[K];
      if (K && R.Step % int64_t(Every) && K + 1 != Rows.size() &&
          !std::isfinite(R.ValLoss))
        continue;
      auto Num = [](double V, std::string Shown) {
        return std::isfinite(V) ? number(V, std::move(Shown)) : noNumber();
      };
      Tab.row({number(double(R.Step), std::to_string(R.Step)),
               Num(R.Loss, cformat("%.4f", R.Loss)),
               Num(R.ValLoss, cformat("%.4f", R.ValLoss)),
               Num(R.LR, cformat("%.2e", R.LR)),
               Num(R.GradNorm, cformat("%.3f", R.GradNorm)),
               Num(R.TokensPerSecond,
                   std::isfinite(R.TokensPerSecond)
                       ? thousands(int64_t(std::llround(R.TokensPerSecond)))
                       : "")});
    }
    H +=
        "<h3>The loss log</h3><p class=\"note\">" +
        (Every == 1 ? formatv("All {0} steps.", Rows.size()).str()
                    : formatv("The steps that are multiples of {0}, the first, "
                              "the validated ones and the last (of {1}); "
                              "loss.csv holds them all.",
                              Every, Rows.size())
                          .str()) +
        "</p>\n" + Tab.str();
  } else {
    H += "<p class=\"note\">No step was logged.</p>\n";
  }
  return {"training", "Training", H};
}

Section measuredSection(const ReportPage &P) {
  if (!P.Measured)
    return {"measured-memory", "Measured memory",
            "<p class=\"note\">Not measured: no training step ran.</p>\n"};
  const ReportMeasuredMemory &M = *P.Measured;
  const json *Plan = get(&P.Facts, "plan"), *Mem = get(&P.Facts, "memory");
  std::optional<double> PlannedTemp = num(get(Plan, "peak_live_temp_bytes")),
                        PlannedStored =
                            num(get(Mem, "first_stage_activation_bytes")),
                        PlannedPersistent = num(get(Plan, "persistent_bytes"));
  double Max =
      std::max<double>({double(M.ArenaBytes), double(M.PlannedArenaBytes),
                        double(M.HighWaterBytes)});
  Table T({"", "measured", "planned", "", "measured vs planned"});
  auto Row = [&](StringRef Label, double Got, std::optional<double> Want) {
    T.row({text(Label), bytes(Got), Want ? bytes(*Want) : none(),
           html(bar(Got, Max, Want, MeasuredColour,
                    formatv("{0}: {1} measured", Label, bytesText(Got)).str())),
           Want && *Want > 0
               ? number(100 * (Got - *Want) / *Want,
                        diffText(100 * (Got - *Want) / *Want, "%+.2f%%"))
               : none()});
  };
  Row("arena", double(M.ArenaBytes), double(M.PlannedArenaBytes));
  Row("persistent", double(M.PersistentBytes), PlannedPersistent);
  Row("high-water mark", double(M.HighWaterBytes), double(M.PlannedArenaBytes));
  Row("peak live temporaries", double(M.PeakLiveTempBytes), PlannedTemp);
  Row("stored activations (whole step)", double(M.StoredActivationBytes),
      PlannedStored);
  return {"measured-memory", "Measured memory",
          "<p>What " + esc(M.Rank) +
              " measured while it trained (the highest arena address an "
              "instruction touched, the live temporaries and the stored "
              "activations of the last step), against its plan. The tick is "
              "the planned value; the per-layer figures are in the "
              "<a href=\"#memory\">memory</a> table.</p>\n" +
              T.str()};
}


} // namespace html
} // namespace sp
