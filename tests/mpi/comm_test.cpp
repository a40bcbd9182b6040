//===- comm_test.cpp - The MPI communicator across processes --------------===//
//
// Run under mpirun with any number of processes (run_mpi_tests.sh runs 1, 2
// and 4). Every collective of runtime/comm/Communicator.h against a
// reference each rank computes by itself; the inputs are small integers
// where MPI's sum order could matter, so the comparisons are exact. Failed
// checks are printed by the rank that saw them; rank 0 prints
// "N passed, M failed" over all ranks, and every rank exits non-zero on a
// failure. With --abort it checks that abort() ends the job instead, and with
// --stall that a rank that stops answering ends it after the timeout.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/Communicator.h"
#include "ir/Float16.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/raw_ostream.h"
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

using namespace sp;
using namespace llvm;

namespace {

class Checker {
public:
  explicit Checker(int Rank) : Rank(Rank) {}

  bool check(bool Ok, StringRef What, const Twine &Detail = "") {
    if (Ok) {
      ++Passed;
      return true;
    }
    ++Failed;
    errs() << "rank " << Rank << ": FAIL " << What;
    if (!Detail.isTriviallyEmpty())
      errs() << ": " << Detail;
    errs() << "\n";
    return false;
  }

  /// Passes when E is success.
  bool ok(Error E, StringRef What) {
    if (!E)
      return check(true, What);
    return check(false, What, toString(std::move(E)));
  }

  /// Passes when E is an error whose message contains Needle.
  bool fails(Error E, StringRef What, StringRef Needle) {
    if (!E)
      return check(false, What, "expected an error containing '" + Needle +
                                    "', got success");
    std::string Text = toString(std::move(E));
    return check(StringRef(Text).contains(Needle), What,
                 "error '" + Text + "' lacks '" + Needle + "'");
  }

  int64_t Passed = 0, Failed = 0;

private:
  int Rank;
};

void testAllReduce(Communicator &C, Checker &T) {
  int N = C.size(), R = C.rank();
  for (int64_t Count : {int64_t(0), int64_t(1), int64_t(1000),
                        int64_t(1) << 20}) {
    std::vector<float> Sum(Count), Max(Count);
    for (int64_t I = 0; I < Count; ++I) {
      Sum[I] = float((R + 1) * (I % 97) - 40);
      Max[I] = float((I + R) % N) - 0.5f * R;
    }
    if (!T.ok(C.allReduceSum(Sum.data(), Count), "allReduceSum(float)") ||
        !T.ok(C.allReduceMax(Max.data(), Count), "allReduceMax"))
      return;
    bool SumOk = true, MaxOk = true;
    for (int64_t I = 0; I < Count; ++I) {
      float Expected = float((N * (N + 1) / 2) * (I % 97) - 40 * N);
      SumOk &= Sum[I] == Expected;
      float ExpectedMax = -1e30f;
      for (int S = 0; S < N; ++S)
        ExpectedMax = std::max(ExpectedMax, float((I + S) % N) - 0.5f * S);
      MaxOk &= Max[I] == ExpectedMax;
    }
    T.check(SumOk, "allReduceSum(float) values", "count " + Twine(Count));
    T.check(MaxOk, "allReduceMax values", "count " + Twine(Count));
  }
  std::vector<int64_t> Counters = {int64_t(1) << 40, R, -3};
  if (T.ok(C.allReduceSum(Counters.data(), 3), "allReduceSum(int64)"))
    T.check(Counters == std::vector<int64_t>{N * (int64_t(1) << 40),
                                             N * (N - 1) / 2, -3 * N},
            "allReduceSum(int64) values");
}

void testAllGatherAndReduceScatter(Communicator &C, Checker &T) {
  int N = C.size(), R = C.rank();
  const int64_t Count = 333;
  std::vector<float> Mine(Count), All(N * Count, -1.0f);
  for (int64_t I = 0; I < Count; ++I)
    Mine[I] = float(R * 10000 + I);
  if (T.ok(C.allGather(All.data(), Mine.data(), Count), "allGather")) {
    bool Ok = true;
    for (int S = 0; S < N; ++S)
      for (int64_t I = 0; I < Count; ++I)
        Ok &= All[S * Count + I] == float(S * 10000 + I);
    T.check(Ok, "allGather values");
  }
  // Chunk c of rank s holds s + c + i; rank r's sum is sum_s (s + r + i).
  std::vector<float> Chunks(N * Count), Out(Count);
  for (int Chunk = 0; Chunk < N; ++Chunk)
    for (int64_t I = 0; I < Count; ++I)
      Chunks[Chunk * Count + I] = float(R + Chunk + I);
  if (T.ok(C.reduceScatterSum(Out.data(), Chunks.data(), Count),
           "reduceScatterSum")) {
    bool Ok = true;
    for (int64_t I = 0; I < Count; ++I)
      Ok &= Out[I] == float(N * (N - 1) / 2 + N * (R + I));
    T.check(Ok, "reduceScatterSum values");
  }
  T.fails(C.allGather(All.data(), All.data(), 1), "allGather overlap",
          "output and input buffers overlap");
}

/// bf16 sums travel as 16-bit words and add in float: small integers are
/// exact in bf16, so every order gives the same bits.
void testSixteenBit(Communicator &C, Checker &T) {
  int N = C.size(), R = C.rank();
  const int64_t Count = 100;
  for (CommType Type : {CommType::BF16, CommType::F16}) {
    auto Narrow = Type == CommType::BF16 ? floatToBFloat16 : floatToHalf;
    std::vector<uint16_t> Sum(Count), Mine(Count), All(N * Count);
    for (int64_t I = 0; I < Count; ++I)
      Sum[I] = Mine[I] = Narrow(float((R + 1) * (I % 7)));
    if (T.ok(C.allReduceSum(Sum.data(), Count, Type), "allReduceSum(16-bit)")) {
      bool Ok = true;
      for (int64_t I = 0; I < Count; ++I)
        Ok &= Sum[I] == Narrow(float(N * (N + 1) / 2 * (I % 7)));
      T.check(Ok, "allReduceSum(16-bit) values", commTypeName(Type));
    }
    if (T.ok(C.allGather(All.data(), Mine.data(), Count, Type),
             "allGather(16-bit)")) {
      bool Ok = true;
      for (int S = 0; S < N; ++S)
        for (int64_t I = 0; I < Count; ++I)
          Ok &= All[S * Count + I] == Narrow(float((S + 1) * (I % 7)));
      T.check(Ok, "allGather(16-bit) values", commTypeName(Type));
    }
    std::vector<uint16_t> Out(10);
    std::vector<uint16_t> Chunks(N * 10);
    for (int64_t I = 0; I < N * 10; ++I)
      Chunks[I] = Narrow(float(R + I));
    if (T.ok(C.reduceScatterSum(Out.data(), Chunks.data(), 10, Type),
             "reduceScatterSum(16-bit)")) {
      bool Ok = true;
      for (int64_t I = 0; I < 10; ++I)
        Ok &= Out[I] == Narrow(float(N * (N - 1) / 2 + N * (R * 10 + I)));
      T.check(Ok, "reduceScatterSum(16-bit) values", commTypeName(Type));
    }
  }
}

void testBroadcastAndBarrier(Communicator &C, Checker &T) {
  int N = C.size(), R = C.rank();
  for (int Root = 0; Root < N; ++Root) {
    std::vector<char> Data(4099, char(R));
    if (T.ok(C.broadcast(Data.data(), Data.size(), Root), "broadcast"))
      T.check(Data == std::vector<char>(4099, char(Root)), "broadcast values",
              "root " + Twine(Root));
  }
  T.ok(C.barrier(), "barrier");
  T.fails(C.broadcast(nullptr, 0, N), "broadcast bad root",
          "is not a rank of a");
}

void testPointToPoint(Communicator &C, Checker &T) {
  int N = C.size(), R = C.rank();
  if (N < 2)
    return;
  // Ring: send to the next rank, receive from the previous one. Even ranks
  // send first so that blocking sends cannot deadlock.
  int Next = (R + 1) % N, Prev = (R + N - 1) % N;
  std::vector<double> Out = {double(R), R * 0.5}, In(2);
  auto Send = [&] { return C.send(Out.data(), 16, Next, 11); };
  auto Recv = [&] { return C.recv(In.data(), 16, Prev, 11); };
  if (R % 2 == 0) {
    T.ok(Send(), "ring send");
    T.ok(Recv(), "ring recv");
  } else {
    T.ok(Recv(), "ring recv");
    T.ok(Send(), "ring send");
  }
  T.check(In == std::vector<double>{double(Prev), Prev * 0.5}, "ring values");

  // Ping-pong between ranks 0 and 1, with an empty message at the end.
  if (R < 2) {
    int64_t Ball = 0;
    for (int I = 0; I < 100; ++I) {
      if (I % 2 == R) {
        ++Ball;
        if (!T.ok(C.send(&Ball, sizeof(Ball), 1 - R, 5), "ping-pong send"))
          break;
      } else if (!T.ok(C.recv(&Ball, sizeof(Ball), 1 - R, 5),
                       "ping-pong recv")) {
        break;
      }
    }
    T.check(Ball == 100, "ping-pong values", "ball " + Twine(Ball));
    if (R == 0)
      T.ok(C.send(nullptr, 0, 1, 6), "empty send");
    else
      T.ok(C.recv(nullptr, 0, 0, 6), "empty recv");

    // Size errors: a larger message than asked for (MPI's truncation), and
    // a smaller one.
    int64_t Big = 42;
    int32_t Small = 0;
    if (R == 0) {
      T.ok(C.send(&Big, sizeof(Big), 1, 8), "send 8 bytes");
      T.ok(C.send(&Small, sizeof(Small), 1, 9), "send 4 bytes");
    } else {
      T.fails(C.recv(&Small, sizeof(Small), 0, 8), "recv truncated",
              "recv: MPI_Irecv failed:");
      T.fails(C.recv(&Big, sizeof(Big), 0, 9), "recv short",
              "the message from rank 0 with tag 9 has 4 bytes, expected 8");
    }
  }
  T.fails(C.send(&R, sizeof(R), N, 0), "send bad peer",
          ("peer " + Twine(N) + " is not a rank of a").str());
  T.fails(C.send(&R, sizeof(R), 0, -1), "send bad tag", "negative tag -1");
  T.ok(C.barrier(), "barrier after point to point");
}

void testSplit(Communicator &C, Checker &T) {
  int N = C.size(), R = C.rank();
  // Tensor-parallel groups of two consecutive ranks, data-parallel groups
  // across them ordered by decreasing rank.
  auto Tp = C.split(R / 2, R);
  auto Dp = C.split(R % 2, -R);
  if (!Tp || !Dp) {
    T.ok(Tp ? Error::success() : Tp.takeError(), "split tp");
    T.ok(Dp ? Error::success() : Dp.takeError(), "split dp");
    return;
  }
  int TpSize = (R / 2) * 2 + 1 < N ? 2 : 1;
  T.check((*Tp)->size() == TpSize && (*Tp)->rank() == R % 2, "tp shape",
          (*Tp)->name());
  int DpSize = (N - R % 2 + 1) / 2;
  int DpRank = (N - 1 - R) / 2; // ranks of this parity above R come first
  T.check((*Dp)->size() == DpSize && (*Dp)->rank() == DpRank, "dp shape",
          (*Dp)->name());
  for (int Round = 0; Round < 10; ++Round) {
    float X = float(R + Round);
    if (!T.ok((*Tp)->allReduceSum(&X, 1), "tp allReduceSum"))
      break;
    float Expected = TpSize == 2 ? float(2 * (R / 2 * 2) + 1 + 2 * Round)
                                 : float(R + Round);
    T.check(X == Expected, "tp allReduceSum value");
    std::vector<float> Gathered(DpSize);
    float Mine = float(R);
    if (!T.ok((*Dp)->allGather(Gathered.data(), &Mine, 1), "dp allGather"))
      break;
    bool Ok = true;
    for (int S = 0; S < DpSize; ++S)
      Ok &= Gathered[S] == float(N - 1 - ((N - 1 - R % 2) % 2) - 2 * S);
    T.check(Ok, "dp allGather values (key order)");
  }
  if (TpSize == 2) {
    int Mine = R, Theirs = -1;
    int Peer = 1 - (*Tp)->rank();
    // Rank 0 of the group sends first.
    if ((*Tp)->rank() == 0) {
      T.ok((*Tp)->send(&Mine, sizeof(Mine), Peer, 0), "tp send");
      T.ok((*Tp)->recv(&Theirs, sizeof(Theirs), Peer, 0), "tp recv");
    } else {
      T.ok((*Tp)->recv(&Theirs, sizeof(Theirs), Peer, 0), "tp recv");
      T.ok((*Tp)->send(&Mine, sizeof(Mine), Peer, 0), "tp send");
    }
    T.check(Theirs == (R ^ 1), "tp point to point uses group ranks");
  }
  auto Bad = C.split(-1, 0);
  T.fails(Bad ? Error::success() : Bad.takeError(), "split negative color",
          "negative color -1");
}

void testRepeated(Communicator &C, Checker &T) {
  int N = C.size(), R = C.rank();
  bool Ok = true;
  for (int Round = 0; Round < 200 && Ok; ++Round) {
    int64_t Count = 1 + Round % 5;
    std::vector<float> Data(Count, float(Round + R));
    Ok &= !errorToBool(C.allReduceSum(Data.data(), Count));
    Ok &= Data[Count - 1] == float(N * Round + N * (N - 1) / 2);
    int Value = R == Round % N ? Round : -1;
    Ok &= !errorToBool(C.broadcast(&Value, sizeof(Value), Round % N));
    Ok &= Value == Round;
  }
  T.check(Ok, "200 rounds of allReduceSum and broadcast");
}

} // namespace

int main(int Argc, char **Argv) {
  if (!mpiAvailable()) {
    errs() << "comm_test: sp was built without MPI\n";
    return 1;
  }
  auto World = createMpiCommunicator(&Argc, &Argv);
  if (!World) {
    errs() << "comm_test: " << toString(World.takeError()) << "\n";
    return 1;
  }
  Communicator &C = **World;

  // --abort: the last rank aborts while the others wait in a barrier; the
  // job must end (non-zero) instead of hanging. run_mpi_tests.sh checks it.
  if (Argc > 1 && StringRef(Argv[1]) == "--abort") {
    if (C.rank() == C.size() - 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      C.abort("requested by --abort");
    }
    Error E = C.barrier();
    errs() << "rank " << C.rank() << ": barrier returned after an abort: "
           << (E ? toString(std::move(E)) : "success") << "\n";
    return 0;
  }

  // --stall: the last rank stops answering (it sleeps far past the 1 s
  // timeout) while the others all-reduce over a split-off group, which
  // inherits the timeout; they must give up after about a second, naming the
  // call, and end the job. run_mpi_tests.sh checks the line and the time.
  if (Argc > 1 && StringRef(Argv[1]) == "--stall") {
    C.setTimeout(std::chrono::milliseconds(1000));
    auto Sub = C.split(0, C.rank());
    if (!Sub) {
      errs() << toString(Sub.takeError()) << "\n";
      return 1;
    }
    if (C.rank() == C.size() - 1)
      std::this_thread::sleep_for(std::chrono::seconds(60));
    float X = 1;
    Error E = (*Sub)->allReduceSum(&X, 1);
    errs() << "rank " << C.rank() << ": the all-reduce returned: "
           << (E ? toString(std::move(E)) : "success") << "\n";
    return 0;
  }

  Checker T(C.rank());
  // A second call gives another communicator over the same processes.
  auto Again = createMpiCommunicator(&Argc, &Argv);
  if (T.ok(Again ? Error::success() : Again.takeError(), "second create"))
    T.check((*Again)->size() == C.size() && (*Again)->rank() == C.rank(),
            "second create shape");

  testAllReduce(C, T);
  testAllGatherAndReduceScatter(C, T);
  testSixteenBit(C, T);
  testBroadcastAndBarrier(C, T);
  testPointToPoint(C, T);
  testSplit(C, T);
  testRepeated(C, T);

  int64_t Totals[2] = {T.Passed, T.Failed};
  if (Error E = C.allReduceSum(Totals, 2)) {
    errs() << "rank " << C.rank() << ": cannot sum the results: "
           << toString(std::move(E)) << "\n";
    return 1;
  }
  if (C.rank() == 0)
    outs() << "comm_test on " << C.size() << " ranks: " << Totals[0]
           << " passed, " << Totals[1] << " failed\n";
  return Totals[1] == 0 ? 0 : 1;
}
