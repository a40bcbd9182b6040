//===- Charts.h - SVG charts of schedules and reports --------*- C++ -*-===//
//
// Two small SVG writers with no dependencies beyond LLVM's streams: a Gantt
// chart of a simulated pipeline schedule (one row per rank, the bubble is
// the empty space) and a grouped bar chart of percentages (the paper's
// Figure 7: each configuration's activation memory relative to the
// tensor-parallel baseline, per model). Every piece of text goes through
// xmlEscape (support/Xml.h), so the files are well-formed whatever the titles hold.
//
//===----------------------------------------------------------------------===//
#ifndef SP_REPORTS_CHARTS_H
#define SP_REPORTS_CHARTS_H

#include "lower/Schedule.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <string>
#include <vector>

namespace llvm {
class raw_ostream;
} // namespace llvm

namespace sp {

struct GanttOptions {
  std::string Title = "pipeline schedule";
  /// Unit of the simulated times, printed on the axis ("ms", "" for none).
  std::string TimeUnit;
  double Width = 960;
  double RowHeight = 28;
};

/// A Gantt chart of S timed by T (simulateTimes): one row per rank; forward,
/// backward, recompute (the part of a backward that recomputes) and
/// communication (receives whose transfer takes time) in distinct colours,
/// lighter for later model chunks; the microbatch number on each block wide
/// enough to hold it; a time axis; a legend; a subtitle with P, M, N and
/// the bubble fraction. Idle time is the empty row background. Errors when
/// T does not belong to S.
llvm::Error writeGanttSvg(llvm::raw_ostream &OS, const Schedule &S,
                          const ScheduleTimes &T, const GanttOptions &O = {});

/// A grouped bar chart: one group per entry of Groups (e.g. models), one
/// bar per entry of Series (e.g. configurations) in each, heights
/// Values[group][series] (NaN: no bar). Markers, when not empty, has the
/// same shape and draws a tick across each bar at that value (NaN: none),
/// e.g. the paper's number beside the measured one.
struct BarChart {
  std::string Title, XLabel, YLabel;
  std::vector<std::string> Groups, Series;
  std::vector<std::vector<double>> Values;
  std::vector<std::vector<double>> Markers;
  std::string MarkerLabel = "reference";
  /// Top of the value axis; 0 picks a round number above the data.
  double YMax = 0;
  /// Values are percentages: tick and bar labels get a % sign.
  bool Percent = true;
  double Width = 720, Height = 420;
};

/// Writes C as SVG. Errors when Values or Markers do not match Groups and
/// Series, or a value is negative or infinite.
llvm::Error writeBarChartSvg(llvm::raw_ostream &OS, const BarChart &C);

} // namespace sp

#endif // SP_REPORTS_CHARTS_H
