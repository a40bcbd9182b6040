//===- LossLog.h - Learning-rate schedule, loss log, progress --*- C++ -*-===//
//
// What sp-run shows of a training run:
//   - learningRate: linear warmup, then cosine decay to a minimum (the
//     formula of the sp-run contract);
//   - loss.csv (one row per step: loss, learning rate, gradient norm,
//     validation loss, throughput and MFU) and loss.svg, a plain SVG line
//     plot of the training loss (and its moving average) and the validation
//     loss against the step;
//   - a progress line on stderr, redrawn in place with '\r' on a terminal and
//     printed every --log-every steps otherwise.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_LOSSLOG_H
#define SP_RUNTIME_LOSSLOG_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include <cmath>
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

/// One training step's row of loss.csv. NaN stands for "not measured":
/// no gradient norm (a plan without clipping), no validation this step, no
/// known peak FLOP/s, or timings a resumed run did not see.
struct LossRow {
  int64_t Step = 0;
  double Loss = 0;
  double LR = 0;
  /// The gradients' global L2 norm before clipping.
  double GradNorm = NAN;
  /// The mean validation loss measured after this step.
  double ValLoss = NAN;
  /// This step's throughput, the whole job's: tokens per second, model
  /// FLOPs (forward and backward, recomputation not counted) per second,
  /// and those over the job's peak FLOP/s.
  double TokensPerSecond = NAN, FlopsPerSecond = NAN, MFU = NAN;
};

/// The header of loss.csv: the columns that a rerun reproduces bit for bit
/// first (step .. val_loss), then the timings.
extern const char LossCsvHeader[];
/// The header and one row per entry; numbers are printed with enough digits
/// to read back the float32 loss exactly, NaNs as empty fields.
std::string lossCsv(llvm::ArrayRef<LossRow> Rows);

/// A line plot against step: the training loss, its moving average over a
/// window of about a twentieth of the steps (from 20 steps on), and the
/// validation losses as dots joined by a line, with a legend; axes with tick
/// labels, the title. Non-finite values are skipped.
std::string lossSvg(llvm::ArrayRef<LossRow> Rows, llvm::StringRef Title);

/// "12,345".
std::string groupThousands(int64_t N);

/// "1.23 TFLOP", "456 GFLOP", "78.9 MFLOP": three significant digits.
std::string flopCount(double Flops);
/// The same with "/s".
std::string flopRate(double FlopsPerSecond);

/// "step 7/20 [#######.............] loss 4.1234 lr 9.8e-04 gnorm 1.23
/// 12,345 tok/s 1.23 GFLOP/s MFU 4.5%" (the bar only when BarWidth > 0;
/// gnorm, FLOP/s and MFU only when measured).
std::string progressLine(int64_t Steps, const LossRow &Row,
                         unsigned BarWidth = 20);

/// Prints progress lines to OS: a bar redrawn in place on a terminal (every
/// step), otherwise a line without the bar every Every steps and at the
/// first and last.
class ProgressBar {
public:
  ProgressBar(llvm::raw_ostream &OS, bool Terminal, int64_t Every = 1)
      : OS(OS), Tty(Terminal), Every(Every) {}
  void update(int64_t Steps, const LossRow &Row, int64_t FirstStep);
  /// A line of its own (a validation loss, a warning), not overwritten.
  void note(llvm::StringRef Line);
  /// Ends the in-place line (a newline on a terminal).
  void finish();

private:
  llvm::raw_ostream &OS;
  bool Tty;
  int64_t Every;
  size_t LastWidth = 0;
};

} // namespace sp

#endif // SP_RUNTIME_LOSSLOG_H
