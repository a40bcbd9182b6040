//===- LossLog.h - Learning-rate schedule, loss log, progress --*- C++ -*-===//
//
// What sp-run shows of a training run:
//   - learningRate: linear warmup, then cosine decay to a minimum (the
//     formula of the sp-run contract);
//   - loss.csv ("step,loss,lr", one row per step) and loss.svg, a plain SVG
//     line plot of the loss against the step;
//   - a progress line on stderr, redrawn in place with '\r' on a terminal and
//     printed once per step otherwise.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_LOSSLOG_H
#define SP_RUNTIME_LOSSLOG_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include <cstdint>
#include <string>
#include <vector>

namespace sp {

/// The learning rate of the 1-based Step of Steps, with Warmup linear warmup
/// steps, peak Peak and final Min:
///   Step <= Warmup (Warmup > 0): Peak * Step / Warmup
///   otherwise: progress = (Step - Warmup) / max(1, Steps - Warmup)
///              Min + 0.5 * (Peak - Min) * (1 + cos(pi * progress))
double learningRate(int64_t Step, int64_t Steps, int64_t Warmup, double Peak,
                    double Min);

struct LossRow {
  int64_t Step = 0;
  double Loss = 0;
  double LR = 0;
};

/// "step,loss,lr" and one row per entry; numbers are printed with enough
/// digits to read back the float32 loss exactly.
std::string lossCsv(llvm::ArrayRef<LossRow> Rows);

/// A line plot of loss against step: axes with tick labels, the title, a
/// polyline (or a dot for a single step). Non-finite losses are skipped.
std::string lossSvg(llvm::ArrayRef<LossRow> Rows, llvm::StringRef Title);

/// "12,345".
std::string groupThousands(int64_t N);

/// "step 7/20 [#######.............] loss 4.1234 lr 9.8e-04 12,345 tok/s".
std::string progressLine(int64_t Step, int64_t Steps, double Loss, double LR,
                         double TokensPerSecond, unsigned BarWidth = 20);

/// Prints progress lines to OS: in place on a terminal, one per line
/// otherwise.
class ProgressBar {
public:
  ProgressBar(llvm::raw_ostream &OS, bool Terminal) : OS(OS), Tty(Terminal) {}
  void update(int64_t Step, int64_t Steps, double Loss, double LR,
              double TokensPerSecond);
  /// Ends the in-place line (a newline on a terminal).
  void finish();

private:
  llvm::raw_ostream &OS;
  bool Tty;
  size_t LastWidth = 0;
};

} // namespace sp

#endif // SP_RUNTIME_LOSSLOG_H
