//===- HtmlReport.h - One self-contained report page ------------*- C++ -*-===//
//
// The page that sp-compile --html and sp-run --html write: one HTML file with
// no network reference (no external script, style, font or image; every
// chart an inline SVG), which a practitioner opens first. It holds, from the
// facts of sp-compile's --report (a plan's manifest.json holds the same):
// the options, the recognised model, the memory report (a chart in the style
// of the paper's Figure 7 when the caller drew one, and each layer's stored
// activation bytes against the family's formula), the collectives per layer,
// the pipeline and its Gantt chart, the FLOPs, the cost model's estimate and
// the layout search when there are; and for a run, the loss curves and the
// memory sp-run measured.
//
// The generator takes plain data, so that it is testable without compiling
// or training: a JSON object of facts, SVG strings drawn by the tools' chart
// writers, loss rows and measured memory. It never throws on odd facts (a
// plan directory is user input): a missing or mistyped entry leaves its line
// out. Every piece of text goes through escapeHtml; an SVG is embedded only
// if it holds nothing but drawing elements (no script, event handler,
// reference or external URL), else the page says why it is left out. A
// small inline script sorts tables and checks that every chart rendered
// (#selfcheck); the page reads fully without it.
//
// The library (sp_html_report) depends on the plan library and support/
// only; its parts are described in HtmlParts.h.
//
//===----------------------------------------------------------------------===//
#ifndef SP_HTML_HTMLREPORT_H
#define SP_HTML_HTMLREPORT_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sp {

/// S with &, <, >, " and ' replaced by their entities (support/Xml.h's
/// xmlEscape): safe as HTML text and as a quoted attribute value.
std::string escapeHtml(llvm::StringRef S);

/// Svg made fit to sit inside an HTML page as the chart Id: the XML prolog
/// and namespace declarations dropped, the root given Id, class "chart" and
/// Label as its accessible name. Errors (naming what was found) when Svg is
/// not one <svg> element of drawing elements (svg, g, rect, line, polyline,
/// polygon, path, circle, ellipse, text, tspan, title, desc) with quoted
/// attributes, or when an attribute is an event handler, a reference (href,
/// src) or holds a URL.
llvm::Expected<std::string> inlineSvg(llvm::StringRef Svg, llvm::StringRef Id,
                                      llvm::StringRef Label);

/// A chart of the page: an SVG document (empty: none) and its caption.
struct ReportChart {
  std::string Svg;
  std::string Caption;
  bool empty() const { return Svg.empty(); }
};

/// One row of a run's loss log (runtime/LossLog.h's LossRow, as plain data;
/// NaN: not measured).
struct ReportLossRow {
  int64_t Step = 0;
  double Loss = NAN, ValLoss = NAN, LR = NAN, GradNorm = NAN;
  double TokensPerSecond = NAN, MFU = NAN;
};

/// The memory one rank measured while it trained (runtime/Executor.h's
/// MemoryStats) beside what its plan says.
struct ReportMeasuredMemory {
  std::string Rank = "rank 0";
  int64_t ArenaBytes = 0, PlannedArenaBytes = 0, PersistentBytes = 0;
  int64_t HighWaterBytes = 0, PeakLiveTempBytes = 0;
  int64_t StoredActivationBytes = 0;
  /// Stored activation bytes of one microbatch by layer (-1: outside the
  /// layers), for the layers this rank holds.
  std::map<int, int64_t> StoredBytesByLayer;
};

struct ReportPage {
  /// "sp-compile" or "sp-run", and what the page is of (the model file, or
  /// the plan directory).
  std::string Tool, Subject;
  /// The command line that made the page (shown as given; empty: none).
  std::string CommandLine;
  /// sp-compile's --report object, or a plan's manifest.json. Optional
  /// extras: "gemm_flops_per_rank" {forward, backward, recompute} and
  /// "collective_calls" (printCollectives' listing, a string).
  nlohmann::json Facts = nlohmann::json::object();
  /// The memory chart (the paper's Figure 7 style) and the pipeline's Gantt
  /// chart; the Gantt chart's section appears only for a pipelined plan.
  ReportChart Memory, Schedule;
  /// A run: its settings (shown in order), its total steps, loss rows and
  /// chart, the memory it measured, and where it stands ("stopped by
  /// SIGTERM after step 12"; empty: said from the last row and Steps).
  std::vector<std::pair<std::string, std::string>> RunSettings;
  int64_t Steps = 0;
  std::vector<ReportLossRow> Loss;
  ReportChart LossChart;
  std::optional<ReportMeasuredMemory> Measured;
  std::string RunStatus;
  bool isRun() const { return Tool == "sp-run"; }
};

/// The page, as one HTML document.
std::string renderReportPage(const ReportPage &P);

/// Writes the page to Path atomically (plan/AtomicFile.h).
llvm::Error writeReportPage(llvm::StringRef Path, const ReportPage &P);

/// The plan part of a run's page: the facts of the plan directory Dir (its
/// manifest, Manifest) and its schedule.svg when it has one.
ReportPage planReportPage(const nlohmann::json &Manifest, llvm::StringRef Dir);

/// Argv joined by spaces, the tool by its name alone (not where it was
/// built), each argument quoted for a POSIX shell when it needs it.
std::string commandLine(int Argc, const char *const *Argv);

} // namespace sp

#endif // SP_HTML_HTMLREPORT_H
