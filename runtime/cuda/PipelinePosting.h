//===- PipelinePosting.h - How pipeline messages are posted to NCCL -*- C++ -*-===//
//
// The CPU backend's pipeline sends are buffered: a send never waits for its
// receive, and sp-compile's schedules rely on it (in 1F1B both stages send
// first). NCCL's sends wait for the matching receive, so the CUDA backend
// posts them as follows (CudaBackend.cpp, deferSend / flushSends):
//
//  - a send copies its data to a staging slot and is held;
//  - a receive posts the held sends and itself as one NCCL group (whose
//    members progress together);
//  - a collective of the pipeline group (pipe_broadcast, grad_norm's sum
//    over the stages), a communicator's creation and every host wait first
//    post the held sends as a group of their own. Other collectives (tensor
//    and data groups) do not: posting a send alone blocks the stream until
//    its receive, which holding it does not.
//
// This file states that policy on the host, with a simulation of NCCL's
// matching (the k-th send from r to q meets the k-th receive at q from r; a
// group completes when all its members have met theirs; a pipe_broadcast
// is a collective of the whole pipeline group), so that the tests check
// that every compiled schedule completes under it (and deadlocks when every
// message is posted alone).
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_PIPELINEPOSTING_H
#define SP_RUNTIME_CUDA_PIPELINEPOSTING_H

#include "plan/Program.h"
#include "llvm/ADT/ArrayRef.h"
#include <string>
#include <vector>

namespace sp::cuda {

struct Message {
  enum KindT : uint8_t { Send, Recv, Broadcast } Kind;
  int Peer = -1; // Send, Recv
};

/// A stage's pipeline messages in program order, as the backend issues
/// them: send, recv, pipe_all_reduce as its sends and receives (the first
/// listed stage receives every part, then sends the sum back), pipe_broadcast
/// and a grad_norm summed over the stages as a Broadcast (a collective of the
/// whole pipeline group).
std::vector<Message> pipelineMessages(const Program &P, int Stage);

/// The NCCL groups a stage posts: with Buffered, the policy above; without,
/// every message alone (NCCL's own semantics).
std::vector<std::vector<Message>> postingGroups(llvm::ArrayRef<Message> M,
                                                bool Buffered);

/// Simulates the stages posting their groups (one in-order stream each);
/// returns "" when all complete, else where they are stuck.
std::string simulatePosting(
    llvm::ArrayRef<std::vector<std::vector<Message>>> Stages);

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_PIPELINEPOSTING_H
