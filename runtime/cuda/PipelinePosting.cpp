//===- PipelinePosting.cpp - How pipeline messages are posted to NCCL -----===//
//
// See PipelinePosting.h.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/PipelinePosting.h"
#include "llvm/Support/FormatVariadic.h"
#include <map>

using namespace llvm;

namespace sp::cuda {

std::vector<Message> pipelineMessages(const Program &P, int Stage) {
  std::vector<Message> M;
  for (const Instruction &I : P.Instrs) {
    switch (I.Op) {
    case OpKind::Send:
      M.push_back({Message::Send, int(attrInt(I.Op, I.Attrs, "peer"))});
      break;
    case OpKind::Recv:
      M.push_back({Message::Recv, int(attrInt(I.Op, I.Attrs, "peer"))});
      break;
    case OpKind::PipeAllReduce: {
      auto Ranks = attrInts(I.Op, I.Attrs, "ranks");
      if (Ranks.empty())
        break;
      if (Ranks[0] == Stage) {
        for (size_t K = 1; K < Ranks.size(); ++K)
          M.push_back({Message::Recv, int(Ranks[K])});
        for (size_t K = 1; K < Ranks.size(); ++K)
          M.push_back({Message::Send, int(Ranks[K])});
      } else {
        M.push_back({Message::Send, int(Ranks[0])});
        M.push_back({Message::Recv, int(Ranks[0])});
      }
      break;
    }
    case OpKind::PipeBroadcast:
      M.push_back({Message::Broadcast, -1});
      break;
    case OpKind::GradNorm:
      if (attrInt(I.Op, I.Attrs, "pipeline"))
        M.push_back({Message::Broadcast, -1});
      break;
    default:
      break;
    }
  }
  return M;
}

std::vector<std::vector<Message>> postingGroups(ArrayRef<Message> M,
                                                bool Buffered) {
  std::vector<std::vector<Message>> Groups, Held(1);
  auto FlushHeld = [&] {
    if (!Held.back().empty())
      Groups.push_back(std::move(Held.back()));
    Held.back().clear();
  };
  for (const Message &X : M) {
    if (!Buffered) {
      Groups.push_back({X});
      continue;
    }
    switch (X.Kind) {
    case Message::Send:
      Held.back().push_back(X);
      break;
    case Message::Recv:
      Held.back().push_back(X);
      FlushHeld();
      break;
    case Message::Broadcast:
      FlushHeld();
      Groups.push_back({X});
      break;
    }
  }
  FlushHeld(); // synchronize() posts what is left
  return Groups;
}

std::string
simulatePosting(ArrayRef<std::vector<std::vector<Message>>> Stages) {
  size_t N = Stages.size();
  std::vector<size_t> At(N, 0);
  // Messages posted so far per (sender, receiver).
  std::map<std::pair<int, int>, int64_t> Sent, Received;
  auto Post = [&](size_t R) {
    if (At[R] >= Stages[R].size())
      return;
    for (const Message &X : Stages[R][At[R]]) {
      if (X.Kind == Message::Send)
        ++Sent[{int(R), X.Peer}];
      else if (X.Kind == Message::Recv)
        ++Received[{X.Peer, int(R)}];
    }
  };
  // A stage's current group is done when all it has posted is matched.
  auto Matched = [&](size_t R) {
    for (auto &[Pair, Count] : Sent)
      if (Pair.first == int(R) && Received[Pair] < Count)
        return false;
    for (auto &[Pair, Count] : Received)
      if (Pair.second == int(R) && Sent[Pair] < Count)
        return false;
    return true;
  };
  auto IsBroadcast = [&](size_t R) {
    return At[R] < Stages[R].size() &&
           Stages[R][At[R]][0].Kind == Message::Broadcast;
  };
  for (size_t R = 0; R < N; ++R)
    Post(R);
  while (true) {
    bool Progress = false;
    bool AllAtBroadcast = N > 0;
    for (size_t R = 0; R < N; ++R)
      AllAtBroadcast &= IsBroadcast(R);
    if (AllAtBroadcast) {
      for (size_t R = 0; R < N; ++R) {
        ++At[R];
        Post(R);
      }
      Progress = true;
    }
    for (size_t R = 0; R < N; ++R)
      if (At[R] < Stages[R].size() && !IsBroadcast(R) && Matched(R)) {
        ++At[R];
        Post(R);
        Progress = true;
      }
    bool Done = true;
    for (size_t R = 0; R < N; ++R)
      Done &= At[R] >= Stages[R].size();
    if (Done)
      return "";
    if (!Progress) {
      std::string Stuck;
      for (size_t R = 0; R < N; ++R)
        Stuck += formatv("{0}stage {1} at group {2} of {3}", R ? ", " : "", R,
                         At[R], Stages[R].size())
                     .str();
      return Stuck;
    }
  }
}

} // namespace sp::cuda
