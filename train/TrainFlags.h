//===- TrainFlags.h - sp-run's command line, bound to TrainOptions -*- C++ -*-===//
//
// The table of sp-run's flags: each one is bound to its field of a
// TrainOptions (cl::location), so parsing the command line fills the
// options directly. The backends' own flags (runtime/BackendRegistry.h:
// --tf32, --cuda-attention, ...) come from the registry's entries, so a
// backend brings its flags with it. Make a TrainFlags before
// cl::ParseCommandLineOptions and call collect() after it.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TRAIN_TRAINFLAGS_H
#define SP_TRAIN_TRAINFLAGS_H

#include "train/TrainOptions.h"
#include "llvm/Support/CommandLine.h"
#include <memory>
#include <string>
#include <vector>

namespace sp {

class TrainFlags {
public:
  /// Registers the flags in Cat, bound to O's fields; they stay registered
  /// while this lives.
  TrainFlags(TrainOptions &O, llvm::cl::OptionCategory &Cat);
  ~TrainFlags();
  TrainFlags(const TrainFlags &) = delete;
  TrainFlags &operator=(const TrainFlags &) = delete;

  /// After parsing: the names of the flags given (O.Given) and the values
  /// of the backends' flags given (O.BackendFlags).
  void collect();

private:
  TrainOptions &O;
  llvm::cl::OptionCategory &Cat;
  std::vector<std::unique_ptr<llvm::cl::Option>> Options;
  /// The backends' flags: name, switch or value.
  struct BackendOption {
    std::string Name;
    llvm::cl::opt<bool> *Switch = nullptr;
    llvm::cl::opt<std::string> *Value = nullptr;
  };
  std::vector<BackendOption> BackendOptions;
  std::string DeviceHelp, DeviceValueDesc; // the --device help's text

  template <typename T, typename... Mods>
  void add(const char *Name, T &Field, const Mods &...M);
  void addBackendFlags();
};

} // namespace sp

#endif // SP_TRAIN_TRAINFLAGS_H
