//===- LossLog.cpp - Learning-rate schedule, loss log, progress -----------===//
//
// See LossLog.h. loss.svg is written with the repository's XML writer and
// chart axes (support/Svg.h).
//
//===----------------------------------------------------------------------===//
#include "runtime/LossLog.h"
#include "support/Format.h"
#include "support/Svg.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace llvm;

namespace sp {

double learningRate(int64_t Step, int64_t Steps, int64_t Warmup, double Peak,
                    double Min) {
  if (Warmup > 0 && Step <= Warmup)
    return Peak * double(Step) / double(Warmup);
  double Progress =
      double(Step - Warmup) / double(std::max<int64_t>(1, Steps - Warmup));
  return Min + 0.5 * (Peak - Min) * (1.0 + std::cos(M_PI * Progress));
}

const char LossCsvHeader[] =
    "step,loss,lr,grad_norm,val_loss,tokens_per_s,model_flops_per_s,mfu";

namespace {
/// "%.9g", or nothing for NaN.
void appendField(std::string &S, double X) {
  S += ',';
  if (std::isnan(X))
    return;
  char Text[32];
  std::snprintf(Text, sizeof(Text), "%.9g", X);
  S += Text;
}
} // namespace

std::string lossCsv(ArrayRef<LossRow> Rows) {
  std::string S = LossCsvHeader;
  S += '\n';
  for (const LossRow &R : Rows) {
    S += std::to_string(R.Step);
    for (double X : {R.Loss, R.LR, R.GradNorm, R.ValLoss, R.TokensPerSecond,
                     R.FlopsPerSecond, R.MFU})
      appendField(S, X);
    S += '\n';
  }
  return S;
}

std::string groupThousands(int64_t N) {
  std::string Digits = std::to_string(N < 0 ? -N : N), R;
  for (size_t I = 0; I < Digits.size(); ++I) {
    if (I && (Digits.size() - I) % 3 == 0)
      R += ',';
    R += Digits[I];
  }
  return N < 0 ? "-" + R : R;
}

std::string flopCount(double F) {
  static const char *Units[] = {"", "K", "M", "G", "T", "P", "E"};
  int U = 0;
  while (U < 6 && std::abs(F) >= 1000) {
    F /= 1000;
    ++U;
  }
  int Decimals = std::abs(F) >= 100 ? 0 : std::abs(F) >= 10 ? 1 : 2;
  return formatv("{0} {1}FLOP", format("%.*f", Decimals, F), Units[U]).str();
}

std::string flopRate(double F) { return flopCount(F) + "/s"; }

std::string progressLine(int64_t Steps, const LossRow &R, unsigned BarWidth) {
  std::string Line = formatv("step {0}/{1} ", R.Step, Steps).str();
  if (BarWidth) {
    unsigned Filled =
        Steps > 0
            ? unsigned(std::min<int64_t>(BarWidth, R.Step * BarWidth / Steps))
            : BarWidth;
    Line += '[';
    Line.append(Filled, '#');
    Line.append(BarWidth - Filled, '.');
    Line += "] ";
  }
  Line += formatv("loss {0:F4} lr {1}", R.Loss, format("%.1e", R.LR)).str();
  if (std::isfinite(R.GradNorm))
    Line += formatv(" gnorm {0}", format("%.3g", R.GradNorm)).str();
  if (std::isfinite(R.TokensPerSecond))
    Line += formatv(" {0} tok/s",
                    groupThousands(int64_t(std::llround(R.TokensPerSecond))))
                .str();
  if (std::isfinite(R.FlopsPerSecond))
    Line += formatv(" {0}", flopRate(R.FlopsPerSecond)).str();
  if (std::isfinite(R.MFU))
    Line += formatv(" MFU {0:F1}%", 100 * R.MFU).str();
  return Line;
}

void ProgressBar::update(int64_t Steps, const LossRow &Row,
                         int64_t FirstStep) {
  if (!Tty) {
    if (Row.Step == FirstStep || Row.Step == Steps ||
        (Every > 0 && Row.Step % Every == 0)) {
      OS << progressLine(Steps, Row, /*BarWidth=*/0) << "\n";
      OS.flush();
    }
    return;
  }
  std::string Line = progressLine(Steps, Row);
  // Pad over what is left of a longer previous line.
  size_t Width = Line.size();
  if (Width < LastWidth)
    Line.append(LastWidth - Width, ' ');
  LastWidth = Width;
  OS << "\r" << Line;
  OS.flush();
}

void ProgressBar::note(StringRef Line) {
  if (Tty && LastWidth) {
    // Over the bar, which the next update draws again below.
    std::string Text = Line.str();
    if (Text.size() < LastWidth)
      Text.append(LastWidth - Text.size(), ' ');
    OS << "\r" << Text << "\n";
    LastWidth = 0;
  } else {
    OS << Line << "\n";
  }
  OS.flush();
}

void ProgressBar::finish() {
  if (Tty && LastWidth) {
    OS << "\n";
    OS.flush();
  }
  LastWidth = 0;
}

//===----------------------------------------------------------------------===//
// The SVG plot
//===----------------------------------------------------------------------===//


/// The trailing mean of the last Window finite losses at each row's step
/// (from the Window-th on).
static std::vector<std::pair<double, double>>
movingAverage(ArrayRef<const LossRow *> Pts, size_t Window) {
  std::vector<std::pair<double, double>> Avg;
  double Sum = 0;
  for (size_t I = 0; I < Pts.size(); ++I) {
    Sum += Pts[I]->Loss;
    if (I >= Window)
      Sum -= Pts[I - Window]->Loss;
    if (I + 1 >= Window)
      Avg.push_back({double(Pts[I]->Step), Sum / double(Window)});
  }
  return Avg;
}

std::string lossSvg(ArrayRef<LossRow> Rows, StringRef Title) {
  const double W = 640, H = 400, Left = 70, Right = 20, Top = 40, Bottom = 50;
  const double PW = W - Left - Right, PH = H - Top - Bottom;
  std::vector<const LossRow *> Pts;
  std::vector<std::pair<double, double>> Val;
  for (const LossRow &R : Rows) {
    if (std::isfinite(R.Loss))
      Pts.push_back(&R);
    if (std::isfinite(R.ValLoss))
      Val.push_back({double(R.Step), R.ValLoss});
  }
  std::vector<std::pair<double, double>> Avg;
  if (Pts.size() >= 20)
    Avg = movingAverage(Pts, std::max<size_t>(5, Pts.size() / 20));
  double X0 = 1, X1 = 2, Y0 = 0, Y1 = 1;
  bool Any = false;
  auto Extend = [&](double X, double Y) {
    if (!Any) {
      X0 = X1 = X;
      Y0 = Y1 = Y;
      Any = true;
    }
    X0 = std::min(X0, X);
    X1 = std::max(X1, X);
    Y0 = std::min(Y0, Y);
    Y1 = std::max(Y1, Y);
  };
  for (const LossRow *R : Pts)
    Extend(double(R->Step), R->Loss);
  for (const auto &V : Val)
    Extend(V.first, V.second);
  if (X1 - X0 < 1)
    X1 = X0 + 1;
  if (Y1 - Y0 < 1e-6) {
    double Pad = std::max(0.05 * std::abs(Y0), 0.05);
    Y0 -= Pad;
    Y1 += Pad;
  } else {
    double Pad = 0.05 * (Y1 - Y0);
    Y0 -= Pad;
    Y1 += Pad;
  }
  auto PX = [&](double X) { return Left + (X - X0) / (X1 - X0) * PW; };
  auto PY = [&](double Y) { return Top + (1 - (Y - Y0) / (Y1 - Y0)) * PH; };

  std::string S;
  raw_string_ostream OS(S);
  XmlWriter Svg(OS);
  openSvgDocument(Svg, W, H);
  Svg.textElement("text",
                  {{"x", W / 2},
                   {"y", "24"},
                   {"text-anchor", "middle"},
                   {"font-size", "16"}},
                  Title);
  // Grid, ticks and labels.
  double XStep, YStep;
  for (double T : niceTicks(X0, X1, 8, XStep)) {
    if (XStep < 1)
      continue; // steps are integers
    double X = PX(T);
    Svg.leaf("line", {{"x1", X, 1},
                      {"y1", Top},
                      {"x2", X, 1},
                      {"y2", Top + PH},
                      {"stroke", "#e0e0e0"}});
    Svg.textElement(
        "text", {{"x", X, 1}, {"y", Top + PH + 18}, {"text-anchor", "middle"}},
        tickLabel(T, XStep));
  }
  for (double T : niceTicks(Y0, Y1, 6, YStep)) {
    double Y = PY(T);
    Svg.leaf("line", {{"x1", Left},
                      {"y1", Y, 1},
                      {"x2", Left + PW},
                      {"y2", Y, 1},
                      {"stroke", "#e0e0e0"}});
    Svg.textElement(
        "text", {{"x", Left - 6}, {"y", Y + 4, 1}, {"text-anchor", "end"}},
        tickLabel(T, YStep));
  }
  // Axes and their names.
  Svg.leaf("line", {{"x1", Left},
                    {"y1", Top},
                    {"x2", Left},
                    {"y2", Top + PH},
                    {"stroke", "black"}});
  Svg.leaf("line", {{"x1", Left},
                    {"y1", Top + PH},
                    {"x2", Left + PW},
                    {"y2", Top + PH},
                    {"stroke", "black"}});
  Svg.textElement("text",
                  {{"x", Left + PW / 2}, {"y", H - 10}, {"text-anchor", "middle"}},
                  "step");
  Svg.textElement("text",
                  {{"x", "16"},
                   {"y", Top + PH / 2},
                   {"text-anchor", "middle"},
                   {"transform",
                    "rotate(-90 16 " + fixedNumber(Top + PH / 2, 2) + ")"}},
                  "loss");
  // The curves: the training loss (pale once its average is drawn over
  // it), the moving average, the validation losses.
  auto Polyline = [&](ArrayRef<std::pair<double, double>> XY,
                      StringRef Color, double Width) {
    std::string Points;
    for (size_t I = 0; I < XY.size(); ++I) {
      if (I)
        Points += ' ';
      Points += fixedNumber(PX(XY[I].first), 1);
      Points += ',';
      Points += fixedNumber(PY(XY[I].second), 1);
    }
    Svg.leaf("polyline", {{"fill", "none"},
                          {"stroke", Color},
                          {"stroke-width", Width},
                          {"points", Points}});
  };
  auto Dots = [&](ArrayRef<std::pair<double, double>> XY, StringRef Color) {
    for (const auto &P : XY)
      Svg.leaf("circle", {{"cx", PX(P.first), 1},
                          {"cy", PY(P.second), 1},
                          {"r", "3"},
                          {"fill", Color}});
  };
  std::vector<std::pair<double, double>> Train;
  for (const LossRow *R : Pts)
    Train.push_back({double(R->Step), R->Loss});
  const char *TrainColor = Avg.empty() ? "#1f77b4" : "#a6c8e6";
  if (Train.size() == 1)
    Dots(Train, TrainColor);
  else if (!Train.empty())
    Polyline(Train, TrainColor, Avg.empty() ? 1.5 : 1);
  if (!Avg.empty())
    Polyline(Avg, "#1f77b4", 2);
  if (Val.size() > 1)
    Polyline(Val, "#ff7f0e", 1.5);
  Dots(Val, "#ff7f0e");
  if (Train.empty() && Val.empty())
    Svg.textElement("text",
                    {{"x", Left + PW / 2},
                     {"y", Top + PH / 2},
                     {"text-anchor", "middle"}},
                    "no data");
  // The legend, top right, one entry per curve drawn.
  std::vector<std::pair<std::string, const char *>> Legend;
  if (!Train.empty())
    Legend.push_back({"training loss", TrainColor});
  if (!Avg.empty())
    Legend.push_back(
        {formatv("training, mean of {0} steps",
                 std::max<size_t>(5, Pts.size() / 20))
             .str(),
         "#1f77b4"});
  if (!Val.empty())
    Legend.push_back({"validation loss", "#ff7f0e"});
  if (Legend.size() > 1 || !Val.empty())
    for (size_t I = 0; I < Legend.size(); ++I) {
      double Y = Top + 14 + 16 * double(I), X = Left + PW - 190;
      Svg.leaf("line", {{"x1", X},
                        {"y1", Y - 4},
                        {"x2", X + 20},
                        {"y2", Y - 4},
                        {"stroke", Legend[I].second},
                        {"stroke-width", "2"}});
      Svg.textElement("text", {{"x", X + 26}, {"y", Y}}, Legend[I].first);
    }
  Svg.close();
  return OS.str();
}

} // namespace sp
