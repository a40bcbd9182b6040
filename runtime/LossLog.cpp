//===- LossLog.cpp - Learning-rate schedule, loss log, progress -----------===//
#include "runtime/LossLog.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/raw_ostream.h"
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

std::string lossCsv(ArrayRef<LossRow> Rows) {
  std::string S = "step,loss,lr\n";
  for (const LossRow &R : Rows) {
    char Line[96];
    std::snprintf(Line, sizeof(Line), "%lld,%.9g,%.9g\n", (long long)R.Step,
                  R.Loss, R.LR);
    S += Line;
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

std::string progressLine(int64_t Step, int64_t Steps, double Loss, double LR,
                         double TokensPerSecond, unsigned BarWidth) {
  unsigned Filled =
      Steps > 0 ? unsigned(std::min<int64_t>(BarWidth, Step * BarWidth / Steps))
                : BarWidth;
  std::string Bar(Filled, '#');
  Bar.append(BarWidth - Filled, '.');
  char LRText[32];
  std::snprintf(LRText, sizeof(LRText), "%.1e", LR);
  return formatv("step {0}/{1} [{2}] loss {3:F4} lr {4} {5} tok/s", Step, Steps,
                 Bar, Loss, LRText,
                 groupThousands(int64_t(std::llround(TokensPerSecond))))
      .str();
}

void ProgressBar::update(int64_t Step, int64_t Steps, double Loss, double LR,
                         double TokensPerSecond) {
  std::string Line = progressLine(Step, Steps, Loss, LR, TokensPerSecond);
  if (!Tty) {
    OS << Line << "\n";
    OS.flush();
    return;
  }
  // Pad over what is left of a longer previous line.
  size_t Width = Line.size();
  if (Width < LastWidth)
    Line.append(LastWidth - Width, ' ');
  LastWidth = Width;
  OS << "\r" << Line;
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

namespace {

std::string xmlEscape(StringRef S) {
  std::string R;
  raw_string_ostream OS(R);
  printHTMLEscaped(S, OS); // &, <, >, " and '
  return OS.str();
}

/// Tick positions over [Lo, Hi]: a step of 1, 2 or 5 times a power of ten
/// giving about Want ticks.
std::vector<double> niceTicks(double Lo, double Hi, int Want, double &Step) {
  double Range = Hi - Lo;
  double Raw = Range / std::max(1, Want);
  double Mag = std::pow(10.0, std::floor(std::log10(Raw)));
  Step = Mag;
  for (double M : {1.0, 2.0, 5.0, 10.0})
    if (M * Mag >= Raw) {
      Step = M * Mag;
      break;
    }
  std::vector<double> T;
  for (double V = std::ceil(Lo / Step - 1e-9) * Step; V <= Hi + Step * 1e-9;
       V += Step)
    T.push_back(std::abs(V) < Step * 1e-9 ? 0.0 : V);
  return T;
}

std::string tickLabel(double V, double Step) {
  int Decimals = Step >= 1 ? 0 : int(std::ceil(-std::log10(Step) - 1e-9));
  char Text[64];
  std::snprintf(Text, sizeof(Text), "%.*f", Decimals, V);
  return Text;
}

} // namespace

std::string lossSvg(ArrayRef<LossRow> Rows, StringRef Title) {
  const double W = 640, H = 400, Left = 70, Right = 20, Top = 40, Bottom = 50;
  const double PW = W - Left - Right, PH = H - Top - Bottom;
  std::vector<const LossRow *> Pts;
  for (const LossRow &R : Rows)
    if (std::isfinite(R.Loss))
      Pts.push_back(&R);
  double X0 = 1, X1 = 2, Y0 = 0, Y1 = 1;
  if (!Pts.empty()) {
    X0 = X1 = double(Pts.front()->Step);
    Y0 = Y1 = Pts.front()->Loss;
    for (const LossRow *R : Pts) {
      X0 = std::min(X0, double(R->Step));
      X1 = std::max(X1, double(R->Step));
      Y0 = std::min(Y0, R->Loss);
      Y1 = std::max(Y1, R->Loss);
    }
  }
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
  OS << formatv("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" "
                "height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                "font-family=\"sans-serif\" font-size=\"12\">\n",
                W, H);
  OS << formatv("<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" "
                "fill=\"white\"/>\n",
                W, H);
  OS << formatv("<text x=\"{0}\" y=\"24\" text-anchor=\"middle\" "
                "font-size=\"16\">{1}</text>\n",
                W / 2, xmlEscape(Title));
  // Grid, ticks and labels.
  double XStep, YStep;
  for (double T : niceTicks(X0, X1, 8, XStep)) {
    if (XStep < 1)
      continue; // steps are integers
    double X = PX(T);
    OS << formatv("<line x1=\"{0:F1}\" y1=\"{1}\" x2=\"{0:F1}\" y2=\"{2}\" "
                  "stroke=\"#e0e0e0\"/>\n",
                  X, Top, Top + PH);
    OS << formatv("<text x=\"{0:F1}\" y=\"{1}\" text-anchor=\"middle\">{2}"
                  "</text>\n",
                  X, Top + PH + 18, tickLabel(T, XStep));
  }
  for (double T : niceTicks(Y0, Y1, 6, YStep)) {
    double Y = PY(T);
    OS << formatv("<line x1=\"{0}\" y1=\"{1:F1}\" x2=\"{2}\" y2=\"{1:F1}\" "
                  "stroke=\"#e0e0e0\"/>\n",
                  Left, Y, Left + PW);
    OS << formatv("<text x=\"{0}\" y=\"{1:F1}\" text-anchor=\"end\">{2}"
                  "</text>\n",
                  Left - 6, Y + 4, tickLabel(T, YStep));
  }
  // Axes and their names.
  OS << formatv("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" "
                "stroke=\"black\"/>\n",
                Left, Top, Top + PH);
  OS << formatv("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" "
                "stroke=\"black\"/>\n",
                Left, Top + PH, Left + PW);
  OS << formatv("<text x=\"{0}\" y=\"{1}\" text-anchor=\"middle\">step"
                "</text>\n",
                Left + PW / 2, H - 10);
  OS << formatv("<text x=\"16\" y=\"{0}\" text-anchor=\"middle\" "
                "transform=\"rotate(-90 16 {0})\">loss</text>\n",
                Top + PH / 2);
  // The curve.
  if (Pts.size() == 1) {
    OS << formatv("<circle cx=\"{0:F1}\" cy=\"{1:F1}\" r=\"3\" "
                  "fill=\"#1f77b4\"/>\n",
                  PX(double(Pts[0]->Step)), PY(Pts[0]->Loss));
  } else if (!Pts.empty()) {
    OS << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" "
          "points=\"";
    for (size_t I = 0; I < Pts.size(); ++I)
      OS << formatv("{0}{1:F1},{2:F1}", I ? " " : "", PX(double(Pts[I]->Step)),
                    PY(Pts[I]->Loss));
    OS << "\"/>\n";
  } else {
    OS << formatv("<text x=\"{0}\" y=\"{1}\" text-anchor=\"middle\">no "
                  "data</text>\n",
                  Left + PW / 2, Top + PH / 2);
  }
  OS << "</svg>\n";
  return OS.str();
}

} // namespace sp
