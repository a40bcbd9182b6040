//===- EmulatedBackendTest.cpp - The CUDA backend on emulated devices -----===//
//
// Tests that only the emulated runtime (EmulatedRuntime.h) can run: the
// layouts of EndToEndTest.cpp's multi-GPU test with one of each device's
// two streams running late, so that a read across the streams without the
// event the stream plan owes it reads stale or unwritten data; and the
// forward's all-gather cut into a ring beside its GEMMs
// (--tp-comm-overlap: NCCL send/recv groups on the communication stream).
// Each against the same plan on CPU thread ranks and in float64, by the
// rule of EndToEndTest.cpp (expectMatches).
//
//===----------------------------------------------------------------------===//
#include "EmulatedRuntime.h"
#include "TrainCompare.h"
#include "runtime/cuda/CudaBackend.h"
#include "gtest/gtest.h"

using namespace sp;
using namespace llvm;

namespace {

constexpr double StableEps = 1e-3;

Expected<Run> trainGrid(const Plan &P, int TP, int PP, int DP, bool Cuda,
                        int Steps) {
  GridBackend Make;
  if (Cuda)
    Make = [](Communicator &World,
              const RunOptions &O) -> Expected<std::unique_ptr<Backend>> {
      CudaBackendOptions CO;
      CO.Device = World.rank();
      CO.World = &World;
      CO.Tensor = O.Comm;
      CO.Pipeline = O.PipeComm;
      CO.Data = O.DataComm;
      return createCudaBackend(CO);
    };
  return trainOnGrid(P, TP, PP, DP, Make, Steps);
}

struct Layout {
  const char *Name;
  int TP;
  bool SP;
  int PP, Microbatches, DP = 1, Zero = 0;
  bool Ring = false;
};

void expectGridMatches(const Layout &L) {
  Plan P = compileTiny(L.TP, L.SP, L.PP, L.Microbatches, L.DP, L.Zero,
                       StableEps, DType::F32, /*Fused=*/false, L.Ring);
  const int Steps = 2;
  auto Gpu = trainGrid(P, L.TP, L.PP, L.DP, true, Steps);
  ASSERT_TRUE(bool(Gpu)) << toString(Gpu.takeError());
  auto Cpu = trainGrid(P, L.TP, L.PP, L.DP, false, Steps);
  ASSERT_TRUE(bool(Cpu)) << toString(Cpu.takeError());
  auto Ref = trainGrid(widenToFloat64(P), L.TP, L.PP, L.DP, false, Steps);
  ASSERT_TRUE(bool(Ref)) << toString(Ref.takeError());
  expectMatches(*Gpu, *Cpu, *Ref, Steps);
}

const Layout Layouts[] = {
    {"t = 2 + SP", 2, true, 1, 1},
    {"t = 2 + SP, ring all-gathers", 2, true, 1, 1, 1, 0, true},
    {"p = 2, 1F1B, 2 microbatches", 1, false, 2, 2},
    {"d = 2, ZeRO-1", 1, false, 1, 1, 2, 1},
    {"2 x 2 x 2: t = 2 + SP, p = 2, d = 2", 2, true, 2, 2, 2, 0}};

/// Every layout with the compute stream (ordinal 0), then the
/// communication stream (1), running each piece of its work 300 us late.
TEST(EmulatedCuda, GridsMatchTheCpuWithEitherStreamLate) {
  for (int Late : {-1, 0, 1}) {
    SCOPED_TRACE(Late < 0    ? "no stream late"
                 : Late == 0 ? "compute stream late"
                             : "communication stream late");
    sp::emu::setStreamDelay(Late, Late < 0 ? 0 : 300);
    for (const Layout &L : Layouts) {
      SCOPED_TRACE(L.Name);
      expectGridMatches(L);
    }
  }
  sp::emu::setStreamDelay(-1, 0);
}

} // namespace
