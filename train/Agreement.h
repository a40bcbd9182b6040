//===- Agreement.h - Outcomes every rank of a run agrees on -----*- C++ -*-===//
//
// A step every rank takes (a lock, a checkpoint shard, a restore, making the
// backend) may fail on one rank only. The ranks then agree on the outcome
// with a collective, so that none goes on to wait for the others: each
// returns the same AgreedError, and under MPI the ranks exit with it instead
// of aborting the job.
//
//===----------------------------------------------------------------------===//
#ifndef SP_TRAIN_AGREEMENT_H
#define SP_TRAIN_AGREEMENT_H

#include "runtime/comm/Communicator.h"
#include "llvm/Support/Error.h"
#include <string>
#include <vector>

namespace sp {

/// An error that every rank of a run reports the same (they agreed on it
/// with a collective), so that none is left waiting.
class AgreedError : public llvm::ErrorInfo<AgreedError> {
public:
  static char ID;
  explicit AgreedError(std::string Msg) : Msg(std::move(Msg)) {}
  void log(llvm::raw_ostream &OS) const override { OS << Msg; }
  std::error_code convertToErrorCode() const override {
    return llvm::inconvertibleErrorCode();
  }
  const std::string &text() const { return Msg; }

private:
  std::string Msg;
};

/// Local is this rank's outcome of a step every rank of World took (World
/// null: one rank): if any rank failed, every rank returns the lowest
/// failing rank's error as an AgreedError.
llvm::Error agreeOnError(Communicator *World, llvm::Error Local);

/// Every rank's string on rank 0, in rank order (the others get nothing);
/// point to point with Tag over World.
llvm::Expected<std::vector<std::string>>
gatherOnRankZero(Communicator *World, std::string Mine, int Tag);

} // namespace sp

#endif // SP_TRAIN_AGREEMENT_H
