//===- GradientBuckets.cpp - Data-parallel gradient sums in buckets -------===//
#include "lower/GradientBuckets.h"
#include "lower/MemoryPlan.h"
#include "lower/ProgramPass.h"
#include <algorithm>
#include <map>

namespace sp {

namespace {

/// A data-parallel gradient sum: an all_reduce, or with ZeRO a flat
/// reduce_scatter.
bool isGradientSum(const Instruction &I) {
  bool Sum = I.Op == OpKind::AllReduce ||
             (I.Op == OpKind::ReduceScatter && I.Attrs.getInt("flat", 0));
  return Sum && I.In.size() == 1 && I.Out.size() == 1 &&
         collectiveGroup(I.Op, I.Attrs) == "dp" &&
         I.Attrs.getInt("bucket_bytes", 0) > 0;
}

} // namespace

int bucketGradientSums(Program &P) {
  int N = P.Instrs.size();
  // The last writer of every buffer before each sum reads it.
  std::vector<int> LastWriter(P.Buffers.size(), -1);
  struct Sum {
    int Index, Ready;
  };
  std::vector<Sum> Sums;
  for (int K = 0; K < N; ++K) {
    const Instruction &I = P.Instrs[K];
    if (isGradientSum(I))
      Sums.push_back({K, LastWriter[I.In[0]]});
    for (int B : I.Out)
      LastWriter[B] = K;
  }
  if (Sums.empty())
    return 0;
  std::stable_sort(Sums.begin(), Sums.end(), [](const Sum &A, const Sum &B) {
    return A.Ready < B.Ready;
  });
  // Greedy buckets in the order the gradients are finished.
  std::vector<std::vector<Sum>> Buckets;
  int64_t Bytes = 0;
  for (const Sum &S : Sums) {
    const Instruction &I = P.Instrs[S.Index];
    if (I.Op != P.Instrs[Sums.front().Index].Op)
      return 0; // one kind of sum per program
    int64_t Limit = I.Attrs.getInt("bucket_bytes", 0);
    int64_t Size = P.Buffers[I.In[0]].Bytes;
    if (Buckets.empty() || Bytes + Size > Limit) {
      Buckets.emplace_back();
      Bytes = 0;
    }
    Buckets.back().push_back(S);
    Bytes += Size;
  }
  // A bucket goes before every one of its sums was (so before any reader of
  // their results); the data-parallel pass puts them all after the
  // backward, so this always holds for its programs: a program where it
  // does not keeps its sums as they are.
  for (const std::vector<Sum> &B : Buckets)
    for (const Sum &S : B)
      if (B.back().Ready >= S.Index)
        return 0;
  // Each bucket after its last gradient's writer (-1: before everything).
  std::multimap<int, Instruction> After;
  std::vector<bool> Moved(N, false);
  for (size_t K = 0; K < Buckets.size(); ++K) {
    const std::vector<Sum> &B = Buckets[K];
    const Instruction &First = P.Instrs[B.front().Index];
    Instruction All;
    All.Op = First.Op;
    All.Attrs = First.Attrs;
    All.Role = First.Role;
    All.Name = "dp_bucket." + std::to_string(K);
    int Place = B.back().Ready;
    All.Ph = Place >= 0 ? P.Instrs[Place].Ph : First.Ph;
    for (const Sum &S : B) {
      All.In.push_back(P.Instrs[S.Index].In[0]);
      All.Out.push_back(P.Instrs[S.Index].Out[0]);
      Moved[S.Index] = true;
    }
    After.insert({Place, std::move(All)});
  }
  std::vector<Instruction> Instrs;
  Instrs.reserve(N);
  auto Emit = [&](int Place) {
    auto [Lo, Hi] = After.equal_range(Place);
    for (auto It = Lo; It != Hi; ++It)
      Instrs.push_back(std::move(It->second));
  };
  Emit(-1);
  for (int K = 0; K < N; ++K) {
    if (!Moved[K])
      Instrs.push_back(std::move(P.Instrs[K]));
    Emit(K);
  }
  P.Instrs = std::move(Instrs);
  computeLiveRanges(P);
  return int(Buckets.size());
}

int bucketParamGathers(Program &P) {
  auto Joins = [&](const Instruction &Into, const Instruction &I,
                   int64_t Bytes) {
    return Into.Op == OpKind::GatherParam && I.Op == OpKind::GatherParam &&
           Into.Attrs.getInt("parts", 0) == I.Attrs.getInt("parts", 0) &&
           collectiveGroup(Into.Op, Into.Attrs) ==
               collectiveGroup(I.Op, I.Attrs) &&
           Into.Ph == I.Ph &&
           Bytes + P.Buffers[I.In[0]].Bytes <=
               I.Attrs.getInt("bucket_bytes", 0);
  };
  std::vector<Instruction> Instrs;
  Instrs.reserve(P.Instrs.size());
  int Buckets = 0;
  int64_t Bytes = 0; // of the last instruction, when it is a bucket
  for (Instruction &I : P.Instrs) {
    bool Gather = I.Op == OpKind::GatherParam && I.In.size() == 1;
    if (Gather && !Instrs.empty() && Joins(Instrs.back(), I, Bytes)) {
      Instrs.back().In.push_back(I.In[0]);
      Bytes += P.Buffers[I.In[0]].Bytes;
      continue;
    }
    if (Gather) {
      Bytes = P.Buffers[I.In[0]].Bytes;
      I.Name = "dp_gather_bucket." + std::to_string(Buckets++);
    }
    Instrs.push_back(std::move(I));
  }
  P.Instrs = std::move(Instrs);
  computeLiveRanges(P);
  return Buckets;
}

std::unique_ptr<ProgramPass> createBucketGradientsPass() {
  return rewritePass("bucket-gradients", bucketGradientSums);
}

std::unique_ptr<ProgramPass> createBucketParamGathersPass() {
  return rewritePass("bucket-param-gathers", bucketParamGathers);
}

} // namespace sp
