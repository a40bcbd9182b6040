//===- Charts.cpp - SVG charts of schedules and reports -------------------===//
//
// Writes the SVG of Charts.h by hand: absolute coordinates, one element per
// block or bar, a <title> on each block so that a browser shows what it is
// on hover. Axes get "nice" ticks (1, 2 or 5 times a power of ten). Colours
// are the Tableau 10 palette; a later model chunk is its kind's colour mixed
// with white, so the chunks of an interleaved schedule stay distinguishable
// without a colour per chunk.
//
//===----------------------------------------------------------------------===//
#include "reports/Charts.h"
#include "support/Diagnostics.h"
#include "support/Format.h"
#include "support/Svg.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <iterator>

using namespace llvm;

namespace sp {

namespace {

const char *const ForwardColour = "#4c78a8";
const char *const BackwardColour = "#54a24b";
const char *const WeightGradColour = "#72b7b2";
const char *const RecomputeColour = "#b279a2";
const char *const CommColour = "#e45756";
const char *const IdleColour = "#f2f2f2";
const char *const Palette[] = {"#4c78a8", "#f58518", "#54a24b", "#e45756",
                               "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6",
                               "#9d755d", "#bab0ac"};

/// Colour Hex ("#rrggbb") mixed with white by Amount in [0, 1].
std::string lighten(StringRef Hex, double Amount) {
  unsigned V = 0;
  Hex.drop_front().getAsInteger(16, V);
  auto Mix = [&](unsigned C) {
    return unsigned(std::lround(C + (255 - C) * Amount));
  };
  char Out[8];
  std::snprintf(Out, sizeof(Out), "#%02x%02x%02x", Mix(V >> 16 & 255),
                Mix(V >> 8 & 255), Mix(V & 255));
  return Out;
}

/// The chart's <svg> element and background (support/Svg.h); the caller
/// writes the closing tag after its elements.
void svgOpen(raw_ostream &OS, double W, double H) {
  XmlWriter X(OS);
  openSvgDocument(X, W, H);
}

void text(raw_ostream &OS, double X, double Y, StringRef Anchor, StringRef S,
          StringRef Extra = "") {
  OS << formatv("<text x=\"{0:F1}\" y=\"{1:F1}\" text-anchor=\"{2}\"{3}>{4}"
                "</text>\n",
                X, Y, Anchor, Extra, xmlEscape(S));
}

// A pipelined plan's chart has a block per step of every rank (about 100k
// at the paper's 1T), so the blocks are written with llvm::format (printf),
// not formatv, which parses its format string on every call; "%.2f" is what
// formatv's "{0:F2}" writes.
void rect(raw_ostream &OS, double X, double Y, double W, double H,
          StringRef Fill, StringRef Title = "") {
  OS << format("<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
               "height=\"%.2f\" fill=\"",
               X, Y, W, H)
     << Fill << '"';
  if (Title.empty()) {
    OS << "/>\n";
    return;
  }
  OS << "><title>" << xmlEscape(Title) << "</title></rect>\n";
}

/// A row of legend entries (swatch, label) starting at X.
void legend(raw_ostream &OS, double X, double Y,
            ArrayRef<std::pair<std::string, std::string>> Entries) {
  for (const auto &[Colour, Label] : Entries) {
    if (Colour == "tick") {
      OS << formatv("<line x1=\"{0:F1}\" y1=\"{1:F1}\" x2=\"{2:F1}\" "
                    "y2=\"{1:F1}\" stroke=\"black\" stroke-width=\"2\"/>\n",
                    X, Y - 4, X + 12);
    } else {
      OS << formatv("<rect x=\"{0:F1}\" y=\"{1:F1}\" width=\"12\" "
                    "height=\"12\" fill=\"{2}\" stroke=\"#999999\" "
                    "stroke-width=\"0.5\"/>\n",
                    X, Y - 10, Colour);
    }
    text(OS, X + 16, Y, "start", Label);
    X += 16 + 7.0 * Label.size() + 18;
  }
}

} // namespace

Error writeGanttSvg(raw_ostream &OS, const Schedule &S,
                    const ScheduleTimes &T, const GanttOptions &O) {
  if (int(T.Times.size()) != S.Ranks)
    return makeError(formatv("timing has {0} ranks, the schedule {1}",
                             T.Times.size(), S.Ranks));
  for (int R = 0; R < S.Ranks; ++R)
    if (T.Times[R].size() != S.Steps[R].size())
      return makeError(formatv("timing of rank {0} has {1} steps, the "
                               "schedule {2}",
                               R, T.Times[R].size(), S.Steps[R].size()));
  const double Left = 70, Right = 24, Top = 62, RowH = O.RowHeight,
               Gap = 6;
  const double W = std::max(O.Width, Left + Right + 100);
  const double PW = W - Left - Right;
  const double AxisY = Top + S.Ranks * (RowH + Gap);
  const double H = AxisY + 70;
  const double Span = T.Makespan > 0 ? T.Makespan : 1.0;
  auto PX = [&](double Time) { return Left + Time / Span * PW; };
  auto Unit = [&](const std::string &V) {
    return O.TimeUnit.empty() ? V : V + " (" + O.TimeUnit + ")";
  };

  svgOpen(OS, W, H);
  text(OS, W / 2, 22, "middle", O.Title, " font-size=\"16\"");
  text(OS, W / 2, 42, "middle",
       formatv("{0}: P = {1}, M = {2}, N = {3}; bubble {4:F1}% of the ideal "
               "time",
               scheduleKindName(S.Kind), S.Ranks, S.Chunks, S.Microbatches,
               100 * T.bubbleFraction())
           .str(),
       " fill=\"#555555\"");

  // Each chunk's colours of forward, weight-gradient, recompute and
  // backward blocks.
  std::vector<std::array<std::string, 4>> Lighter;
  for (int Chunk = 0; Chunk < S.Chunks; ++Chunk) {
    double Shade = S.Chunks > 1 ? 0.5 * Chunk / (S.Chunks - 1) : 0.0;
    Lighter.push_back(
        {lighten(ForwardColour, Shade), lighten(WeightGradColour, Shade),
         lighten(RecomputeColour, Shade), lighten(BackwardColour, Shade)});
  }
  for (int R = 0; R < S.Ranks; ++R) {
    double Y = Top + R * (RowH + Gap);
    text(OS, Left - 8, Y + RowH / 2 + 4, "end", formatv("rank {0}", R).str());
    rect(OS, Left, Y, PW, RowH, IdleColour);
    for (int I = 0, E = S.Steps[R].size(); I < E; ++I) {
      const ScheduleStep &St = S.Steps[R][I];
      const TimedStep &TS = T.Times[R][I];
      const std::string *Shades = Lighter[St.Chunk].data();
      std::string What = describeStep(S, R, St);
      std::string When = ", " + shortNumber(TS.Start) + "-" +
                         shortNumber(TS.End);
      if (St.isRecv()) {
        if (TS.End > TS.Start)
          rect(OS, PX(TS.Start), Y + RowH * 0.7, PX(TS.End) - PX(TS.Start),
               RowH * 0.3, CommColour, What + When);
        continue;
      }
      if (!St.isCompute())
        continue; // sends take no time on the sender
      double X0 = PX(TS.Start), X1 = PX(TS.End);
      if (St.Kind == StepKind::Forward) {
        rect(OS, X0, Y, X1 - X0, RowH, Shades[0], What + When);
      } else if (St.Kind == StepKind::WeightGrad) {
        rect(OS, X0, Y, X1 - X0, RowH, Shades[1], What + When);
      } else {
        double XR = PX(TS.RecomputeEnd);
        if (XR > X0)
          rect(OS, X0, Y, XR - X0, RowH, Shades[2],
               "recompute for the " + What + When);
        rect(OS, XR, Y, X1 - XR, RowH, Shades[3], What + When);
      }
      // Thin separators between adjacent blocks of the same colour.
      OS << format("<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" "
                   "y2=\"%.2f\" stroke=\"white\" stroke-width=\"0.5\"/>\n",
                   X1, Y, X1, Y + RowH);
      std::string Label = std::to_string(St.Microbatch);
      double FontSize = std::min(11.0, RowH * 0.5);
      if (X1 - X0 >= FontSize * 0.65 * Label.size() + 2)
        text(OS, (X0 + X1) / 2, Y + RowH / 2 + FontSize * 0.35, "middle",
             Label,
             formatv(" font-size=\"{0:F0}\" fill=\"white\"", FontSize).str());
    }
  }

  // Time axis.
  OS << formatv("<line x1=\"{0}\" y1=\"{1:F1}\" x2=\"{2}\" y2=\"{1:F1}\" "
                "stroke=\"black\"/>\n",
                Left, AxisY, Left + PW);
  double Step;
  for (double Tick : niceTicks(0, Span, 10, Step)) {
    double X = PX(Tick);
    OS << formatv("<line x1=\"{0:F1}\" y1=\"{1:F1}\" x2=\"{0:F1}\" "
                  "y2=\"{2:F1}\" stroke=\"black\"/>\n",
                  X, AxisY, AxisY + 4);
    text(OS, X, AxisY + 17, "middle", tickLabel(Tick, Step));
  }
  text(OS, Left + PW / 2, AxisY + 34, "middle", Unit("time"));
  std::vector<std::pair<std::string, std::string>> Entries = {
      {ForwardColour, "forward"},
      {BackwardColour, S.splitsBackward() ? "backward (input gradients)"
                                          : "backward"},
      {RecomputeColour, "recompute"},
      {CommColour, "communication"},
      {IdleColour, "idle (bubble)"}};
  if (S.splitsBackward())
    Entries.insert(Entries.begin() + 2,
                   {WeightGradColour, "weight gradients"});
  if (S.Chunks > 1)
    Entries.push_back({lighten(ForwardColour, 0.5),
                       formatv("lighter: later chunks (up to {0})",
                               S.Chunks - 1)
                           .str()});
  legend(OS, Left, AxisY + 58, Entries);
  OS << "</svg>\n";
  return Error::success();
}

Error writeBarChartSvg(raw_ostream &OS, const BarChart &C) {
  size_t G = C.Groups.size(), NS = C.Series.size();
  if (G == 0 || NS == 0)
    return makeError("a bar chart needs at least one group and one series");
  auto CheckShape = [&](const std::vector<std::vector<double>> &Table,
                        StringRef Name) -> Error {
    if (Table.size() != G)
      return makeError(formatv("bar chart {0} has {1} rows for {2} groups",
                               Name, Table.size(), G));
    for (size_t I = 0; I < G; ++I) {
      if (Table[I].size() != NS)
        return makeError(formatv("bar chart {0} of group '{1}' has {2} "
                                 "entries for {3} series",
                                 Name, C.Groups[I], Table[I].size(), NS));
      for (double V : Table[I])
        if (!std::isnan(V) && (!std::isfinite(V) || V < 0))
          return makeError(formatv("bar chart {0} of group '{1}' holds {2}; "
                                   "values must be finite and non-negative",
                                   Name, C.Groups[I], shortNumber(V)));
    }
    return Error::success();
  };
  if (Error E = CheckShape(C.Values, "values"))
    return E;
  bool HasMarkers = !C.Markers.empty();
  if (HasMarkers)
    if (Error E = CheckShape(C.Markers, "markers"))
      return E;

  double Max = 0;
  for (size_t I = 0; I < G; ++I)
    for (size_t J = 0; J < NS; ++J) {
      if (!std::isnan(C.Values[I][J]))
        Max = std::max(Max, C.Values[I][J]);
      if (HasMarkers && !std::isnan(C.Markers[I][J]))
        Max = std::max(Max, C.Markers[I][J]);
    }
  double Step;
  double YMax = C.YMax;
  if (!(YMax > 0)) {
    std::vector<double> Ticks = niceTicks(0, Max * 1.08, 6, Step);
    YMax = Ticks.back() < Max * 1.08 ? Ticks.back() + Step : Ticks.back();
    if (!(YMax > 0))
      YMax = 1;
  }
  std::vector<double> Ticks = niceTicks(0, YMax, 6, Step);

  const double W = C.Width, H = C.Height, Left = 70, Right = 20, Top = 64,
               Bottom = 64;
  const double PW = W - Left - Right, PH = H - Top - Bottom;
  auto PY = [&](double V) { return Top + (1 - std::min(V, YMax) / YMax) * PH; };
  auto Label = [&](double V, double S) {
    return tickLabel(V, S) + (C.Percent ? "%" : "");
  };

  svgOpen(OS, W, H);
  text(OS, W / 2, 22, "middle", C.Title, " font-size=\"16\"");
  std::vector<std::pair<std::string, std::string>> Entries;
  for (size_t J = 0; J < NS; ++J)
    Entries.push_back({Palette[J % std::size(Palette)], C.Series[J]});
  if (HasMarkers)
    Entries.push_back({"tick", C.MarkerLabel});
  legend(OS, Left, 46, Entries);

  for (double Tick : Ticks) {
    double Y = PY(Tick);
    OS << formatv("<line x1=\"{0}\" y1=\"{1:F1}\" x2=\"{2}\" y2=\"{1:F1}\" "
                  "stroke=\"#e0e0e0\"/>\n",
                  Left, Y, Left + PW);
    text(OS, Left - 6, Y + 4, "end", Label(Tick, Step));
  }
  double GroupW = PW / G, BarW = GroupW * 0.8 / NS;
  for (size_t I = 0; I < G; ++I) {
    double X0 = Left + I * GroupW + GroupW * 0.1;
    for (size_t J = 0; J < NS; ++J) {
      double X = X0 + J * BarW, V = C.Values[I][J];
      if (!std::isnan(V)) {
        double Y = PY(V);
        rect(OS, X + 1, Y, BarW - 2, Top + PH - Y,
             Palette[J % std::size(Palette)],
             formatv("{0}, {1}: {2}", C.Groups[I], C.Series[J],
                     Label(V, 0.1))
                 .str());
        text(OS, X + BarW / 2, Y - 4, "middle", Label(V, V < 10 ? 0.1 : 1),
             " font-size=\"9\"");
      }
      if (HasMarkers && !std::isnan(C.Markers[I][J])) {
        double Y = PY(C.Markers[I][J]);
        OS << formatv("<line x1=\"{0:F1}\" y1=\"{1:F1}\" x2=\"{2:F1}\" "
                      "y2=\"{1:F1}\" stroke=\"black\" stroke-width=\"2\">"
                      "<title>{3}</title></line>\n",
                      X + 1, Y, X + BarW - 1,
                      xmlEscape(formatv("{0}, {1}: {2} {3}", C.Groups[I],
                                        C.Series[J], C.MarkerLabel,
                                        Label(C.Markers[I][J], 0.1))
                                    .str()));
      }
    }
    text(OS, Left + (I + 0.5) * GroupW, Top + PH + 18, "middle",
         C.Groups[I]);
  }
  OS << formatv("<line x1=\"{0}\" y1=\"{1:F1}\" x2=\"{2}\" y2=\"{1:F1}\" "
                "stroke=\"black\"/>\n",
                Left, Top + PH, Left + PW);
  OS << formatv("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2:F1}\" "
                "stroke=\"black\"/>\n",
                Left, Top, Top + PH);
  text(OS, Left + PW / 2, H - 14, "middle", C.XLabel);
  text(OS, 18, Top + PH / 2, "middle", C.YLabel,
       formatv(" transform=\"rotate(-90 18 {0:F1})\"", Top + PH / 2).str());
  OS << "</svg>\n";
  return Error::success();
}

} // namespace sp
