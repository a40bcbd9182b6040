//===- PipelineScheduleTest.cpp - Schedules, partitions and charts --------===//
//
// The pipeline groundwork on its own, without a graph:
//  - every schedule kind for P in {1, 2, 4}, M in {1, 2} and several N is
//    built or refused with a message naming the numbers, and the verifier
//    accepts what is built under both communication models;
//  - hand-broken schedules (receives swapped, a receive hoisted above the
//    send it depends on, a wrong peer, a missing send, a backward before
//    its forward) are refused, deadlocks naming the ranks and their steps;
//  - in-flight counts: 1F1B min(P - r, N), GPipe N M, interleaved Megatron's
//    (P - r - 1) 2 + (M - 1) P + 1, i.e. the factor 1 + (P - 1) / (P M);
//  - simulated bubble fractions equal (P - 1) / N and (P - 1) / (N M), and
//    ZB-H1's (P - 1) (F + B - W) / (N (F + B + W));
//  - ZB-H1's order is the paper's, its W steps are checked like the rest;
//  - the partition's dynamic program against brute force on random costs,
//    and its errors;
//  - the SVG writers produce balanced tags, escaped text and their labels.
//
//===----------------------------------------------------------------------===//
#include "TestSupport.h"
#include "analysis/Partition.h"
#include "lower/Schedule.h"
#include "reports/Charts.h"
#include "support/Xml.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include "gtest/gtest.h"
#include <cmath>
#include <functional>
#include <random>

using namespace sp;
using namespace sp::test;
using namespace llvm;

namespace {

Schedule build(ScheduleKind K, int P, int M, int N) {
  Expected<Schedule> S = buildSchedule(K, P, M, N);
  if (!S) {
    ADD_FAILURE() << toString(S.takeError());
    return Schedule();
  }
  return std::move(*S);
}

std::string listing(const Schedule &S) {
  std::string Out;
  raw_string_ostream OS(Out);
  printSchedule(S, OS);
  return Out;
}

/// Index of the first step of Rank equal to St.
int find(const Schedule &S, int Rank, const ScheduleStep &St) {
  const auto &Steps = S.Steps[Rank];
  for (int I = 0, E = Steps.size(); I < E; ++I)
    if (Steps[I] == St)
      return I;
  ADD_FAILURE() << "step not found on rank " << Rank;
  return 0;
}

ScheduleStep step(StepKind K, int Microbatch, int Chunk, int Peer = -1) {
  ScheduleStep St;
  St.Kind = K;
  St.Microbatch = Microbatch;
  St.Chunk = Chunk;
  St.Peer = Peer;
  return St;
}

//===----------------------------------------------------------------------===//
// Building and verifying
//===----------------------------------------------------------------------===//

TEST(PipelineSchedule, EveryKindVerifies) {
  const ScheduleKind Kinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                                ScheduleKind::Interleaved,
                                ScheduleKind::ZeroBubbleH1};
  int Built = 0;
  for (ScheduleKind K : Kinds)
    for (int P : {1, 2, 4})
      for (int M : {1, 2})
        for (int N : {1, 2, 3, 4, 8, 12}) {
          SCOPED_TRACE(formatv("{0} P={1} M={2} N={3}", scheduleKindName(K),
                               P, M, N)
                           .str());
          Expected<Schedule> S = buildSchedule(K, P, M, N);
          bool Valid = true;
          if ((K == ScheduleKind::OneFOneB ||
               K == ScheduleKind::ZeroBubbleH1) &&
              M != 1)
            Valid = false;
          if (K == ScheduleKind::Interleaved && (M < 2 || N % P != 0))
            Valid = false;
          if (!Valid) {
            EXPECT_FALSE(bool(S));
            EXPECT_FALSE(errorText(S).empty());
            continue;
          }
          ASSERT_TRUE(bool(S)) << errorText(S);
          ++Built;
          EXPECT_EQ(S->Ranks, P);
          EXPECT_EQ(S->Chunks, M);
          EXPECT_EQ(S->Microbatches, N);
          EXPECT_EQ(errorText(verifySchedule(*S, CommModel::Rendezvous)), "")
              << listing(*S);
          EXPECT_EQ(errorText(verifySchedule(*S, CommModel::Buffered)), "");
          // Each rank: one forward and one backward per (microbatch,
          // chunk), and a W when split; communication only across ranks.
          for (int R = 0; R < P; ++R) {
            int Compute = 0, Comm = 0;
            for (const ScheduleStep &St : S->Steps[R])
              (St.isCompute() ? Compute : Comm) += 1;
            EXPECT_EQ(Compute, (S->splitsBackward() ? 3 : 2) * N * M);
            if (P == 1) {
              EXPECT_EQ(Comm, 0);
            }
          }
        }
  EXPECT_EQ(Built, 3 * 2 * 6 + 2 * 3 * 6 + /*interleaved M=2*/ 6 + 4 + 3);
}

TEST(PipelineSchedule, LargerConfigurationsVerify) {
  // Beyond the CI grid: odd P, more chunks, N not a multiple of P (GPipe,
  // 1F1B), all under the strict rendezvous model.
  for (int P : {3, 5, 8})
    for (int N : {1, 2, 3, 5, 8, 16, 24}) {
      for (int M : {1, 3}) {
        Schedule G = build(ScheduleKind::GPipe, P, M, N);
        EXPECT_EQ(errorText(verifySchedule(G)), "")
            << "gpipe P=" << P << " M=" << M << " N=" << N;
      }
      Schedule S = build(ScheduleKind::OneFOneB, P, 1, N);
      EXPECT_EQ(errorText(verifySchedule(S)), "")
          << "1f1b P=" << P << " N=" << N;
      Schedule Z = build(ScheduleKind::ZeroBubbleH1, P, 1, N);
      EXPECT_EQ(errorText(verifySchedule(Z)), "")
          << "zb1p P=" << P << " N=" << N;
      if (N % P)
        continue;
      for (int M : {2, 3, 4}) {
        Schedule I = build(ScheduleKind::Interleaved, P, M, N);
        EXPECT_EQ(errorText(verifySchedule(I)), "")
            << "interleaved P=" << P << " M=" << M << " N=" << N;
      }
    }
}

TEST(PipelineSchedule, OneFOneBMatchesMegatron) {
  // P = 4, N = 6: rank r warms up with min(3 - r, 6) forwards.
  Schedule S = build(ScheduleKind::OneFOneB, 4, 1, 6);
  std::string Compute;
  for (int R = 0; R < 4; ++R) {
    Compute += "rank " + std::to_string(R) + ":";
    for (const ScheduleStep &St : S.Steps[R])
      if (St.isCompute())
        Compute += formatv(" {0}{1}",
                           St.Kind == StepKind::Forward ? "F" : "B",
                           St.Microbatch)
                       .str();
    Compute += "\n";
  }
  EXPECT_EQ(Compute, "rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5\n"
                     "rank 1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5\n"
                     "rank 2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5\n"
                     "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5\n");
  // The communication around them: receive before, send after.
  EXPECT_EQ(listing(build(ScheduleKind::OneFOneB, 2, 1, 2)),
            "rank 0: F0 >a0 F1 >a1 <g0 B0 <g1 B1\n"
            "rank 1: <a0 F0 B0 >g0 <a1 F1 B1 >g1\n");
}

TEST(PipelineSchedule, ZeroBubbleH1MatchesThePaper) {
  // P = 4, N = 6 (Qi et al.'s Figure 3, ZB-H1): 1F1B's forwards and
  // backwards; rank r runs the W of microbatch k after the B of k + r, the
  // last r W's at the end.
  Schedule S = build(ScheduleKind::ZeroBubbleH1, 4, 1, 6);
  EXPECT_EQ(S.WeightDelay, (std::vector<int>{0, 1, 2, 3}));
  std::string Compute;
  for (int R = 0; R < 4; ++R) {
    Compute += "rank " + std::to_string(R) + ":";
    for (const ScheduleStep &St : S.Steps[R])
      if (St.isCompute())
        Compute += formatv(" {0}{1}",
                           St.Kind == StepKind::Forward    ? "F"
                           : St.Kind == StepKind::Backward ? "B"
                                                           : "W",
                           St.Microbatch)
                       .str();
    Compute += "\n";
  }
  EXPECT_EQ(Compute,
            "rank 0: F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5\n"
            "rank 1: F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 B4 W3 B5 W4 W5\n"
            "rank 2: F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 B5 W3 W4 W5\n"
            "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5\n");
  // W's do not communicate: the gradient goes out right after its B.
  EXPECT_EQ(listing(build(ScheduleKind::ZeroBubbleH1, 2, 1, 2)),
            "rank 0: F0 >a0 F1 >a1 <g0 B0 W0 <g1 B1 W1\n"
            "rank 1: <a0 F0 B0 >g0 <a1 F1 B1 >g1 W0 W1\n");
  // Delays given per rank: D = 0 is 1F1B with each W right after its B.
  Expected<Schedule> Zero =
      buildSchedule(ScheduleKind::ZeroBubbleH1, 2, 1, 2, {0, 0});
  ASSERT_TRUE(bool(Zero));
  EXPECT_EQ(listing(*Zero), "rank 0: F0 >a0 F1 >a1 <g0 B0 W0 <g1 B1 W1\n"
                            "rank 1: <a0 F0 B0 >g0 W0 <a1 F1 B1 >g1 W1\n");
  for (int P : {2, 4, 8})
    for (int N : {1, 3, 8, 16}) {
      std::vector<int> Delays;
      for (int R = 0; R < P; ++R)
        Delays.push_back((R * 7 + 3) % (N + 1)); // any D in [0, N]
      Expected<Schedule> D =
          buildSchedule(ScheduleKind::ZeroBubbleH1, P, 1, N, Delays);
      ASSERT_TRUE(bool(D)) << errorText(D);
      EXPECT_EQ(errorText(verifySchedule(*D)), "") << listing(*D);
    }
  auto Msg = [](ScheduleKind K, int P, int N, std::vector<int> Delays) {
    Expected<Schedule> S = buildSchedule(K, P, 1, N, Delays);
    return errorText(S);
  };
  EXPECT_EQ(Msg(ScheduleKind::ZeroBubbleH1, 2, 4, {0, 5}),
            "rank 1's weight delay 5 is outside [0, 4] (the microbatches)");
  EXPECT_EQ(Msg(ScheduleKind::ZeroBubbleH1, 2, 4, {0}),
            "1 weight delays for 2 ranks");
  EXPECT_EQ(Msg(ScheduleKind::OneFOneB, 2, 4, {0, 1}),
            "the 1f1b schedule does not split the backward; it takes no "
            "weight delays");
  Expected<Schedule> TwoChunks =
      buildSchedule(ScheduleKind::ZeroBubbleH1, 2, 2, 4);
  EXPECT_EQ(errorText(TwoChunks),
            "the zb1p schedule runs 1 model chunk per rank, got M = 2; use "
            "the interleaved schedule for 2 chunks per rank");
}

TEST(PipelineSchedule, WeightGradientStepErrors) {
  // A W before its B.
  {
    Schedule S = build(ScheduleKind::ZeroBubbleH1, 1, 1, 1); // F0 B0 W0
    std::swap(S.Steps[0][1], S.Steps[0][2]);
    EXPECT_EQ(errorText(verifySchedule(S)),
              "rank 0 step 1 (weight gradients of microbatch 0 chunk 0 "
              "(stage 0)) runs before its backward");
  }
  // A W lost.
  {
    Schedule S = build(ScheduleKind::ZeroBubbleH1, 2, 1, 2);
    S.Steps[1].pop_back();
    EXPECT_EQ(errorText(verifySchedule(S)),
              "rank 1 never runs the weight-gradient step of microbatch 1 "
              "chunk 0 (stage 1)");
  }
  // A W in a schedule that does not split the backward.
  {
    Schedule S = build(ScheduleKind::OneFOneB, 1, 1, 1);
    S.Steps[0].push_back(step(StepKind::WeightGrad, 0, 0));
    EXPECT_EQ(errorText(verifySchedule(S)),
              "rank 0 step 2 (weight gradients of microbatch 0 chunk 0 "
              "(stage 0)): the 1f1b schedule does not split the backward");
  }
}

TEST(PipelineSchedule, InterleavedMatchesMegatron) {
  // P = 2, M = 2, N = 4: the k-th forward runs chunk (k mod 4) / 2 on
  // microbatch k / 4 * 2 + k mod 2; warm-up (2 - r - 1) 2 + 2.
  Schedule S = build(ScheduleKind::Interleaved, 2, 2, 4);
  std::string Compute;
  for (int R = 0; R < 2; ++R) {
    Compute += "rank " + std::to_string(R) + ":";
    for (const ScheduleStep &St : S.Steps[R])
      if (St.isCompute())
        Compute += formatv(" {0}{1}.{2}",
                           St.Kind == StepKind::Forward ? "F" : "B",
                           St.Microbatch, St.Chunk)
                       .str();
    Compute += "\n";
  }
  EXPECT_EQ(Compute,
            "rank 0: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 "
            "B1.0 B2.1 B3.1 B2.0 B3.0\n"
            "rank 1: F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 "
            "B2.1 F3.1 B3.1 B2.0 B3.0\n");
  // N = P: every forward first (Megatron's all-warm-up case).
  Schedule All = build(ScheduleKind::Interleaved, 2, 2, 2);
  for (int R = 0; R < 2; ++R) {
    int FirstBackward = -1, I = 0;
    for (const ScheduleStep &St : All.Steps[R]) {
      if (St.Kind == StepKind::Backward && FirstBackward < 0)
        FirstBackward = I;
      if (St.isCompute())
        ++I;
    }
    EXPECT_EQ(FirstBackward, 4) << "rank " << R;
  }
}

TEST(PipelineSchedule, BadInput) {
  auto Msg = [](ScheduleKind K, int P, int M, int N) {
    Expected<Schedule> S = buildSchedule(K, P, M, N);
    return errorText(S);
  };
  EXPECT_EQ(Msg(ScheduleKind::OneFOneB, 0, 1, 4),
            "a pipeline needs at least 1 rank, got P = 0");
  EXPECT_EQ(Msg(ScheduleKind::GPipe, 2, 0, 4),
            "a pipeline needs at least 1 model chunk per rank, got M = 0");
  EXPECT_EQ(Msg(ScheduleKind::OneFOneB, 2, 1, 0),
            "a pipeline needs at least 1 microbatch, got 0");
  EXPECT_EQ(Msg(ScheduleKind::OneFOneB, 2, 2, 4),
            "the 1f1b schedule runs 1 model chunk per rank, got M = 2; use "
            "the interleaved schedule for 2 chunks per rank");
  EXPECT_EQ(Msg(ScheduleKind::Interleaved, 4, 1, 8),
            "the interleaved schedule needs at least 2 model chunks per rank, "
            "got M = 1; use M >= 2, or the 1f1b schedule for 1 chunk");
  EXPECT_EQ(Msg(ScheduleKind::Interleaved, 4, 2, 6),
            "the interleaved schedule needs the number of microbatches to be "
            "a multiple of P = 4, got 6; use 4 or 8 microbatches");
  EXPECT_EQ(Msg(ScheduleKind::Interleaved, 4, 2, 3),
            "the interleaved schedule needs the number of microbatches to be "
            "a multiple of P = 4, got 3; use 4 microbatches");
}

TEST(PipelineSchedule, SwappedReceivesDeadlock) {
  // GPipe, P = 2: rank 1 asks for microbatch 1's activation first while
  // rank 0 can only send microbatch 0's. Under rendezvous both wait.
  Schedule S = build(ScheduleKind::GPipe, 2, 1, 2);
  ScheduleStep R0 = step(StepKind::RecvActivation, 0, 0, 0);
  ScheduleStep R1 = step(StepKind::RecvActivation, 1, 0, 0);
  std::swap(S.Steps[1][find(S, 1, R0)], S.Steps[1][find(S, 1, R1)]);
  // The forward of microbatch 0 now follows the receive of microbatch 1,
  // so swap the forwards too: the order of consumption matches, only the
  // receive order is wrong.
  ScheduleStep F0 = step(StepKind::Forward, 0, 0);
  ScheduleStep F1 = step(StepKind::Forward, 1, 0);
  std::swap(S.Steps[1][find(S, 1, F0)], S.Steps[1][find(S, 1, F1)]);
  EXPECT_EQ(errorText(verifySchedule(S, CommModel::Rendezvous)),
            "deadlock: rank 0 is stuck at step 1 (send activation of "
            "microbatch 0 chunk 0 (stage 0) to rank 1); rank 1 is stuck at "
            "step 0 (recv activation of microbatch 1 chunk 0 (stage 1) from "
            "rank 0)");
  // Buffered sends let rank 0 run ahead: the same order is then fine.
  EXPECT_EQ(errorText(verifySchedule(S, CommModel::Buffered)), "");
}

TEST(PipelineSchedule, SwappedReceivesInOneFOneBDeadlock) {
  // 1F1B, P = 4: rank 2 posts the gradient receive of microbatch 1 where
  // the one of microbatch 0 belongs, and the other way round, with its
  // backwards in the original order.
  Schedule S = build(ScheduleKind::OneFOneB, 4, 1, 8);
  ScheduleStep G0 = step(StepKind::RecvGrad, 0, 0, 3);
  ScheduleStep G1 = step(StepKind::RecvGrad, 1, 0, 3);
  int I0 = find(S, 2, G0), I1 = find(S, 2, G1);
  std::swap(S.Steps[2][I0], S.Steps[2][I1]);
  // Backward 0 now follows the receive of gradient 1: a dependency error
  // once the simulation reaches it, unless it deadlocks first.
  std::string Rv = errorText(verifySchedule(S, CommModel::Rendezvous));
  EXPECT_NE(Rv.find("deadlock: "), std::string::npos) << Rv;
  EXPECT_NE(Rv.find("rank 2 is stuck at step"), std::string::npos) << Rv;
  EXPECT_NE(Rv.find("recv gradient of microbatch 1 chunk 0 (stage 2) from "
                    "rank 3"),
            std::string::npos)
      << Rv;
  EXPECT_NE(Rv.find("rank 3 is stuck"), std::string::npos) << Rv;
  // Buffered: no deadlock, but backward 0 runs without its gradient.
  std::string Bf = errorText(verifySchedule(S, CommModel::Buffered));
  EXPECT_EQ(Bf.rfind("rank 2 step ", 0), 0u) << Bf;
  EXPECT_NE(Bf.find("(backward of microbatch 0 chunk 0 (stage 2)) runs "
                    "before its output gradient is received"),
            std::string::npos)
      << Bf;
}

TEST(PipelineSchedule, HoistedReceiveDeadlocksUnderEitherModel) {
  // Rank 0 waits for microbatch 0's gradient before sending microbatch 0's
  // activation, which that gradient needs: a real cycle.
  Schedule S = build(ScheduleKind::OneFOneB, 2, 1, 2);
  ScheduleStep G0 = step(StepKind::RecvGrad, 0, 0, 1);
  auto &Steps = S.Steps[0];
  Steps.erase(Steps.begin() + find(S, 0, G0));
  Steps.insert(Steps.begin(), G0);
  for (CommModel Model : {CommModel::Rendezvous, CommModel::Buffered}) {
    std::string E = errorText(verifySchedule(S, Model));
    EXPECT_EQ(E, "deadlock: rank 0 is stuck at step 0 (recv gradient of "
                 "microbatch 0 chunk 0 (stage 0) from rank 1); rank 1 is "
                 "stuck at step 0 (recv activation of microbatch 0 chunk 0 "
                 "(stage 1) from rank 0)");
  }
}

TEST(PipelineSchedule, MismatchedPairs) {
  // A send to the wrong rank.
  {
    Schedule S = build(ScheduleKind::OneFOneB, 4, 1, 4);
    int I = find(S, 1, step(StepKind::SendActivation, 2, 0, 2));
    S.Steps[1][I].Peer = 3;
    EXPECT_EQ(errorText(verifySchedule(S)),
              formatv("rank 1 step {0} (send activation of microbatch 2 "
                      "chunk 0 (stage 1) to rank 3): stage 2 is on rank 2, "
                      "not rank 3",
                      I)
                  .str());
  }
  // A send of the wrong microbatch: its receive has no partner.
  {
    Schedule S = build(ScheduleKind::OneFOneB, 2, 1, 4);
    int I = find(S, 0, step(StepKind::SendActivation, 3, 0, 1));
    S.Steps[0][I].Microbatch = 2;
    std::string E = errorText(verifySchedule(S));
    EXPECT_NE(E.find("repeats rank 0 step"), std::string::npos) << E;
  }
  // A dropped send.
  {
    Schedule S = build(ScheduleKind::Interleaved, 2, 2, 2);
    int I = find(S, 1, step(StepKind::SendActivation, 1, 0, 0));
    S.Steps[1].erase(S.Steps[1].begin() + I);
    EXPECT_EQ(errorText(verifySchedule(S)),
              "rank 0 step 7 (recv activation of microbatch 1 chunk 1 "
              "(stage 2) from rank 1) has no matching send on rank 1");
  }
  // A send past the last stage.
  {
    Schedule S = build(ScheduleKind::OneFOneB, 2, 1, 1);
    S.Steps[1].push_back(step(StepKind::SendActivation, 0, 0, 0));
    std::string E = errorText(verifySchedule(S));
    EXPECT_EQ(E, "rank 1 step 4 (send activation of microbatch 0 chunk 0 "
                 "(stage 1) to rank 0): stage 1 has no neighbour that way "
                 "(stages 0-1)");
  }
}

TEST(PipelineSchedule, ComputeOrderErrors) {
  // A backward before its forward.
  {
    Schedule S = build(ScheduleKind::GPipe, 1, 1, 2);
    std::swap(S.Steps[0][0], S.Steps[0][2]); // B0 F1 F0 B1
    EXPECT_EQ(errorText(verifySchedule(S)),
              "rank 0 step 0 (backward of microbatch 0 chunk 0 (stage 0)) "
              "runs before its forward");
  }
  // On one rank, chunk 1's forward before chunk 0's (local hand-over).
  {
    Schedule S = build(ScheduleKind::GPipe, 1, 2, 1);
    std::swap(S.Steps[0][0], S.Steps[0][1]);
    EXPECT_EQ(errorText(verifySchedule(S)),
              "rank 0 step 0 (forward of microbatch 0 chunk 1 (stage 1)) runs "
              "before the forward of stage 0");
  }
  // A step lost, a step run twice.
  {
    Schedule S = build(ScheduleKind::GPipe, 1, 1, 2);
    S.Steps[0].pop_back();
    EXPECT_EQ(errorText(verifySchedule(S)),
              "rank 0 never runs the backward of microbatch 1 chunk 0 "
              "(stage 0)");
    S.Steps[0].push_back(S.Steps[0].front());
    EXPECT_EQ(errorText(verifySchedule(S)),
              "rank 0 step 3 (forward of microbatch 0 chunk 0 (stage 0)) runs "
              "a second time");
  }
  // Out of range.
  {
    Schedule S = build(ScheduleKind::GPipe, 2, 1, 2);
    S.Steps[0][0].Microbatch = 5;
    EXPECT_EQ(errorText(verifySchedule(S)),
              "rank 0 step 0 names microbatch 5 chunk 0; the schedule has "
              "microbatches 0-1 and chunks 0-0");
  }
}

//===----------------------------------------------------------------------===//
// In flight
//===----------------------------------------------------------------------===//

TEST(PipelineSchedule, InFlight) {
  for (int P : {1, 2, 4, 8})
    for (int N : {1, 2, 3, 4, 8, 16}) {
      Schedule S = build(ScheduleKind::OneFOneB, P, 1, N);
      for (int R = 0; R < P; ++R)
        EXPECT_EQ(maxInFlight(S, R), std::min(P - R, N))
            << "1f1b P=" << P << " N=" << N << " rank " << R;
      EXPECT_EQ(maxInFlight(S, 0), std::min(P, N));
      EXPECT_EQ(maxInFlight(S, P - 1), 1);
      for (int M : {1, 2}) {
        Schedule G = build(ScheduleKind::GPipe, P, M, N);
        EXPECT_EQ(maxInFlight(G, 0), N * M);
      }
    }
  // Interleaved: rank r keeps (P - r - 1) 2 + (M - 1) P warm-up forwards
  // plus the one of the steady state, when N > P.
  for (int P : {2, 4, 8})
    for (int M : {2, 3, 4})
      for (int N : {2 * P, 4 * P}) {
        Schedule S = build(ScheduleKind::Interleaved, P, M, N);
        for (int R = 0; R < P; ++R)
          EXPECT_EQ(maxInFlight(S, R),
                    std::min((P - R - 1) * 2 + (M - 1) * P + 1, N * M))
              << "interleaved P=" << P << " M=" << M << " N=" << N
              << " rank " << R;
        // The first rank's activations, in microbatches of its layers
        // (a chunk is 1/M of them), relative to 1F1B's P: the paper's
        // 1 + (P - 1) / (P M).
        double Factor = double(maxInFlight(S, 0)) / M / P;
        EXPECT_DOUBLE_EQ(Factor, 1 + double(P - 1) / (P * M));
      }
  // ZB-H1: rank r holds (P - r - 1) + 1 + r = P, the first rank's count
  // in 1F1B, counted until the W step.
  for (int P : {1, 2, 4, 8})
    for (int N : {1, 2, 3, 4, 8, 16}) {
      Schedule S = build(ScheduleKind::ZeroBubbleH1, P, 1, N);
      for (int R = 0; R < P; ++R)
        EXPECT_EQ(maxInFlight(S, R), std::min(P, N))
            << "zb1p P=" << P << " N=" << N << " rank " << R;
    }
  // N = P: all warm-up, every chunk-microbatch in flight, factor 1.
  EXPECT_EQ(maxInFlight(build(ScheduleKind::Interleaved, 4, 2, 4), 0), 8);
}

//===----------------------------------------------------------------------===//
// Timing
//===----------------------------------------------------------------------===//

ScheduleTimes times(const Schedule &S, const StepCosts &C) {
  Expected<ScheduleTimes> T = simulateTimes(S, C);
  if (!T) {
    ADD_FAILURE() << toString(T.takeError());
    return ScheduleTimes();
  }
  return std::move(*T);
}

TEST(PipelineSchedule, BubbleFractions) {
  for (double Fwd : {1.0, 0.5})
    for (double Bwd : {1.0, 2.0})
      for (int P : {1, 2, 4, 8})
        for (int N : {1, 2, 4, 8, 16}) {
          StepCosts C;
          C.Forward = {Fwd};
          C.Backward = {Bwd};
          for (ScheduleKind K : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
            ScheduleTimes T = times(build(K, P, 1, N), C);
            EXPECT_NEAR(T.Makespan, (N + P - 1) * (Fwd + Bwd), 1e-9);
            EXPECT_NEAR(T.bubbleFraction(), double(P - 1) / N, 1e-12)
                << scheduleKindName(K).str() << " P=" << P << " N=" << N;
          }
          for (int M : {2, 3, 4}) {
            if (N % P)
              continue;
            // The same model over M chunks: each chunk costs 1/M.
            StepCosts CM;
            CM.Forward = {Fwd / M};
            CM.Backward = {Bwd / M};
            ScheduleTimes T =
                times(build(ScheduleKind::Interleaved, P, M, N), CM);
            EXPECT_NEAR(T.bubbleFraction(), double(P - 1) / (N * M), 1e-9)
                << "interleaved P=" << P << " M=" << M << " N=" << N;
          }
        }
}

TEST(PipelineSchedule, ZeroBubbleBubble) {
  // Qi et al.: with the backward split into B and W, 1F1B's bubble is
  // (P - 1) (F + B + W) and ZB-H1's (P - 1) (F + B - W), over the ideal
  // N (F + B + W); their derivation takes N >= P and W <= F.
  const double Costs[][3] = {{1, 1, 1}, {1, 1.2, 0.8}, {1, 1.5, 0.5},
                             {1, 1, 0.5}};
  for (const auto &C : Costs)
    for (int P : {2, 4, 8})
      for (int N : {P, 2 * P, 4 * P}) {
        double F = C[0], B = C[1], W = C[2];
        StepCosts Split;
        Split.Forward = {F};
        Split.Backward = {B};
        Split.WeightGrad = {W};
        ScheduleTimes Z = times(build(ScheduleKind::ZeroBubbleH1, P, 1, N),
                                Split);
        EXPECT_NEAR(Z.bubbleFraction(),
                    (P - 1) * (F + B - W) / (N * (F + B + W)), 1e-9)
            << "zb1p P=" << P << " N=" << N << " F B W " << F << " " << B
            << " " << W;
        StepCosts Whole;
        Whole.Forward = {F};
        Whole.Backward = {B + W};
        ScheduleTimes O = times(build(ScheduleKind::OneFOneB, P, 1, N), Whole);
        EXPECT_NEAR(O.bubbleFraction(), double(P - 1) / N, 1e-9);
        EXPECT_LT(Z.Makespan, O.Makespan);
      }
  // A W step takes its own cost, after its B, on the rank's clock.
  Schedule S = build(ScheduleKind::ZeroBubbleH1, 1, 1, 1); // F0 B0 W0
  StepCosts C;
  C.Forward = {1};
  C.Backward = {2};
  C.Recompute = {0.5};
  C.WeightGrad = {3};
  ScheduleTimes T = times(S, C);
  EXPECT_DOUBLE_EQ(T.Times[0][1].RecomputeEnd, 1.5);
  EXPECT_DOUBLE_EQ(T.Times[0][2].Start, 3.5);
  EXPECT_DOUBLE_EQ(T.Times[0][2].End, 6.5);
  EXPECT_DOUBLE_EQ(T.Busy[0], 6.5);
}

TEST(PipelineSchedule, PaperSizes) {
  // The paper's pipelines (Section 4.4): 175B p 8 m 3, 530B p 35 m 3, 1T
  // p 64; strict verification, the bubble formula and the first stage's
  // in-flight count at full size.
  struct Case {
    ScheduleKind Kind;
    int P, M, N, InFlight;
  } Cases[] = {{ScheduleKind::Interleaved, 8, 3, 64, 8 * 3 + 7},
               {ScheduleKind::Interleaved, 35, 3, 280, 35 * 3 + 34},
               {ScheduleKind::OneFOneB, 64, 1, 512, 64},
               {ScheduleKind::ZeroBubbleH1, 64, 1, 512, 64}};
  for (const Case &C : Cases) {
    Schedule S = build(C.Kind, C.P, C.M, C.N);
    EXPECT_EQ(errorText(verifySchedule(S)), "") << "P=" << C.P;
    EXPECT_EQ(maxInFlight(S, 0), C.InFlight) << "P=" << C.P;
    if (S.splitsBackward()) {
      EXPECT_EQ(maxInFlight(S, C.P - 1), C.InFlight);
      continue; // its bubble: ZeroBubbleBubble
    }
    StepCosts Costs;
    Costs.Forward = {1.0 / C.M};
    Costs.Backward = {2.0 / C.M};
    ScheduleTimes T = times(S, Costs);
    EXPECT_NEAR(T.bubbleFraction(), double(C.P - 1) / (C.N * C.M), 1e-9)
        << "P=" << C.P;
  }
}

TEST(PipelineSchedule, TimingDetails) {
  // P = 2, N = 1, 1F1B, forward 1, backward 2, recompute 0.5, comm 0.25.
  Schedule S = build(ScheduleKind::OneFOneB, 2, 1, 1);
  StepCosts C;
  C.Forward = {1.0};
  C.Backward = {2.0};
  C.Recompute = {0.5};
  C.Comm = 0.25;
  ScheduleTimes T = times(S, C);
  // rank 0: F0 [0,1] >a0 [1,1] <g0 [4.75,5] B0 [5,7.5] (recompute to 5.5)
  // rank 1: <a0 [1,1.25] F0 [1.25,2.25] B0 [2.25,4.75] >g0 [4.75,4.75]
  ASSERT_EQ(T.Times[0].size(), 4u);
  EXPECT_DOUBLE_EQ(T.Times[1][0].Start, 1.0);
  EXPECT_DOUBLE_EQ(T.Times[1][0].End, 1.25);
  EXPECT_DOUBLE_EQ(T.Times[1][2].RecomputeEnd, 2.75);
  EXPECT_DOUBLE_EQ(T.Times[1][2].End, 4.75);
  EXPECT_DOUBLE_EQ(T.Times[0][2].Start, 4.75);
  EXPECT_DOUBLE_EQ(T.Times[0][3].Start, 5.0);
  EXPECT_DOUBLE_EQ(T.Times[0][3].End, 7.5);
  EXPECT_DOUBLE_EQ(T.Makespan, 7.5);
  EXPECT_DOUBLE_EQ(T.Busy[0], 3.5);
  EXPECT_DOUBLE_EQ(T.bubbleFraction(), 4.0 / 3.5);
  // Per-stage costs: a slow last stage.
  Schedule S4 = build(ScheduleKind::OneFOneB, 4, 1, 8);
  StepCosts Slow;
  Slow.Forward = {1, 1, 1, 2};
  Slow.Backward = {2, 2, 2, 4};
  ScheduleTimes T4 = times(S4, Slow);
  EXPECT_DOUBLE_EQ(T4.Busy[3], 8 * 6.0);
  EXPECT_GE(T4.Makespan, 8 * 6.0 + 3 * 3.0);
  // Bad costs.
  StepCosts Wrong;
  Wrong.Forward = {1, 2};
  Expected<ScheduleTimes> E = simulateTimes(S4, Wrong);
  EXPECT_EQ(errorText(E), "forward costs list 2 entries; give 1 for every "
                          "stage or one per virtual stage (4)");
}

//===----------------------------------------------------------------------===//
// Partition
//===----------------------------------------------------------------------===//

/// The best largest stage cost over every contiguous split, by enumeration.
double bruteForce(ArrayRef<double> Cost, double First, double Last,
                  int Stages) {
  int L = Cost.size();
  double Best = INFINITY;
  std::vector<int> Starts(Stages);
  std::function<void(int, int)> Rec = [&](int S, int From) {
    if (S == Stages) {
      SmallVector<double> C = stageCosts(Cost, First, Last, Starts);
      Best = std::min(Best, *std::max_element(C.begin(), C.end()));
      return;
    }
    // Stage S starts at From; it may end anywhere leaving a layer for each
    // later stage.
    Starts[S] = From;
    if (S == Stages - 1) {
      Rec(S + 1, L);
      return;
    }
    for (int Next = From + 1; Next <= L - (Stages - S - 1); ++Next) {
      Starts[S + 1] = Next;
      Rec(S + 1, Next);
    }
  };
  Rec(0, 0);
  return Best;
}

TEST(Partition, OptimalAgainstBruteForce) {
  std::mt19937 Rng(7);
  std::uniform_real_distribution<double> U(0.1, 10.0);
  for (int Trial = 0; Trial < 200; ++Trial) {
    int L = 1 + Trial % 11;
    int Stages = 1 + int(Rng() % L);
    std::vector<double> Cost(L);
    for (double &C : Cost)
      C = U(Rng);
    double First = Trial % 3 ? U(Rng) : 0.0, Last = Trial % 2 ? U(Rng) : 0.0;
    auto Starts = partitionLayers(Cost, First, Last, Stages, false);
    ASSERT_TRUE(bool(Starts)) << toString(Starts.takeError());
    ASSERT_EQ(int(Starts->size()), Stages);
    EXPECT_EQ((*Starts)[0], 0);
    for (int S = 1; S < Stages; ++S)
      EXPECT_LT((*Starts)[S - 1], (*Starts)[S]) << "stages are non-empty";
    EXPECT_LT(Starts->back(), L);
    SmallVector<double> C = stageCosts(Cost, First, Last, *Starts);
    double Got = *std::max_element(C.begin(), C.end());
    EXPECT_NEAR(Got, bruteForce(Cost, First, Last, Stages), 1e-9)
        << "L=" << L << " stages=" << Stages;
  }
}

TEST(Partition, Shapes) {
  // Equal layers: the uniform split, when it exists, is the only optimum.
  std::vector<double> Eq(24, 1.0);
  auto S = partitionLayers(Eq, 0, 0, 4, false);
  ASSERT_TRUE(bool(S));
  EXPECT_EQ(*S, (SmallVector<int>{0, 6, 12, 18}));
  // A heavy head pushes layers off the last stage, a heavy embedding off
  // the first (26 layers and 6 extra: 8 per stage is the unique optimum).
  std::vector<double> Eq26(26, 1.0);
  auto H = partitionLayers(Eq26, 0, 6, 4, false);
  ASSERT_TRUE(bool(H));
  EXPECT_EQ(*H, (SmallVector<int>{0, 8, 16, 24}));
  auto F = partitionLayers(Eq26, 6, 0, 4, false);
  ASSERT_TRUE(bool(F));
  EXPECT_EQ(*F, (SmallVector<int>{0, 2, 10, 18}));
  // Uniform ignores costs.
  auto U = partitionLayers(Eq, 100, 100, 8, true);
  ASSERT_TRUE(bool(U));
  EXPECT_EQ(*U, (SmallVector<int>{0, 3, 6, 9, 12, 15, 18, 21}));
  // As many stages as layers.
  auto One = partitionLayers({3.0, 1.0, 2.0}, 0, 0, 3, false);
  ASSERT_TRUE(bool(One));
  EXPECT_EQ(*One, (SmallVector<int>{0, 1, 2}));
}

TEST(Partition, Errors) {
  std::vector<double> Eq(24, 1.0);
  auto U = partitionLayers(Eq, 0, 0, 5, true);
  EXPECT_EQ(errorText(U),
            "uniform partition: 24 layers do not split evenly into 5 stages "
            "(P x M); use a stage count that divides 24 (1, 2, 3, 4, 6, 8, "
            "12, 24) or the cost-balanced partition");
  auto More = partitionLayers(Eq, 0, 0, 32, false);
  EXPECT_EQ(errorText(More), "more stages than layers: 32 stages (P x M) for "
                             "24 layers; use at most 24 stages");
  auto MoreU = partitionLayers(Eq, 0, 0, 25, true);
  EXPECT_NE(errorText(MoreU).find("more stages than layers"),
            std::string::npos);
  auto Zero = partitionLayers(Eq, 0, 0, 0, false);
  EXPECT_EQ(errorText(Zero), "a pipeline needs at least 1 stage, got 0");
  std::vector<double> Neg{1.0, -2.0};
  auto N = partitionLayers(Neg, 0, 0, 1, false);
  EXPECT_EQ(errorText(N), "layer 1 has cost -2; costs must be finite and "
                          "non-negative");
}

//===----------------------------------------------------------------------===//
// Charts
//===----------------------------------------------------------------------===//

/// Tags balance (every opened element closed, in order), no raw '<' or
/// unescaped '&' in text, one root <svg>. Returns what is wrong, or "".
std::string checkXml(StringRef X) {
  SmallVector<std::string, 16> Open;
  int Roots = 0;
  size_t I = 0;
  while (I < X.size()) {
    size_t Lt = X.find('<', I);
    StringRef Text = X.slice(I, Lt == std::string::npos ? X.size() : Lt);
    for (size_t A = Text.find('&'); A != std::string::npos;
         A = Text.find('&', A + 1)) {
      StringRef Rest = Text.drop_front(A);
      if (!Rest.startswith("&lt;") && !Rest.startswith("&gt;") &&
          !Rest.startswith("&amp;") && !Rest.startswith("&quot;") &&
          !Rest.startswith("&#39;"))
        return "raw & in text: " + Rest.take_front(20).str();
    }
    if (Text.contains('>'))
      return "raw > in text: " + Text.take_front(40).str();
    if (Lt == std::string::npos)
      break;
    size_t Gt = X.find('>', Lt);
    if (Gt == std::string::npos)
      return "unterminated tag";
    StringRef Tag = X.slice(Lt + 1, Gt);
    if (Tag.contains('<'))
      return "'<' inside a tag: " + Tag.str();
    // Attribute values must not hold raw '<' or '&' either; quotes balance.
    if (Tag.count('"') % 2)
      return "unbalanced quotes in " + Tag.str();
    if (Tag.startswith("/")) {
      StringRef Name = Tag.drop_front().trim();
      if (Open.empty() || Open.back() != Name)
        return "closing " + Name.str() + " but open is " +
               (Open.empty() ? std::string("nothing") : Open.back());
      Open.pop_back();
    } else if (!Tag.endswith("/")) {
      StringRef Name = Tag.take_until([](char C) { return C == ' '; });
      if (Open.empty())
        ++Roots;
      Open.push_back(Name.str());
    } else if (Open.empty()) {
      ++Roots;
    }
    I = Gt + 1;
  }
  if (!Open.empty())
    return "unclosed " + Open.back();
  if (Roots != 1)
    return "expected one root element, got " + std::to_string(Roots);
  if (!X.trim().startswith("<svg"))
    return "not an svg";
  return "";
}

TEST(Charts, EscapeXml) {
  EXPECT_EQ(xmlEscape("a<b & \"c\" 'd'>"),
            "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
  EXPECT_EQ(checkXml("<svg><text>a & b</text></svg>"),
            "raw & in text: & b");
  EXPECT_EQ(checkXml("<svg><g></svg>"), "closing svg but open is g");
  EXPECT_EQ(checkXml("<svg><text>ok &amp; fine</text><rect/></svg>"), "");
}

TEST(Charts, Gantt) {
  Schedule S = build(ScheduleKind::Interleaved, 4, 2, 8);
  StepCosts C;
  C.Forward = {0.5};
  C.Backward = {0.75};
  C.Recompute = {0.25};
  C.Comm = 0.05;
  ScheduleTimes T = times(S, C);
  std::string Out;
  raw_string_ostream OS(Out);
  GanttOptions O;
  O.Title = "interleaved 1F1B <P=4, M=2> & recompute";
  O.TimeUnit = "ms";
  ASSERT_EQ(errorText(writeGanttSvg(OS, S, T, O)), "");
  EXPECT_EQ(checkXml(Out), "");
  for (StringRef Want :
       {"interleaved 1F1B &lt;P=4, M=2&gt; &amp; recompute", "rank 0",
        "rank 3", ">forward<", ">backward<", ">recompute<",
        ">communication<", ">idle (bubble)<", "time (ms)",
        ">lighter: later chunks (up to 1)<",
        "interleaved: P = 4, M = 2, N = 8; bubble",
        "forward of microbatch 7 chunk 1 (stage 7)", ">7</text>"})
    EXPECT_NE(StringRef(Out).find(Want), std::string::npos) << Want.str();
  // One forward block per (microbatch, stage), one backward and one
  // recompute block likewise.
  size_t Blocks = 0;
  for (size_t P = Out.find("<title>forward of"); P != std::string::npos;
       P = Out.find("<title>forward of", P + 1))
    ++Blocks;
  EXPECT_EQ(Blocks, size_t(8 * 8));
  // Timing of another schedule is refused.
  ScheduleTimes Other = times(build(ScheduleKind::OneFOneB, 2, 1, 2), C);
  std::string Ignored;
  raw_string_ostream OS2(Ignored);
  EXPECT_EQ(errorText(writeGanttSvg(OS2, S, Other, O)),
            "timing has 2 ranks, the schedule 4");
}

TEST(Charts, GroupedBars) {
  BarChart B;
  B.Title = "Figure 7: activation memory <% of tensor parallel>";
  B.XLabel = "model";
  B.YLabel = "activation memory (% of baseline)";
  B.Groups = {"22B", "175B", "530B", "1T"};
  B.Series = {"tensor parallel", "+ sequence parallel", "+ selective",
              "sp & selective"};
  B.Values = {{100, 66, 56, 34},
              {100, 64, 52, 30},
              {100, 63, 51, 29},
              {100, 62, 50, NAN}};
  B.Markers = {{100, 65, 55, 33},
               {100, 64, 52, 30},
               {NAN, NAN, NAN, NAN},
               {100, 62, 50, 28}};
  B.MarkerLabel = "paper";
  std::string Out;
  raw_string_ostream OS(Out);
  ASSERT_EQ(errorText(writeBarChartSvg(OS, B)), "");
  EXPECT_EQ(checkXml(Out), "");
  for (StringRef Want :
       {"Figure 7: activation memory &lt;% of tensor parallel&gt;", ">22B<",
        ">1T<", ">tensor parallel<", ">sp &amp; selective<", ">paper<",
        ">model<", "activation memory (% of baseline)", ">100%<", ">34%<",
        "rotate(-90"})
    EXPECT_NE(StringRef(Out).find(Want), std::string::npos) << Want.str();
  // 15 bars (one missing), 12 markers (four missing).
  auto Count = [&](StringRef Needle) {
    size_t N = 0;
    for (size_t P = Out.find(Needle.str()); P != std::string::npos;
         P = Out.find(Needle.str(), P + 1))
      ++N;
    return N;
  };
  size_t Bars = Count("</title></rect>"), Ticks = Count("</title></line>");
  EXPECT_EQ(Bars, 15u);
  EXPECT_EQ(Ticks, 12u);

  BarChart Bad = B;
  Bad.Values[1].pop_back();
  std::string Ignored;
  raw_string_ostream OS2(Ignored);
  EXPECT_EQ(errorText(writeBarChartSvg(OS2, Bad)),
            "bar chart values of group '175B' has 3 entries for 4 series");
  Bad = B;
  Bad.Markers.pop_back();
  EXPECT_EQ(errorText(writeBarChartSvg(OS2, Bad)),
            "bar chart markers has 3 rows for 4 groups");
  Bad = B;
  Bad.Values[0][0] = -1;
  EXPECT_EQ(errorText(writeBarChartSvg(OS2, Bad)),
            "bar chart values of group '22B' holds -1; values must be finite "
            "and non-negative");
}

} // namespace
