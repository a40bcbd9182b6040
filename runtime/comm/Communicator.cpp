//===- Communicator.cpp - The interface and the single-rank communicator --===//
//
// One rank needs no communication library: its collectives are copies (or
// nothing, in place), and it has no peer to send to.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/Communicator.h"
#include "runtime/comm/CommSupport.h"
#include <cstring>

using namespace llvm;

namespace sp {

Communicator::~Communicator() = default;

namespace {

class SingleRankCommunicator final : public Communicator {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single 0/1"; }

  Error allReduceSum(float *Data, int64_t Count) override {
    return check("allReduceSum", comm::checkBuffer("data", Data, Count, 4));
  }
  Error allReduceMax(float *Data, int64_t Count) override {
    return check("allReduceMax", comm::checkBuffer("data", Data, Count, 4));
  }
  Error allReduceSum(int64_t *Data, int64_t Count) override {
    return check("allReduceSum", comm::checkBuffer("data", Data, Count, 8));
  }

  Error allGather(float *Out, const float *In, int64_t Count) override {
    return copy("allGather", Out, In, Count);
  }
  Error reduceScatterSum(float *Out, const float *In, int64_t Count) override {
    return copy("reduceScatterSum", Out, In, Count);
  }

  Error broadcast(void *Data, int64_t Bytes, int Root) override {
    return check("broadcast",
                 comm::firstProblem({comm::checkBuffer("data", Data, Bytes),
                                     comm::checkRank("root", Root, 1)}));
  }

  Error send(const void *Data, int64_t Bytes, int Peer, int Tag) override {
    return noPeer("send", Peer);
  }
  Error recv(void *Data, int64_t Bytes, int Peer, int Tag) override {
    return noPeer("recv", Peer);
  }

  Error barrier() override { return check("barrier", ""); }

  Expected<std::unique_ptr<Communicator>> split(int Color, int Key) override {
    if (Error E = check("split", comm::checkColor(Color)))
      return E;
    return createSingleRankCommunicator();
  }

  void abort(StringRef Reason) override {
    if (!Aborted) {
      Aborted = true;
      AbortReason = Reason.str();
    }
  }

private:
  /// Fails when aborted or when Cause (an argument check) is non-empty.
  Error check(StringRef Op, const std::string &Cause) const {
    if (Aborted)
      return comm::makeError(*this, Op, "aborted: " + AbortReason);
    if (!Cause.empty())
      return comm::makeError(*this, Op, Cause);
    return Error::success();
  }

  Error copy(StringRef Op, float *Out, const float *In, int64_t Count) {
    if (Error E = check(Op, comm::firstProblem(
                                {comm::checkBuffer("output", Out, Count, 4),
                                 comm::checkBuffer("input", In, Count, 4),
                                 comm::checkDisjoint(Out, Count * 4, In,
                                                     Count * 4)})))
      return E;
    if (Count > 0)
      std::memcpy(Out, In, Count * sizeof(float));
    return Error::success();
  }

  Error noPeer(StringRef Op, int Peer) const {
    if (Error E = check(Op, ""))
      return E;
    return comm::makeError(*this, Op,
                           "a single-rank communicator has no peer (peer " +
                               Twine(Peer) + ")");
  }

  bool Aborted = false;
  std::string AbortReason;
};

} // namespace

std::unique_ptr<Communicator> createSingleRankCommunicator() {
  return std::make_unique<SingleRankCommunicator>();
}

} // namespace sp
