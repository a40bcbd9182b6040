//===- CommTest.cpp - Single-rank and thread communicators ----------------===//
//
// Each collective of the thread communicator against a sequential reference
// (bitwise: the sums are in rank order), for 1 to 4 ranks; point to point;
// split into tensor-parallel groups; errors on every rank for mismatched
// calls and bad arguments; abort instead of hangs; and many repeated
// collectives (the scratch build runs this file under -fsanitize=thread).
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/Communicator.h"
#include "ir/Float16.h"
#include "gtest/gtest.h"
#include "TestSupport.h"
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>

using namespace sp;
using namespace sp::test;
using namespace llvm;

namespace {

/// Rank R's input: values of mixed signs and magnitudes, so that the order of
/// a float sum changes its bits.
std::vector<float> rankData(int R, int64_t Count, unsigned Seed = 1) {
  std::mt19937 Gen(Seed * 7919 + R);
  std::uniform_real_distribution<float> Mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> Exponent(-8, 8);
  std::vector<float> V(Count);
  for (float &X : V)
    X = std::ldexp(Mantissa(Gen), Exponent(Gen));
  return V;
}

bool sameBits(const std::vector<float> &A, const std::vector<float> &B) {
  return A.size() == B.size() &&
         (A.empty() || std::memcmp(A.data(), B.data(), A.size() * 4) == 0);
}

/// Sequential sum over ranks 0..N-1 of chunk Chunk (Count elements) of each
/// rank's data, starting from rank 0's value.
std::vector<float> referenceSum(const std::vector<std::vector<float>> &In,
                                int64_t Count, int64_t Chunk = 0) {
  std::vector<float> Sum(In[0].begin() + Chunk * Count,
                         In[0].begin() + (Chunk + 1) * Count);
  for (size_t R = 1; R < In.size(); ++R)
    for (int64_t I = 0; I < Count; ++I)
      Sum[I] = Sum[I] + In[R][Chunk * Count + I];
  return Sum;
}

/// Runs Body on N thread ranks and expects every rank to succeed.
void runRanks(int N, function_ref<Error(Communicator &)> Body) {
  EXPECT_EQ(errorText(runOnThreadRanks(N, Body)), "");
}

class CommRanks : public ::testing::TestWithParam<int> {};

TEST_P(CommRanks, AllReduceSumIsTheSequentialSumBitwise) {
  int N = GetParam();
  for (int64_t Count : {int64_t(0), int64_t(1), int64_t(1037)}) {
    std::vector<std::vector<float>> In, Out(N);
    for (int R = 0; R < N; ++R)
      In.push_back(rankData(R, Count));
    runRanks(N, [&](Communicator &C) -> Error {
      std::vector<float> Data = In[C.rank()];
      if (Error E = C.allReduceSum(Data.data(), Count))
        return E;
      Out[C.rank()] = std::move(Data);
      return Error::success();
    });
    std::vector<float> Expected = referenceSum(In, Count);
    for (int R = 0; R < N; ++R)
      EXPECT_TRUE(sameBits(Out[R], Expected)) << "rank " << R << " count " << Count;
  }
}

TEST_P(CommRanks, AllReduceMaxPropagatesNaN) {
  int N = GetParam();
  const int64_t Count = 300;
  std::vector<std::vector<float>> In, Out(N);
  for (int R = 0; R < N; ++R)
    In.push_back(rankData(R, Count, 2));
  In[N - 1][17] = std::nanf("");
  runRanks(N, [&](Communicator &C) -> Error {
    std::vector<float> Data = In[C.rank()];
    if (Error E = C.allReduceMax(Data.data(), Count))
      return E;
    Out[C.rank()] = std::move(Data);
    return Error::success();
  });
  for (int R = 0; R < N; ++R) {
    ASSERT_EQ(Out[R].size(), size_t(Count));
    for (int64_t I = 0; I < Count; ++I) {
      if (I == 17) {
        EXPECT_TRUE(std::isnan(Out[R][I]));
        continue;
      }
      float Max = In[0][I];
      for (int S = 1; S < N; ++S)
        Max = std::max(Max, In[S][I]);
      EXPECT_EQ(Out[R][I], Max) << "rank " << R << " element " << I;
    }
  }
}

TEST_P(CommRanks, AllReduceSumOfInt64IsExact) {
  int N = GetParam();
  std::vector<std::vector<int64_t>> Out(N);
  runRanks(N, [&](Communicator &C) -> Error {
    std::vector<int64_t> Data = {int64_t(1) << 40, C.rank(), -3};
    if (Error E = C.allReduceSum(Data.data(), 3))
      return E;
    Out[C.rank()] = Data;
    return Error::success();
  });
  std::vector<int64_t> Expected = {N * (int64_t(1) << 40), N * (N - 1) / 2,
                                   -3 * N};
  for (int R = 0; R < N; ++R)
    EXPECT_EQ(Out[R], Expected);
}

TEST_P(CommRanks, AllGatherConcatenatesInRankOrder) {
  int N = GetParam();
  const int64_t Count = 129;
  std::vector<std::vector<float>> In, Out(N);
  for (int R = 0; R < N; ++R)
    In.push_back(rankData(R, Count, 3));
  runRanks(N, [&](Communicator &C) -> Error {
    std::vector<float> Gathered(N * Count, -1.0f);
    if (Error E = C.allGather(Gathered.data(), In[C.rank()].data(), Count))
      return E;
    Out[C.rank()] = std::move(Gathered);
    return Error::success();
  });
  std::vector<float> Expected;
  for (int R = 0; R < N; ++R)
    Expected.insert(Expected.end(), In[R].begin(), In[R].end());
  for (int R = 0; R < N; ++R)
    EXPECT_TRUE(sameBits(Out[R], Expected)) << "rank " << R;
}

TEST_P(CommRanks, ReduceScatterSumIsTheSequentialSumOfEachChunk) {
  int N = GetParam();
  const int64_t Count = 211;
  std::vector<std::vector<float>> In, Out(N);
  for (int R = 0; R < N; ++R)
    In.push_back(rankData(R, N * Count, 4));
  runRanks(N, [&](Communicator &C) -> Error {
    std::vector<float> Chunk(Count);
    if (Error E = C.reduceScatterSum(Chunk.data(), In[C.rank()].data(), Count))
      return E;
    Out[C.rank()] = std::move(Chunk);
    return Error::success();
  });
  for (int R = 0; R < N; ++R)
    EXPECT_TRUE(sameBits(Out[R], referenceSum(In, Count, R))) << "rank " << R;
}

/// bf16 and f16 collectives: a gather moves the bits; a sum widens every
/// rank's term, adds in float in rank order and rounds once, bitwise.
TEST_P(CommRanks, SixteenBitCollectivesSumInFloatAndRoundOnce) {
  int N = GetParam();
  const int64_t Count = 257;
  struct Format {
    CommType T;
    uint16_t (*Narrow)(float);
    float (*Widen)(uint16_t);
  };
  for (Format F : {Format{CommType::BF16, floatToBFloat16, bfloat16ToFloat},
                   Format{CommType::F16, floatToHalf, halfToFloat}}) {
    // Rank r's element i, as 16-bit values (mixed magnitudes: each add of a
    // rounded sum would lose bits).
    std::vector<std::vector<uint16_t>> In(N);
    for (int R = 0; R < N; ++R) {
      std::vector<float> V = rankData(R, Count * N, 3);
      for (float X : V)
        In[R].push_back(F.Narrow(X));
    }
    auto RoundedSum = [&](int64_t Chunk, int64_t I) {
      float Acc = 0;
      for (int R = 0; R < N; ++R)
        Acc = R ? Acc + F.Widen(In[R][Chunk * Count + I])
                : F.Widen(In[R][Chunk * Count + I]);
      return F.Narrow(Acc);
    };
    std::vector<std::vector<uint16_t>> Sum(N), Gathered(N), Scattered(N);
    runRanks(N, [&](Communicator &C) -> Error {
      int R = C.rank();
      Sum[R].assign(In[R].begin(), In[R].begin() + Count);
      if (Error E = C.allReduceSum(Sum[R].data(), Count, F.T))
        return E;
      Gathered[R].assign(N * Count, 0);
      if (Error E = C.allGather(Gathered[R].data(), In[R].data(), Count, F.T))
        return E;
      Scattered[R].assign(Count, 0);
      return C.reduceScatterSum(Scattered[R].data(), In[R].data(), Count,
                                F.T);
    });
    for (int R = 0; R < N; ++R)
      for (int64_t I = 0; I < Count; ++I) {
        ASSERT_EQ(Sum[R][I], RoundedSum(0, I))
            << commTypeName(F.T) << " sum, rank " << R << " element " << I;
        ASSERT_EQ(Scattered[R][I], RoundedSum(R, I))
            << commTypeName(F.T) << " reduce-scatter, rank " << R;
        for (int S = 0; S < N; ++S)
          ASSERT_EQ(Gathered[R][S * Count + I], In[S][I])
              << commTypeName(F.T) << " gather, rank " << R;
      }
  }
  // A type mismatch between ranks is a mismatch like any other.
  if (N > 1) {
    Error E = runOnThreadRanks(N, [&](Communicator &C) -> Error {
      std::vector<uint16_t> V(4);
      return C.allReduceSum(V.data(), 4,
                            C.rank() ? CommType::F16 : CommType::BF16);
    });
    EXPECT_NE(errorText(std::move(E))
                  .find("called allReduceSum(bf16) of 4 elements but rank 1 "
                        "called allReduceSum(f16) of 4 elements"),
              std::string::npos);
  }
}

TEST_P(CommRanks, BroadcastFromEveryRoot) {
  int N = GetParam();
  for (int Root = 0; Root < N; ++Root) {
    std::vector<std::vector<char>> Out(N);
    runRanks(N, [&](Communicator &C) -> Error {
      std::vector<char> Data(1001, static_cast<char>(C.rank()));
      if (Error E = C.broadcast(Data.data(), Data.size(), Root))
        return E;
      Out[C.rank()] = std::move(Data);
      return Error::success();
    });
    for (int R = 0; R < N; ++R)
      EXPECT_EQ(Out[R], std::vector<char>(1001, static_cast<char>(Root)))
          << "rank " << R << " root " << Root;
  }
}

TEST_P(CommRanks, BarrierWaitsForEveryRank) {
  int N = GetParam();
  std::atomic<int> Arrived{0};
  std::vector<int> Seen(N, -1);
  runRanks(N, [&](Communicator &C) -> Error {
    if (C.rank() == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ++Arrived;
    if (Error E = C.barrier())
      return E;
    Seen[C.rank()] = Arrived.load();
    return Error::success();
  });
  EXPECT_EQ(Seen, std::vector<int>(N, N));
}

TEST_P(CommRanks, SendRecvRing) {
  int N = GetParam();
  std::vector<std::vector<int>> Got(N);
  runRanks(N, [&](Communicator &C) -> Error {
    int R = C.rank();
    // Tags 1 and 2 carry different messages between the same pair.
    std::vector<int> First = {R, 10 * R}, Second = {-R};
    if (Error E = C.send(First.data(), 8, (R + 1) % N, 1))
      return E;
    if (Error E = C.send(Second.data(), 4, (R + 1) % N, 2))
      return E;
    std::vector<int> A(2), B(1);
    int From = (R + N - 1) % N;
    if (Error E = C.recv(B.data(), 4, From, 2))
      return E;
    if (Error E = C.recv(A.data(), 8, From, 1))
      return E;
    Got[R] = {A[0], A[1], B[0]};
    return Error::success();
  });
  for (int R = 0; R < N; ++R) {
    int From = (R + N - 1) % N;
    EXPECT_EQ(Got[R], (std::vector<int>{From, 10 * From, -From}));
  }
}

TEST_P(CommRanks, ManyRepeatedCollectives) {
  int N = GetParam();
  const int Rounds = 300;
  runRanks(N, [&](Communicator &C) -> Error {
    int R = C.rank();
    for (int Round = 0; Round < Rounds; ++Round) {
      int64_t Count = 1 + Round % 7;
      // Sum of (round + rank) over ranks.
      std::vector<float> Data(Count, float(Round + R));
      if (Error E = C.allReduceSum(Data.data(), Count))
        return E;
      float Sum = float(N * Round + N * (N - 1) / 2);
      for (float X : Data)
        if (X != Sum)
          return createStringError(inconvertibleErrorCode(),
                                   "round %d: sum %g, expected %g", Round, X,
                                   Sum);
      std::vector<float> Gathered(N * Count);
      std::vector<float> Mine(Count, float(R * 1000 + Round));
      if (Error E = C.allGather(Gathered.data(), Mine.data(), Count))
        return E;
      for (int S = 0; S < N; ++S)
        if (Gathered[S * Count] != float(S * 1000 + Round))
          return createStringError(inconvertibleErrorCode(),
                                   "round %d: wrong gather", Round);
      std::vector<float> Chunks(N * Count, 1.0f), Chunk(Count);
      if (Error E = C.reduceScatterSum(Chunk.data(), Chunks.data(), Count))
        return E;
      if (Chunk[0] != float(N))
        return createStringError(inconvertibleErrorCode(),
                                 "round %d: wrong reduce-scatter", Round);
      int Value = R == Round % N ? Round : -1;
      if (Error E = C.broadcast(&Value, sizeof(Value), Round % N))
        return E;
      if (Value != Round)
        return createStringError(inconvertibleErrorCode(),
                                 "round %d: wrong broadcast", Round);
    }
    return C.barrier();
  });
}

TEST_P(CommRanks, MismatchedCallsFailOnEveryRankAndLeaveTheGroupUsable) {
  int N = GetParam();
  if (N < 2)
    GTEST_SKIP() << "needs two ranks";
  std::vector<std::string> Errors(N);
  runRanks(N, [&](Communicator &C) -> Error {
    std::vector<float> Data(8, 1.0f);
    Errors[C.rank()] =
        errorText(C.allReduceSum(Data.data(), C.rank() == 1 ? 5 : 4));
    return C.barrier();
  });
  for (int R = 0; R < N; ++R)
    EXPECT_NE(Errors[R].find("allReduceSum: collective mismatch: rank 0 "
                             "called allReduceSum(float) of 4 elements but "
                             "rank 1 called allReduceSum(float) of 5 elements"),
              std::string::npos)
        << Errors[R];
}

TEST_P(CommRanks, BadArgumentOnOneRankFailsOnEveryRank) {
  int N = GetParam();
  std::vector<std::string> Errors(N);
  runRanks(N, [&](Communicator &C) -> Error {
    int Value = 0;
    Errors[C.rank()] = errorText(
        C.broadcast(&Value, sizeof(Value), C.rank() == N - 1 ? N + 6 : 0));
    return Error::success();
  });
  for (int R = 0; R < N; ++R)
    EXPECT_NE(Errors[R].find(("broadcast: rank " + Twine(N - 1) + ": root " +
                              Twine(N + 6) + " is not a rank of a " +
                              Twine(N) + "-rank communicator")
                                 .str()),
              std::string::npos)
        << Errors[R];
}

INSTANTIATE_TEST_SUITE_P(Comm, CommRanks, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int> &Info) {
                           return std::to_string(Info.param) + "Ranks";
                         });

TEST(CommTest, PingPong) {
  const int Rounds = 200;
  runRanks(2, [&](Communicator &C) -> Error {
    int64_t Ball = 0;
    int Peer = 1 - C.rank();
    for (int I = 0; I < Rounds; ++I) {
      if ((I % 2) == C.rank()) {
        ++Ball;
        if (Error E = C.send(&Ball, sizeof(Ball), Peer, 7))
          return E;
      } else if (Error E = C.recv(&Ball, sizeof(Ball), Peer, 7)) {
        return E;
      }
    }
    if (Ball != Rounds)
      return createStringError(inconvertibleErrorCode(), "ball %lld",
                               (long long)Ball);
    return Error::success();
  });
}

TEST(CommTest, SplitIntoTensorParallelGroups) {
  // 4 ranks = 2 data-parallel x 2 tensor-parallel: TP groups {0,1} {2,3},
  // DP groups {0,2} {1,3}; the groups work independently and interleaved.
  std::vector<std::vector<float>> In;
  for (int R = 0; R < 4; ++R)
    In.push_back(rankData(R, 97, 5));
  std::vector<std::vector<float>> TpSums(4), DpGathers(4);
  std::vector<std::array<int, 4>> Shapes(4);
  runRanks(4, [&](Communicator &World) -> Error {
    int R = World.rank();
    auto Tp = World.split(/*Color=*/R / 2, /*Key=*/R);
    if (!Tp)
      return Tp.takeError();
    // Reversed keys: rank 3 becomes rank 0 of its DP group.
    auto Dp = World.split(/*Color=*/R % 2, /*Key=*/-R);
    if (!Dp)
      return Dp.takeError();
    Shapes[R] = {(*Tp)->rank(), (*Tp)->size(), (*Dp)->rank(), (*Dp)->size()};
    std::vector<float> Data = In[R];
    for (int Round = 0; Round < 20; ++Round) {
      Data = In[R];
      if (Error E = (*Tp)->allReduceSum(Data.data(), Data.size()))
        return E;
      std::vector<float> Gathered(2 * 3);
      if (Error E = (*Dp)->allGather(Gathered.data(), In[R].data(), 3))
        return E;
      DpGathers[R] = Gathered;
    }
    TpSums[R] = Data;
    // Point to point within a group uses the group's ranks.
    int Peer = 1 - (*Tp)->rank();
    int Mine = R, Theirs = -1;
    if (Error E = (*Tp)->send(&Mine, sizeof(Mine), Peer, 0))
      return E;
    if (Error E = (*Tp)->recv(&Theirs, sizeof(Theirs), Peer, 0))
      return E;
    if (Theirs != (R ^ 1))
      return createStringError(inconvertibleErrorCode(), "rank %d got %d", R,
                               Theirs);
    return World.barrier();
  });
  EXPECT_EQ(Shapes[0], (std::array<int, 4>{0, 2, 1, 2}));
  EXPECT_EQ(Shapes[1], (std::array<int, 4>{1, 2, 1, 2}));
  EXPECT_EQ(Shapes[2], (std::array<int, 4>{0, 2, 0, 2}));
  EXPECT_EQ(Shapes[3], (std::array<int, 4>{1, 2, 0, 2}));
  for (int R = 0; R < 4; ++R) {
    int First = R / 2 * 2;
    EXPECT_TRUE(sameBits(TpSums[R],
                         referenceSum({In[First], In[First + 1]}, 97)))
        << "rank " << R;
    // DP group ordered by key -rank: the higher world rank first.
    int Hi = R % 2 + 2, Lo = R % 2;
    std::vector<float> Expected = {In[Hi][0], In[Hi][1], In[Hi][2],
                                   In[Lo][0], In[Lo][1], In[Lo][2]};
    EXPECT_TRUE(sameBits(DpGathers[R], Expected)) << "rank " << R;
  }
}

TEST(CommTest, SplitRejectsNegativeColorOnEveryRank) {
  std::vector<std::string> Errors(2);
  runRanks(2, [&](Communicator &C) -> Error {
    auto Sub = C.split(C.rank() == 0 ? -1 : 0, 0);
    Errors[C.rank()] = Sub ? "" : toString(Sub.takeError());
    return Error::success();
  });
  for (const std::string &E : Errors)
    EXPECT_NE(E.find("split: rank 0: negative color -1"), std::string::npos)
        << E;
}

TEST(CommTest, AbortWakesEveryWaitingRank) {
  auto Comms = createThreadCommunicators(4);
  std::vector<std::string> Errors(4);
  std::vector<std::thread> Threads;
  for (int R = 0; R < 3; ++R)
    Threads.emplace_back([&, R] { Errors[R] = errorText(Comms[R]->barrier()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Comms[3]->abort("out of memory");
  for (std::thread &T : Threads)
    T.join();
  for (int R = 0; R < 3; ++R)
    EXPECT_EQ(Errors[R], "thread " + std::to_string(R) +
                             "/4: barrier: aborted by rank 3: out of memory");
  // Every later call fails at once, on every rank, with the first reason.
  Comms[0]->abort("second reason");
  float X = 1;
  EXPECT_EQ(errorText(Comms[3]->allReduceSum(&X, 1)),
            "thread 3/4: allReduceSum: aborted by rank 3: out of memory");
  EXPECT_EQ(errorText(Comms[1]->send(&X, 4, 2, 0)),
            "thread 1/4: send: aborted by rank 3: out of memory");
}

TEST(CommTest, AbortReachesSubgroupsAndReceivers) {
  auto Comms = createThreadCommunicators(4);
  std::vector<std::unique_ptr<Communicator>> Tp(4);
  {
    std::vector<std::thread> Threads;
    for (int R = 0; R < 4; ++R)
      Threads.emplace_back([&, R] { Tp[R] = cantFail(Comms[R]->split(R / 2, R)); });
    for (std::thread &T : Threads)
      T.join();
  }
  std::vector<std::string> Errors(3);
  std::vector<std::thread> Threads;
  // Rank 0 waits in its TP group, rank 2 in a recv from rank 3 of the TP
  // group, rank 1 in the world barrier; rank 3 aborts through the world.
  Threads.emplace_back([&] {
    float X = 1;
    Errors[0] = errorText(Tp[0]->allReduceSum(&X, 1));
  });
  Threads.emplace_back([&] { Errors[1] = errorText(Comms[1]->barrier()); });
  Threads.emplace_back([&] {
    int X;
    Errors[2] = errorText(Tp[2]->recv(&X, sizeof(X), 1, 0));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Comms[3]->abort("bad batch");
  for (std::thread &T : Threads)
    T.join();
  EXPECT_EQ(Errors[0], "thread 0/2: allReduceSum: aborted by rank 3: bad batch");
  EXPECT_EQ(Errors[1], "thread 1/4: barrier: aborted by rank 3: bad batch");
  EXPECT_EQ(Errors[2], "thread 0/2: recv: aborted by rank 3: bad batch");
}

/// A rank that never comes: the others give up after their timeout, naming
/// the call and the missing rank, and every rank's call fails (no hang). A
/// recv whose message never comes fails the same way; split() passes the
/// timeout on.
TEST(CommTest, TimeoutNamesTheCallAndTheMissingRank) {
  using namespace std::chrono;
  auto Start = steady_clock::now();
  std::vector<std::string> Errors(3);
  Error E = runOnThreadRanks(3, [&](Communicator &C) -> Error {
    C.setTimeout(milliseconds(200));
    auto Sub = C.split(0, C.rank());
    if (!Sub)
      return Sub.takeError();
    EXPECT_EQ((*Sub)->timeout(), milliseconds(200));
    if (C.rank() == 2)
      return Error::success(); // never joins the all-reduce
    float X = 1;
    Errors[C.rank()] = errorText((*Sub)->allReduceSum(&X, 1));
    return Error::success();
  });
  EXPECT_EQ(errorText(std::move(E)), "");
  EXPECT_LT(duration_cast<milliseconds>(steady_clock::now() - Start).count(),
            5000);
  for (int R : {0, 1}) {
    EXPECT_NE(Errors[R].find("allReduceSum: aborted by rank "),
              std::string::npos)
        << Errors[R];
    EXPECT_NE(Errors[R].find("timed out after 0.2 s in allReduceSum waiting "
                             "for rank 2 (of 3) (raise it with "
                             "--comm-timeout)"),
              std::string::npos)
        << Errors[R];
  }

  std::string RecvError;
  E = runOnThreadRanks(2, [&](Communicator &C) -> Error {
    C.setTimeout(milliseconds(100));
    if (C.rank() == 0) {
      int64_t X;
      RecvError = errorText(C.recv(&X, 8, 1, 7));
    }
    return Error::success();
  });
  EXPECT_EQ(errorText(std::move(E)), "");
  EXPECT_NE(RecvError.find("timed out after 0.1 s in recv waiting for a "
                           "message from rank 1 with tag 7"),
            std::string::npos)
      << RecvError;
}

TEST(CommTest, RunOnThreadRanksAbortsWhenARankFails) {
  Error E = runOnThreadRanks(3, [](Communicator &C) -> Error {
    if (C.rank() == 1)
      return createStringError(inconvertibleErrorCode(), "cannot read batch");
    for (int I = 0; I < 5; ++I)
      if (Error E = C.barrier())
        return E;
    return Error::success();
  });
  std::string Text = errorText(std::move(E));
  EXPECT_NE(Text.find("rank 1: cannot read batch"), std::string::npos) << Text;
  EXPECT_NE(Text.find("rank 0: thread 0/3: barrier: aborted by rank 1: cannot "
                      "read batch"),
            std::string::npos)
      << Text;
  EXPECT_NE(Text.find("rank 2: thread 2/3: barrier: aborted by rank 1"),
            std::string::npos)
      << Text;
}

TEST(CommTest, RunOnThreadRanksAbortsWhenARankThrows) {
  Error E = runOnThreadRanks(2, [](Communicator &C) -> Error {
    if (C.rank() == 0)
      throw std::runtime_error("index out of range");
    return C.barrier();
  });
  std::string Text = errorText(std::move(E));
  EXPECT_NE(Text.find("rank 0: exception: index out of range"),
            std::string::npos)
      << Text;
  EXPECT_NE(Text.find("rank 1: thread 1/2: barrier: aborted by rank 0: "
                      "exception: index out of range"),
            std::string::npos)
      << Text;
}

TEST(CommTest, PointToPointErrors) {
  std::vector<std::string> Errors(4);
  runRanks(2, [&](Communicator &C) -> Error {
    if (C.rank() == 0) {
      int64_t Big = 1;
      if (Error E = C.send(&Big, sizeof(Big), 1, 3))
        return E;
      Errors[0] = errorText(C.send(&Big, sizeof(Big), 2, 3));
      Errors[1] = errorText(C.send(&Big, sizeof(Big), 1, -4));
      return Error::success();
    }
    int Small;
    Errors[2] = errorText(C.recv(&Small, sizeof(Small), 0, 3));
    Errors[3] = errorText(C.recv(nullptr, 4, 0, 3));
    return Error::success();
  });
  EXPECT_EQ(Errors[0],
            "thread 0/2: send: peer 2 is not a rank of a 2-rank communicator");
  EXPECT_EQ(Errors[1], "thread 0/2: send: negative tag -4");
  EXPECT_EQ(Errors[2], "thread 1/2: recv: the message from rank 0 with tag 3 "
                       "has 8 bytes, expected 4");
  EXPECT_EQ(Errors[3], "thread 1/2: recv: null data buffer for count 4");
}

TEST(CommTest, OverlappingBuffersAreAnError) {
  std::vector<std::string> Errors(2);
  runRanks(2, [&](Communicator &C) -> Error {
    std::vector<float> Buffer(8);
    Errors[C.rank()] =
        errorText(C.allGather(Buffer.data(), Buffer.data() + 2, 2));
    return Error::success();
  });
  EXPECT_EQ(Errors[1], "thread 1/2: allGather: rank 0: output and input "
                       "buffers overlap");
}

TEST(CommTest, SingleRankCollectivesAreCopies) {
  std::unique_ptr<Communicator> C = createSingleRankCommunicator();
  EXPECT_EQ(C->rank(), 0);
  EXPECT_EQ(C->size(), 1);
  std::vector<float> In = rankData(0, 33), Data = In, Out(33);
  EXPECT_EQ(errorText(C->allReduceSum(Data.data(), 33)), "");
  EXPECT_EQ(errorText(C->allReduceMax(Data.data(), 33)), "");
  EXPECT_TRUE(sameBits(Data, In));
  EXPECT_EQ(errorText(C->allGather(Out.data(), In.data(), 33)), "");
  EXPECT_TRUE(sameBits(Out, In));
  std::fill(Out.begin(), Out.end(), 0.0f);
  EXPECT_EQ(errorText(C->reduceScatterSum(Out.data(), In.data(), 33)), "");
  EXPECT_TRUE(sameBits(Out, In));
  EXPECT_EQ(errorText(C->broadcast(Data.data(), 33 * 4, 0)), "");
  EXPECT_EQ(errorText(C->barrier()), "");
  EXPECT_EQ(errorText(C->broadcast(Data.data(), 4, 1)),
            "single 0/1: broadcast: root 1 is not a rank of a 1-rank "
            "communicator");
  EXPECT_EQ(errorText(C->send(Data.data(), 4, 0, 0)),
            "single 0/1: send: a single-rank communicator has no peer (peer 0)");
  EXPECT_EQ(errorText(C->recv(Data.data(), 4, 0, 0)),
            "single 0/1: recv: a single-rank communicator has no peer (peer 0)");
  auto Sub = C->split(3, 0);
  ASSERT_TRUE(bool(Sub));
  EXPECT_EQ((*Sub)->size(), 1);
  C->abort("stop");
  EXPECT_EQ(errorText(C->barrier()), "single 0/1: barrier: aborted: stop");
}

TEST(CommTest, MpiCommunicatorWithoutMpiNamesTheCause) {
  if (mpiAvailable())
    GTEST_SKIP() << "built with MPI (tests/mpi covers it)";
  int Argc = 0;
  char **Argv = nullptr;
  auto C = createMpiCommunicator(&Argc, &Argv);
  ASSERT_FALSE(bool(C));
  EXPECT_NE(toString(C.takeError()).find("sp was built without MPI"),
            std::string::npos);
}

} // namespace

//===----------------------------------------------------------------------===//
// ProcessGrid
//===----------------------------------------------------------------------===//

#include "runtime/comm/ProcessGrid.h"

namespace {

TEST(ProcessGrid, CoordinatesAreMegatronsLayout) {
  ProcessGrid G{/*Data=*/2, /*Pipeline=*/3, /*Tensor=*/4};
  ASSERT_EQ(G.size(), 24);
  for (int R = 0; R < G.size(); ++R) {
    GridCoord C = G.coord(R);
    EXPECT_EQ(R, (C.Data * 3 + C.Pipeline) * 4 + C.Tensor);
    EXPECT_EQ(G.worldRank(C), R);
  }
  EXPECT_EQ(G.coord(5), (GridCoord{0, 1, 1}));
  EXPECT_EQ(G.coord(13), (GridCoord{1, 0, 1}));
  // Context-parallel ranks sit between the tensor ranks and the stages.
  ProcessGrid Cp{/*Data=*/2, /*Pipeline=*/2, /*Tensor=*/2, /*Context=*/3};
  ASSERT_EQ(Cp.size(), 24);
  for (int R = 0; R < Cp.size(); ++R) {
    GridCoord C = Cp.coord(R);
    EXPECT_EQ(R, ((C.Data * 2 + C.Pipeline) * 3 + C.Context) * 2 + C.Tensor);
    EXPECT_EQ(Cp.worldRank(C), R);
  }
  EXPECT_EQ(Cp.coord(7), (GridCoord{0, 1, 1, 0}));
}

/// Each group holds exactly the ranks that share the other coordinates,
/// ordered by its own (the data group by replica, then context rank): the
/// sum of the members' world ranks over a group is the one computed from
/// the layout, and each member's rank in it is its place in that order.
TEST(ProcessGrid, GroupsHoldTheRanksThatShareTheOtherCoordinates) {
  ProcessGrid G{2, 2, 2, 2};
  auto Body = [&](Communicator &World) -> Error {
    auto Groups = splitGroups(World, G);
    if (!Groups)
      return Groups.takeError();
    GridCoord C = Groups->At;
    if (!(C == G.coord(World.rank())))
      return createStringError(inconvertibleErrorCode(), "wrong coordinate");
    // A group: its communicator, this rank's place in it, and the members
    // (every coordinate of this rank's, with the group's axes varying).
    enum Axis { D = 1, P = 2, T = 4, C4 = 8 };
    struct {
      Communicator *Comm;
      int Own, Size, Axes;
    } Checks[] = {{Groups->Tensor.get(), C.Tensor, 2, T},
                  {Groups->Pipeline.get(), C.Pipeline, 2, P},
                  {Groups->Context.get(), C.Context, 2, C4},
                  {Groups->Data.get(), C.Data * 2 + C.Context, 4, D | C4}};
    for (auto &K : Checks) {
      if (!K.Comm || K.Comm->size() != K.Size || K.Comm->rank() != K.Own)
        return createStringError(inconvertibleErrorCode(),
                                 "rank %d: a group of the wrong size or rank",
                                 World.rank());
      int64_t Expected = 0;
      for (int M = 0; M < 16; ++M) {
        GridCoord X = G.coord(M);
        if ((K.Axes & D || X.Data == C.Data) &&
            (K.Axes & P || X.Pipeline == C.Pipeline) &&
            (K.Axes & T || X.Tensor == C.Tensor) &&
            (K.Axes & C4 || X.Context == C.Context))
          Expected += M;
      }
      int64_t Sum = World.rank();
      if (auto E = K.Comm->allReduceSum(&Sum, 1))
        return E;
      if (Sum != Expected)
        return createStringError(inconvertibleErrorCode(),
                                 "rank %d: group sum %lld", World.rank(),
                                 (long long)Sum);
    }
    return Error::success();
  };
  EXPECT_EQ(errorText(runOnThreadRanks(16, Body)), "");
  // One rank: no groups to talk to.
  auto One = [&](Communicator &World) -> Error {
    auto Groups = splitGroups(World, ProcessGrid{});
    if (!Groups)
      return Groups.takeError();
    if (Groups->Tensor || Groups->Pipeline || Groups->Data || Groups->Context)
      return createStringError(inconvertibleErrorCode(), "a group of one");
    return Error::success();
  };
  EXPECT_EQ(errorText(runOnThreadRanks(1, One)), "");
  // A grid that is not the world's size.
  auto Wrong = [&](Communicator &World) -> Error {
    return splitGroups(World, G).takeError();
  };
  EXPECT_EQ(errorText(runOnThreadRanks(2, Wrong)),
            "rank 0: the run has 2 ranks but the plan's grid needs d x p x c "
            "x t = 2 x 2 x 2 x 2 = 16\nrank 1: the run has 2 ranks but the "
            "plan's grid needs d x p x c x t = 2 x 2 x 2 x 2 = 16");
}

} // namespace
