//===- Communicator.cpp - The interface and the single-rank communicator --===//
//
// One rank needs no communication library: its collectives are copies (or
// nothing, in place), and it has no peer to send to.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/Communicator.h"
#include "runtime/comm/CommSupport.h"
#include "ir/Float16.h"
#include "llvm/Support/FormatVariadic.h"
#include <cstring>
#include <vector>

using namespace llvm;

namespace sp {

Communicator::~Communicator() = default;

std::string Communicator::timeoutCause(StringRef Op, StringRef Waiting) const {
  return ("timed out after " +
          Twine(formatv("{0:F1}", Timeout.count() / 1000.0).str()) +
          " s in " + Op + " waiting for " + Waiting +
          " (raise it with --comm-timeout)")
      .str();
}

int64_t commTypeBytes(CommType T) {
  switch (T) {
  case CommType::F32:
    return 4;
  case CommType::BF16:
  case CommType::F16:
    return 2;
  case CommType::I64:
  case CommType::F64:
    return 8;
  }
  llvm_unreachable("unknown element type");
}

const char *commTypeName(CommType T) {
  switch (T) {
  case CommType::F32:
    return "float";
  case CommType::BF16:
    return "bf16";
  case CommType::F16:
    return "f16";
  case CommType::I64:
    return "int64";
  case CommType::F64:
    return "double";
  }
  llvm_unreachable("unknown element type");
}

namespace comm {

template <typename T>
static void sumInOrder(T *Out, ArrayRef<const void *> In, int64_t Count) {
  if (Out != In[0])
    std::memcpy(Out, In[0], Count * sizeof(T));
  for (size_t R = 1; R < In.size(); ++R) {
    const T *X = static_cast<const T *>(In[R]);
    for (int64_t I = 0; I < Count; ++I)
      Out[I] = Out[I] + X[I];
  }
}

template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
static void sum16InOrder(void *Out, ArrayRef<const void *> In, int64_t Count) {
  std::vector<float> Acc(Count);
  for (size_t R = 0; R < In.size(); ++R) {
    const uint16_t *X = static_cast<const uint16_t *>(In[R]);
    for (int64_t I = 0; I < Count; ++I)
      Acc[I] = R ? Acc[I] + Widen(X[I]) : Widen(X[I]);
  }
  uint16_t *Y = static_cast<uint16_t *>(Out);
  for (int64_t I = 0; I < Count; ++I)
    Y[I] = Narrow(Acc[I]);
}

void sumInRankOrder(CommType T, void *Out, ArrayRef<const void *> In,
                    int64_t Count) {
  if (Count <= 0 || In.empty())
    return;
  switch (T) {
  case CommType::F32:
    return sumInOrder(static_cast<float *>(Out), In, Count);
  case CommType::I64:
    return sumInOrder(static_cast<int64_t *>(Out), In, Count);
  case CommType::F64:
    return sumInOrder(static_cast<double *>(Out), In, Count);
  case CommType::BF16:
    return sum16InOrder<bfloat16ToFloat, floatToBFloat16>(Out, In, Count);
  case CommType::F16:
    return sum16InOrder<halfToFloat, floatToHalf>(Out, In, Count);
  }
}

} // namespace comm

namespace {

class SingleRankCommunicator final : public Communicator {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single 0/1"; }

  using Communicator::allGather;
  using Communicator::allReduceSum;
  using Communicator::reduceScatterSum;

  Error allReduceSum(void *Data, int64_t Count, CommType T) override {
    return check("allReduceSum",
                 comm::checkBuffer("data", Data, Count, commTypeBytes(T)));
  }
  Error allReduceMax(float *Data, int64_t Count) override {
    return check("allReduceMax", comm::checkBuffer("data", Data, Count, 4));
  }

  Error allGather(void *Out, const void *In, int64_t Count,
                  CommType T) override {
    return copy("allGather", Out, In, Count, commTypeBytes(T));
  }
  Error reduceScatterSum(void *Out, const void *In, int64_t Count,
                         CommType T) override {
    return copy("reduceScatterSum", Out, In, Count, commTypeBytes(T));
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
    std::unique_ptr<Communicator> C = createSingleRankCommunicator();
    C->setTimeout(Timeout);
    return C;
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

  Error copy(StringRef Op, void *Out, const void *In, int64_t Count,
             int64_t ElemBytes) {
    int64_t Bytes = Count * ElemBytes;
    if (Error E = check(Op, comm::firstProblem(
                                {comm::checkBuffer("output", Out, Count,
                                                   ElemBytes),
                                 comm::checkBuffer("input", In, Count,
                                                   ElemBytes),
                                 comm::checkDisjoint(Out, Bytes, In, Bytes)})))
      return E;
    if (Count > 0)
      std::memcpy(Out, In, Bytes);
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
