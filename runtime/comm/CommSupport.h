//===- CommSupport.h - Checks and reductions shared by comms ---*- C++ -*-===//
//
// Private to runtime/comm: the argument checks every communicator makes
// before a call (each returns an empty string when the arguments are fine,
// else the cause, so the thread communicator can post it to the other ranks),
// the error format ("<name>: <call>: <cause>"), and the element-wise
// reductions in rank order.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_COMM_COMMSUPPORT_H
#define SP_RUNTIME_COMM_COMMSUPPORT_H

#include "runtime/comm/Communicator.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/Twine.h"
#include <cmath>
#include <cstdint>
#include <string>

namespace sp {
namespace comm {

/// "<name>: <Op>: <Cause>", the form of every communicator error.
inline llvm::Error makeError(const Communicator &C, llvm::StringRef Op,
                             const llvm::Twine &Cause) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 (C.name() + ": " + Op + ": " + Cause).str());
}

/// A buffer of Count elements of ElemBytes bytes named What ("data", "in").
inline std::string checkBuffer(llvm::StringRef What, const void *Ptr,
                               int64_t Count, int64_t ElemBytes = 1) {
  if (Count < 0)
    return ("negative count " + llvm::Twine(Count)).str();
  // Bytes times a rank count (up to 2^16) must fit in int64.
  if (Count > (INT64_MAX / ElemBytes) >> 16)
    return ("count " + llvm::Twine(Count) + " is too large").str();
  if (Count > 0 && !Ptr)
    return ("null " + What + " buffer for count " + llvm::Twine(Count)).str();
  return "";
}

/// Output and input buffers of a collective must not overlap.
inline std::string checkDisjoint(const void *Out, int64_t OutBytes,
                                 const void *In, int64_t InBytes) {
  if (OutBytes <= 0 || InBytes <= 0)
    return "";
  auto O = reinterpret_cast<uintptr_t>(Out);
  auto I = reinterpret_cast<uintptr_t>(In);
  if (O < I + static_cast<uintptr_t>(InBytes) &&
      I < O + static_cast<uintptr_t>(OutBytes))
    return "output and input buffers overlap";
  return "";
}

/// What ("root", "peer") must be a rank of a communicator of Size ranks.
inline std::string checkRank(llvm::StringRef What, int Rank, int Size) {
  if (Rank < 0 || Rank >= Size)
    return (What + " " + llvm::Twine(Rank) + " is not a rank of a " +
            llvm::Twine(Size) + "-rank communicator")
        .str();
  return "";
}

inline std::string checkTag(int Tag) {
  if (Tag < 0)
    return ("negative tag " + llvm::Twine(Tag)).str();
  return "";
}

inline std::string checkColor(int Color) {
  if (Color < 0)
    return ("negative color " + llvm::Twine(Color) +
            " (every rank must join a group)")
        .str();
  return "";
}

/// The first non-empty cause of a list of checks.
inline std::string firstProblem(std::initializer_list<std::string> Causes) {
  for (const std::string &C : Causes)
    if (!C.empty())
      return C;
  return "";
}

/// The buffers of a collective that reads InCount elements of ElemBytes
/// bytes at In and writes OutCount ones at Out (allGather: Count and Count
/// ranks; reduceScatterSum: the other way round): the input, the output,
/// and that they do not overlap, in that order.
inline std::string checkInOut(const void *Out, int64_t OutCount, const void *In,
                              int64_t InCount, int64_t ElemBytes) {
  return firstProblem(
      {checkBuffer("input", In, InCount, ElemBytes),
       checkBuffer("output", Out, OutCount, ElemBytes),
       checkDisjoint(Out, OutCount * ElemBytes, In, InCount * ElemBytes)});
}

/// A send or receive of Bytes at Data with rank Peer of a communicator of
/// Size ranks, under Tag.
inline std::string checkMessage(const void *Data, int64_t Bytes, int Peer,
                                int Tag, int Size) {
  return firstProblem({checkBuffer("data", Data, Bytes),
                       checkRank("peer", Peer, Size), checkTag(Tag)});
}

/// Out = In[0] + In[1] + ... in rank order, element-wise over Count
/// elements of type T: the sum allReduceSum and reduceScatterSum define
/// (16-bit floats widened, summed in float, rounded once). Out may be In[0]
/// but no other input.
void sumInRankOrder(CommType T, void *Out, llvm::ArrayRef<const void *> In,
                    int64_t Count);

/// Acc[i] = max(Acc[i], In[i]), NaN when either is NaN.
inline void accumulateMax(float *Acc, const float *In, int64_t Count) {
  for (int64_t I = 0; I < Count; ++I)
    if (In[I] > Acc[I] || std::isnan(In[I]))
      Acc[I] = In[I];
}

} // namespace comm
} // namespace sp

#endif // SP_RUNTIME_COMM_COMMSUPPORT_H
