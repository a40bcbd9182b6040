//===- RunSupportTest.cpp - What sp-run builds around the executor --------===//
//
// Data offsets and file checks, .npy files, checkpoints (round trip and
// corruption), the learning-rate schedule, the loss log and plot, and the
// ONNX weight export.
//
//===----------------------------------------------------------------------===//
#include "TestSupport.h"
#include "frontend/OnnxExport.h"
#include "frontend/OnnxImporter.h"
#include "runtime/Checkpoint.h"
#include "runtime/DataLoader.h"
#include "runtime/LossLog.h"
#include "runtime/Npy.h"
#include "runtime/Sample.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CRC.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "gtest/gtest.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

using namespace sp;
using namespace sp::test;
using namespace llvm;

namespace {

void writeBytes(const std::string &Path, StringRef Bytes) {
  std::ofstream OS(Path, std::ios::binary);
  OS.write(Bytes.data(), Bytes.size());
}

/// A token file whose token i is Ids[i].
void writeTokens(const std::string &Path, ArrayRef<uint16_t> Ids) {
  std::string B;
  for (uint16_t T : Ids) {
    B += char(T & 0xff);
    B += char(T >> 8);
  }
  writeBytes(Path, B);
}

//===----------------------------------------------------------------------===//
// DataLoader
//===----------------------------------------------------------------------===//

TEST(DataLoader, OffsetsFollowTheContractWithWrapAround) {
  // T = 200 tokens; token i has id i, so a batch shows where it was read.
  TempDir D;
  std::vector<uint16_t> Ids(200);
  for (int I = 0; I < 200; ++I)
    Ids[I] = I;
  writeTokens(D.file("t.bin"), Ids);
  const int64_t B = 3, S = 8, T = 200;
  auto L = cantFail(DataLoader::open(D.file("t.bin"), B, S, 256));
  EXPECT_EQ(L->numTokens(), T);
  TokenBatch Data;
  const std::vector<int64_t> &Idx = Data.Tokens, &Targets = Data.Targets;
  // Enough steps to wrap around the file several times.
  for (int64_t Step = 1; Step <= 40; ++Step) {
    L->getBatch(Step, Data);
    EXPECT_TRUE(Data.Real.empty()) << "no --pad-token: every position is real";
    ASSERT_EQ(Idx.size(), size_t(B * S));
    for (int64_t R = 0; R < B; ++R) {
      int64_t K = Step - 1;
      int64_t O = ((K * B + R) * S) % (T - S);
      ASSERT_EQ(L->rowOffset(Step, R), O);
      for (int64_t J = 0; J < S; ++J) {
        EXPECT_EQ(Idx[R * S + J], O + J) << "step " << Step << " row " << R;
        EXPECT_EQ(Targets[R * S + J], O + J + 1);
      }
    }
  }
  // Step 9, row 1: k = 8, (8 * 3 + 1) * 8 = 200, 200 mod 192 = 8.
  EXPECT_EQ(L->rowOffset(9, 1), 8);
  // Huge step numbers do not overflow.
  const int64_t BigT = 1000003, BigS = 1 << 12, BigB = 1 << 20;
  EXPECT_EQ(batchRowOffset(int64_t(1) << 40, 5, BigB, BigS, BigT, false, 0),
            int64_t((((__int128(1) << 40) * BigB + 5) * BigS) % (BigT - BigS)));
  // The last possible target is token T - 1.
  EXPECT_EQ(batchRowOffset(0, 0, 1, 199, 200, false, 0), 0);
}

TEST(DataLoader, MixIsSplitMix64sOutputFunction) {
  // Reference values of SplitMix64's output function (golden-ratio step,
  // then the finalizer), computed independently.
  EXPECT_EQ(mix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(mix64(1), 0x910a2dec89025cc1ULL);
}

TEST(DataLoader, ShuffledOffsetsDependOnSeedStepAndRowOnly) {
  int64_t T = 10000, S = 16;
  std::set<int64_t> Seen;
  for (int64_t K = 0; K < 50; ++K)
    for (int64_t R = 0; R < 4; ++R) {
      int64_t O = batchRowOffset(K, R, 4, S, T, true, 1234);
      EXPECT_GE(O, 0);
      EXPECT_LT(O, T - S);
      EXPECT_EQ(O, batchRowOffset(K, R, 4, S, T, true, 1234));
      EXPECT_EQ(O, int64_t(mix64(mix64(mix64(1234) ^ K) ^ R) % (T - S)));
      Seen.insert(O);
    }
  EXPECT_GT(Seen.size(), 190u) << "offsets should look random";
  EXPECT_NE(batchRowOffset(3, 1, 4, S, T, true, 1),
            batchRowOffset(3, 1, 4, S, T, true, 2));
}

TEST(DataLoader, SyntheticTokensAreInRangeAndSeeded) {
  auto A = DataLoader::synthetic(7, 2, 32, 100);
  auto B = DataLoader::synthetic(7, 2, 32, 100);
  auto C = DataLoader::synthetic(8, 2, 32, 100);
  TokenBatch BA, BB, BC;
  A->getBatch(3, BA);
  B->getBatch(3, BB);
  C->getBatch(3, BC);
  const std::vector<int64_t> &IA = BA.Tokens, &TA = BA.Targets,
                             &IB = BB.Tokens, &IC = BC.Tokens;
  EXPECT_EQ(IA, IB);
  EXPECT_NE(IA, IC);
  for (int64_t X : IA) {
    EXPECT_GE(X, 0);
    EXPECT_LT(X, 100);
  }
  // Targets are the inputs shifted by one.
  EXPECT_TRUE(std::equal(IA.begin() + 1, IA.begin() + 32, TA.begin()));
}

/// The padding and masked-LM rules of DataLoader.h, position by position.
TEST(DataLoader, ObjectivesFollowTheContract) {
  TempDir D;
  const int64_t B = 4, S = 64, V = 50, Pad = 0, MaskId = 1;
  std::vector<uint16_t> Ids(5000);
  for (size_t I = 0; I < Ids.size(); ++I) // runs of padding among tokens
    Ids[I] = (I / 7) % 5 == 0 ? Pad : uint16_t(2 + mix64(I) % (V - 2));
  writeTokens(D.file("t.bin"), Ids);
  auto L = cantFail(DataLoader::open(D.file("t.bin"), B, S, V));
  L->setShuffle(true, 99);

  Objective Next;
  Next.PadToken = Pad;
  L->setObjective(Next);
  TokenBatch Data;
  L->getBatch(2, Data);
  ASSERT_EQ(Data.Real.size(), size_t(B * S));
  for (int64_t R = 0; R < B; ++R)
    for (int64_t J = 0, O = L->rowOffset(2, R); J < S; ++J) {
      int64_t I = R * S + J, X = Ids[O + J], Y = Ids[O + J + 1];
      EXPECT_EQ(Data.Tokens[I], X);
      EXPECT_EQ(Data.Real[I], X != Pad);
      EXPECT_EQ(Data.Targets[I], X == Pad || Y == Pad ? IgnoreTarget : Y);
    }

  Objective Mlm = Next;
  Mlm.Kind = Objective::MaskedLM;
  Mlm.MaskToken = MaskId;
  Mlm.MaskRate = 0.25;
  Mlm.Seed = 7;
  L->setObjective(Mlm);
  int64_t Real = 0, Chosen = 0, Masked = 0, Kept = 0;
  for (int64_t Step = 1; Step <= 40; ++Step) {
    L->getBatch(Step, Data);
    for (int64_t R = 0; R < B; ++R) {
      uint64_t RowHash =
          mix64(mix64(mix64(7 ^ 0x6d6c6dULL) ^ uint64_t(Step - 1)) ^ R);
      for (int64_t J = 0, O = L->rowOffset(Step, R); J < S; ++J) {
        int64_t I = R * S + J, X = Ids[O + J];
        uint64_t H = mix64(RowHash ^ uint64_t(J));
        bool Choose = X != Pad && double(H >> 11) * 0x1p-53 < 0.25;
        ASSERT_EQ(Data.Real[I], X != Pad);
        ASSERT_EQ(Data.Targets[I], Choose ? X : IgnoreTarget);
        Real += X != Pad;
        if (!Choose) {
          ASSERT_EQ(Data.Tokens[I], X);
          continue;
        }
        ++Chosen;
        uint64_t H2 = mix64(H);
        double U = double(H2 >> 11) * 0x1p-53;
        int64_t Want = U < 0.8   ? MaskId
                       : U < 0.9 ? int64_t(mix64(H2) % uint64_t(V))
                                 : X;
        ASSERT_EQ(Data.Tokens[I], Want);
        Masked += Want == MaskId;
        Kept += U >= 0.9;
      }
    }
  }
  // The rule is deterministic; these show it is the one meant (about 8200
  // real positions: each share is within 5 standard deviations).
  EXPECT_NEAR(double(Chosen) / Real, 0.25, 0.025);
  EXPECT_NEAR(double(Masked) / Chosen, 0.8, 0.04);
  EXPECT_NEAR(double(Kept) / Chosen, 0.1, 0.03);
  // Another seed chooses other positions.
  Mlm.Seed = 8;
  L->setObjective(Mlm);
  TokenBatch Other;
  L->getBatch(40, Other);
  EXPECT_NE(Other.Targets, Data.Targets);
}

/// Two data-parallel replicas read, between them, exactly the batch one
/// loader of twice the rows reads: offsets, masked-LM choices and padding.
TEST(DataLoader, DataParallelReplicasSplitTheGlobalBatch) {
  TempDir D;
  std::vector<uint16_t> Ids(3000);
  for (size_t I = 0; I < Ids.size(); ++I)
    Ids[I] = uint16_t(mix64(I) % 40);
  writeTokens(D.file("t.bin"), Ids);
  Objective Mlm;
  Mlm.Kind = Objective::MaskedLM;
  Mlm.PadToken = 0;
  Mlm.MaskToken = 1;
  Mlm.Seed = 3;
  for (bool Shuffle : {false, true}) {
    auto Whole = cantFail(DataLoader::open(D.file("t.bin"), 4, 16, 40));
    Whole->setShuffle(Shuffle, 11);
    Whole->setObjective(Mlm);
    TokenBatch All;
    Whole->getBatch(5, All);
    for (int Rank = 0; Rank < 2; ++Rank) {
      auto Half = cantFail(DataLoader::open(D.file("t.bin"), 2, 16, 40));
      Half->setShuffle(Shuffle, 11);
      Half->setObjective(Mlm);
      Half->setDataParallel(Rank, 2);
      TokenBatch Mine;
      Half->getBatch(5, Mine);
      size_t From = size_t(Rank) * 2 * 16, N = 2 * 16;
      EXPECT_EQ(Mine.Tokens, std::vector<int64_t>(All.Tokens.begin() + From,
                                                  All.Tokens.begin() + From + N));
      EXPECT_EQ(Mine.Targets,
                std::vector<int64_t>(All.Targets.begin() + From,
                                     All.Targets.begin() + From + N));
      EXPECT_EQ(Mine.Real, std::vector<uint8_t>(All.Real.begin() + From,
                                                All.Real.begin() + From + N));
    }
  }
}

TEST(DataLoader, BadObjectivesNameTheirFlag) {
  auto Msg = [](Objective O) {
    Error E = checkObjective(O, 100);
    return E ? toString(std::move(E)) : std::string();
  };
  Objective O;
  EXPECT_EQ(Msg(O), "");
  O.PadToken = 100;
  EXPECT_EQ(Msg(O), "--pad-token 100 is not a token id of the model's "
                    "vocabulary [0, 100)");
  O.PadToken = 0;
  O.Kind = Objective::MaskedLM;
  EXPECT_NE(Msg(O).find("--objective masked-lm needs --mask-token ID"),
            std::string::npos);
  O.MaskToken = 0;
  EXPECT_NE(Msg(O).find("--mask-token and --pad-token are both 0"),
            std::string::npos);
  O.MaskToken = 5;
  O.MaskRate = 0;
  EXPECT_EQ(Msg(O), "--mask-rate 0 must be in (0, 1]");
  O.MaskRate = 1;
  EXPECT_EQ(Msg(O), "");
}

TEST(DataLoader, BadFilesAreRefusedWithTheirProblem) {
  TempDir D;
  auto Open = [&](StringRef Name) {
    return DataLoader::open(D.file(Name), 2, 8, 256);
  };
  auto Missing = Open("missing.bin");
  ASSERT_FALSE(Missing);
  EXPECT_NE(errorText(Missing.takeError()).find("cannot read data file"),
            std::string::npos);

  writeBytes(D.file("odd.bin"), StringRef("abc", 3));
  auto Odd = Open("odd.bin");
  ASSERT_FALSE(Odd);
  EXPECT_NE(errorText(Odd.takeError()).find("odd size (3 bytes)"),
            std::string::npos);

  writeTokens(D.file("short.bin"), std::vector<uint16_t>(8, 1));
  auto Short = Open("short.bin");
  ASSERT_FALSE(Short);
  EXPECT_EQ(errorText(Short.takeError()),
            "data file '" + D.file("short.bin") +
                "' has 8 tokens; a batch row needs S + 1 = 9");
  writeTokens(D.file("ok.bin"), std::vector<uint16_t>(9, 1));
  EXPECT_TRUE(bool(Open("ok.bin")));

  std::vector<uint16_t> Ids(20, 3);
  Ids[13] = 256;
  writeTokens(D.file("vocab.bin"), Ids);
  auto Vocab = Open("vocab.bin");
  ASSERT_FALSE(Vocab);
  EXPECT_EQ(errorText(Vocab.takeError()),
            "data file '" + D.file("vocab.bin") +
                "': token 13 (byte offset 26) is 256, not below the model's "
                "vocabulary size 256");
}

//===----------------------------------------------------------------------===//
// Npy
//===----------------------------------------------------------------------===//

TEST(Npy, RoundTripsEveryRank) {
  TempDir D;
  std::vector<std::vector<int64_t>> Shapes = {{}, {5}, {2, 3}, {2, 3, 4}};
  for (const auto &Shape : Shapes) {
    int64_t N = 1;
    for (int64_t X : Shape)
      N *= X;
    std::vector<float> Data(N);
    for (int64_t I = 0; I < N; ++I)
      Data[I] = float(I) * 0.5f - 3.25f;
    Data[0] = -0.0f;
    std::string Path = D.file("a" + std::to_string(Shape.size()) + ".npy");
    ASSERT_FALSE(errorText(writeNpy(Path, Shape, Data)).size());
    std::string Bytes = npyBytes(Shape, Data);
    // The data starts 64-byte aligned after a newline-terminated header.
    size_t HeaderLen = uint8_t(Bytes[8]) | (uint8_t(Bytes[9]) << 8);
    EXPECT_EQ((10 + HeaderLen) % 64, 0u);
    EXPECT_EQ(Bytes[10 + HeaderLen - 1], '\n');
    auto A = cantFail(readNpy(Path));
    EXPECT_EQ(ArrayRef<int64_t>(A.Shape), ArrayRef<int64_t>(Shape));
    ASSERT_EQ(A.Data.size(), Data.size());
    EXPECT_EQ(0, std::memcmp(A.Data.data(), Data.data(), 4 * Data.size()));
  }
  EXPECT_NE(npyBytes({5}, std::vector<float>(5)).find("'shape': (5,)"),
            std::string::npos);
  EXPECT_NE(npyBytes({2, 3}, std::vector<float>(6)).find("'shape': (2, 3)"),
            std::string::npos);
  EXPECT_NE(npyBytes({}, std::vector<float>(1)).find("'shape': ()"),
            std::string::npos);
}

TEST(Npy, RefusesOtherFiles) {
  EXPECT_FALSE(bool(parseNpy("not numpy at all", "x.npy")));
  std::string B = npyBytes({4}, std::vector<float>(4));
  EXPECT_FALSE(bool(parseNpy(StringRef(B).drop_back(1), "x.npy")));
}

//===----------------------------------------------------------------------===//
// Checkpoint
//===----------------------------------------------------------------------===//

/// Tensors owning their storage, viewed as the executor would show them.
struct FakeState {
  std::vector<std::vector<float>> Storage;
  std::vector<TensorView> Views;
  FakeState() {
    add("w", {3, 4}, 0.25f);
    add("b", {4}, -1.0f);
    add("adam.m.w", {3, 4}, 0.5f);
  }
  void add(std::string Name, std::vector<int64_t> Shape, float Base) {
    int64_t N = 1;
    for (int64_t X : Shape)
      N *= X;
    Storage.emplace_back(N);
    for (int64_t I = 0; I < N; ++I)
      Storage.back()[I] = Base + float(I) / 7;
    TensorView V;
    V.Name = Name;
    V.Type = V.FullType = TensorType(DType::F32, Shape);
    Views.push_back(V);
    for (size_t I = 0; I < Views.size(); ++I)
      Views[I].Data = Storage[I].data();
  }
  void scramble() {
    for (auto &S : Storage)
      for (float &X : S)
        X = 42;
  }
};

CheckpointMeta someMeta() {
  CheckpointMeta M;
  M.Step = 7;
  M.Seed = 0xfedcba9876543210ULL;
  M.PlanFingerprint = "0x0123456789abcdef";
  for (int64_t S = 1; S <= 7; ++S)
    M.Losses.push_back({S, 5.0 / double(S) + 1e-9, 1e-3 * std::cos(S)});
  return M;
}

TEST(Checkpoint, RoundTripsTensorsAndMeta) {
  TempDir D;
  FakeState A;
  std::string Dir = D.file("ckpt");
  EXPECT_FALSE(checkpointExists(Dir));
  ASSERT_FALSE(errorText(writeCheckpoint(Dir, someMeta(), A.Views)).size());
  EXPECT_TRUE(checkpointExists(Dir));
  auto Original = A.Storage;
  A.scramble();
  auto M = cantFail(readCheckpoint(Dir, "0x0123456789abcdef", A.Views));
  EXPECT_EQ(A.Storage, Original);
  CheckpointMeta Want = someMeta();
  EXPECT_EQ(M.Step, Want.Step);
  EXPECT_EQ(M.Seed, Want.Seed);
  ASSERT_EQ(M.Losses.size(), Want.Losses.size());
  for (size_t I = 0; I < M.Losses.size(); ++I) {
    EXPECT_EQ(M.Losses[I].Step, Want.Losses[I].Step);
    EXPECT_EQ(M.Losses[I].Loss, Want.Losses[I].Loss); // bitwise
    EXPECT_EQ(M.Losses[I].LR, Want.Losses[I].LR);
  }
  EXPECT_EQ(cantFail(readCheckpointMeta(Dir)).Step, 7);

  // Rewriting replaces it whole and leaves no temporary behind.
  CheckpointMeta Later = someMeta();
  Later.Step = 9;
  ASSERT_FALSE(errorText(writeCheckpoint(Dir, Later, A.Views)).size());
  EXPECT_EQ(cantFail(readCheckpointMeta(Dir)).Step, 9);
  std::error_code EC;
  int Entries = 0;
  for (sys::fs::directory_iterator I(D.Path, EC), E; I != E && !EC;
       I.increment(EC))
    ++Entries;
  EXPECT_EQ(Entries, 1);
}

TEST(Checkpoint, DetectsCorruptionAndChangesNothing) {
  TempDir D;
  FakeState A;
  std::string Dir = D.file("ckpt");
  ASSERT_FALSE(errorText(writeCheckpoint(Dir, someMeta(), A.Views)).size());
  auto Buf = cantFail(errorOrToExpected(
      MemoryBuffer::getFile(Dir + "/tensors-7.bin", false, false)));
  std::string Bytes = Buf->getBuffer().str();

  // A flipped byte in the second tensor ("b" starts at 48).
  std::string Flipped = Bytes;
  Flipped[50] ^= 0x10;
  writeBytes(Dir + "/tensors-7.bin", Flipped);
  A.scramble();
  auto Snapshot = A.Storage;
  auto R = readCheckpoint(Dir, "0x0123456789abcdef", A.Views);
  ASSERT_FALSE(R);
  EXPECT_EQ(errorText(R.takeError()),
            "checkpoint '" + Dir +
                "' is corrupt: tensor 'b' fails its checksum");
  EXPECT_EQ(A.Storage, Snapshot) << "a corrupt checkpoint must change nothing";

  // Truncated.
  writeBytes(Dir + "/tensors-7.bin", StringRef(Bytes).drop_back(4));
  R = readCheckpoint(Dir, "0x0123456789abcdef", A.Views);
  ASSERT_FALSE(R);
  EXPECT_EQ(
      errorText(R.takeError()),
      "checkpoint '" + Dir +
          "' is corrupt: tensors-7.bin has 108 bytes, the index needs 112");
  writeBytes(Dir + "/tensors-7.bin", Bytes);
  EXPECT_TRUE(bool(readCheckpoint(Dir, "0x0123456789abcdef", A.Views)));

  // An edited index.
  auto Index = cantFail(
      errorOrToExpected(MemoryBuffer::getFile(Dir + "/checkpoint.json")));
  std::string Text = Index->getBuffer().str();
  std::string Edited = Text;
  size_t At = Edited.find("\"step\": 7");
  ASSERT_NE(At, std::string::npos);
  Edited.replace(At, 9, "\"step\": 8");
  writeBytes(Dir + "/checkpoint.json", Edited);
  R = readCheckpoint(Dir, "0x0123456789abcdef", A.Views);
  ASSERT_FALSE(R);
  EXPECT_NE(errorText(R.takeError()).find("checkpoint.json fails its checksum"),
            std::string::npos);
  writeBytes(Dir + "/checkpoint.json", Text.substr(0, Text.size() / 2));
  R = readCheckpoint(Dir, "0x0123456789abcdef", A.Views);
  ASSERT_FALSE(R);
  EXPECT_NE(errorText(R.takeError()).find("checkpoint.json is not valid JSON"),
            std::string::npos);
}

/// A [6, 4] weight in three blocks of 2 rows along dim 0, over 2 tensor-parallel
/// ranks (a fused-QKV-like layout) with its moment chunked over 2 replicas:
/// the 4 ranks of a d 2 x t 2 grid write their pieces; one rank of t 1 and
/// rank (d 1, t 1) of a d 2 x t 2 grid without blocks read them back.
TEST(Checkpoint, ReshardsBetweenLayouts) {
  TempDir D;
  std::string Dir = D.file("ckpt");
  std::vector<float> Whole(24), Moment(24);
  for (int I = 0; I < 24; ++I) {
    Whole[I] = float(I);
    Moment[I] = 100.0f + float(I);
  }
  Sharding S = Sharding::split(0, 2, /*Blocks=*/3); // 6 rows: 3 blocks of 2
  Sharding SC = S;
  SC.DataChunks = 2;
  ProcessGrid Grid{2, 1, 2};
  std::vector<std::string> Shards;
  for (int R = 0; R < 4; ++R) {
    GridCoord At = Grid.coord(R);
    // Tensor rank t holds row 2b + t of every block b: 3 rows of 4.
    std::vector<float> W(12), M(12);
    for (int B = 0; B < 3; ++B)
      for (int C = 0; C < 4; ++C) {
        W[B * 4 + C] = Whole[(2 * B + At.Tensor) * 4 + C];
        M[B * 4 + C] = Moment[(2 * B + At.Tensor) * 4 + C];
      }
    std::vector<float> Chunk(M.begin() + 6 * At.Data,
                             M.begin() + 6 * At.Data + 6);
    TensorView VW, VM;
    VW.Name = "w";
    VW.Type = TensorType(DType::F32, {3, 4});
    VW.Data = W.data();
    VM.Name = "adam.m.w";
    VM.Type = TensorType(DType::F32, {6});
    VM.Data = Chunk.data();
    std::vector<Executor::ModelTensor> Model = {{"w", {6, 4}, S},
                                                {"adam.m:w", {6, 4}, SC}};
    auto Shard = writeCheckpointShard(Dir, 7, R, 4, {VW, VM}, Model, At);
    ASSERT_TRUE(bool(Shard)) << errorText(Shard.takeError());
    Shards.push_back(*Shard);
  }
  CheckpointMeta Meta = someMeta();
  Meta.Ranks = 4;
  Meta.Grid = Grid;
  Meta.ModelFingerprint = "0x00000000000000aa";
  ASSERT_FALSE(errorText(commitCheckpoint(Dir, Meta, Shards)).size());

  // One device: the whole tensors.
  std::vector<float> W1(24, -1), M1(24, -1);
  TensorView A, B;
  A.Name = "w";
  A.Type = TensorType(DType::F32, {6, 4});
  A.Data = W1.data();
  B.Name = "adam.m.w";
  B.Type = A.Type;
  B.Data = M1.data();
  std::vector<Executor::ModelTensor> One = {
      {"w", {6, 4}, Sharding::replicated()},
      {"adam.m:w", {6, 4}, Sharding::replicated()}};
  auto R1 = readCheckpointResharded(Dir, "0x00000000000000aa", {A, B}, One,
                                    GridCoord{});
  ASSERT_TRUE(bool(R1)) << errorText(R1.takeError());
  EXPECT_EQ(R1->Step, 7);
  EXPECT_EQ(W1, Whole);
  EXPECT_EQ(M1, Moment);

  // Rank (d 1, t 1) of a plain split (rows 3-5), its moment chunk 1 of 2
  // (6 of the 12 elements).
  std::vector<float> W2(12, -1), M2(6, -1);
  A.Type = TensorType(DType::F32, {3, 4});
  A.Data = W2.data();
  B.Type = TensorType(DType::F32, {6});
  B.Data = M2.data();
  Sharding Plain = Sharding::split(0, 2);
  Sharding PlainC = Plain;
  PlainC.DataChunks = 2;
  std::vector<Executor::ModelTensor> Two = {{"w", {6, 4}, Plain},
                                            {"adam.m:w", {6, 4}, PlainC}};
  auto R2 = readCheckpointResharded(Dir, "0x00000000000000aa", {A, B}, Two,
                                    GridCoord{1, 0, 1});
  ASSERT_TRUE(bool(R2)) << errorText(R2.takeError());
  EXPECT_EQ(W2, std::vector<float>(Whole.begin() + 12, Whole.end()));
  EXPECT_EQ(M2, std::vector<float>(Moment.begin() + 18, Moment.end()));

  // Another model's fingerprint, or a key it does not have: refused, and
  // nothing written.
  std::fill(W2.begin(), W2.end(), -1.0f);
  auto R3 = readCheckpointResharded(Dir, "0x00000000000000bb", {A, B}, Two,
                                    GridCoord{1, 0, 1});
  ASSERT_FALSE(R3);
  EXPECT_NE(errorText(R3.takeError()).find("was written for another model"),
            std::string::npos);
  Two[0].Key = "v";
  auto R4 = readCheckpointResharded(Dir, "0x00000000000000aa", {A, B}, Two,
                                    GridCoord{1, 0, 1});
  ASSERT_FALSE(R4);
  EXPECT_NE(errorText(R4.takeError()).find("it has no 'v'"),
            std::string::npos);
  EXPECT_EQ(W2, std::vector<float>(12, -1.0f));
}

TEST(Checkpoint, RefusesAnotherPlanAndOtherTensors) {
  TempDir D;
  FakeState A;
  std::string Dir = D.file("ckpt");
  ASSERT_FALSE(errorText(writeCheckpoint(Dir, someMeta(), A.Views)).size());
  auto R = readCheckpoint(Dir, "0x1111111111111111", A.Views);
  ASSERT_FALSE(R);
  EXPECT_NE(errorText(R.takeError()).find("was written for another plan"),
            std::string::npos);
  FakeState B;
  B.add("extra", {2}, 0);
  R = readCheckpoint(Dir, "0x0123456789abcdef", B.Views);
  ASSERT_FALSE(R);
  EXPECT_NE(errorText(R.takeError()).find("it has no tensor 'extra'"),
            std::string::npos);
  auto Missing = readCheckpoint(D.file("none"), "x", A.Views);
  ASSERT_FALSE(Missing);
  EXPECT_NE(errorText(Missing.takeError()).find("there is no checkpoint in"),
            std::string::npos);
  // A folder that is not a checkpoint is never overwritten.
  std::string Other = D.file("other");
  sys::fs::create_directories(Other);
  writeBytes(Other + "/precious", "x");
  Error E = writeCheckpoint(Other, someMeta(), A.Views);
  EXPECT_NE(errorText(std::move(E)).find("refusing to overwrite"),
            std::string::npos);
  EXPECT_TRUE(sys::fs::exists(Other + "/precious"));
}

/// The names in Dir, sorted.
std::vector<std::string> listDir(StringRef Dir) {
  std::vector<std::string> Names;
  std::error_code EC;
  for (sys::fs::directory_iterator I(Dir, EC), E; I != E && !EC;
       I.increment(EC))
    Names.push_back(sys::path::filename(I->path()).str());
  std::sort(Names.begin(), Names.end());
  return Names;
}

TEST(Checkpoint, ShardsOfSeveralRanks) {
  TempDir D;
  std::string Dir = D.file("ckpt");
  FakeState R0, R1; // two ranks: the same names, other values
  for (auto &S : R1.Storage)
    for (float &X : S)
      X = -X;
  auto S0 = writeCheckpointShard(Dir, 7, 0, 2, R0.Views);
  auto S1 = writeCheckpointShard(Dir, 7, 1, 2, R1.Views);
  ASSERT_TRUE(bool(S0) && bool(S1));
  EXPECT_FALSE(checkpointExists(Dir)) << "nothing is committed yet";
  CheckpointMeta M = someMeta();
  M.Ranks = 2;
  ASSERT_FALSE(errorText(commitCheckpoint(Dir, M, {*S0, *S1})).size());
  EXPECT_EQ(listDir(Dir),
            (std::vector<std::string>{"checkpoint.json", "tensors-7-rank0.bin",
                                      "tensors-7-rank1.bin"}));
  EXPECT_EQ(cantFail(readCheckpointMeta(Dir)).Ranks, 2);
  auto Want0 = R0.Storage, Want1 = R1.Storage;
  R0.scramble();
  R1.scramble();
  cantFail(readCheckpoint(Dir, "0x0123456789abcdef", R1.Views, 1, 2));
  cantFail(readCheckpoint(Dir, "0x0123456789abcdef", R0.Views, 0, 2));
  EXPECT_EQ(R0.Storage, Want0);
  EXPECT_EQ(R1.Storage, Want1);
  // Read as one rank: refused, naming both counts.
  auto One = readCheckpoint(Dir, "0x0123456789abcdef", R0.Views);
  ASSERT_FALSE(One);
  EXPECT_NE(errorText(One.takeError()).find("holds 2 ranks, this run has 1"),
            std::string::npos);
}

TEST(Checkpoint, AKilledWriteLeavesTheCommittedOne) {
  TempDir D;
  FakeState A;
  std::string Dir = D.file("ckpt");
  ASSERT_FALSE(errorText(writeCheckpoint(Dir, someMeta(), A.Views)).size());
  auto Want = A.Storage;
  // A write of step 9 killed before its commit: its data file and a
  // temporary index are there, the index still names step 7.
  for (auto &S : A.Storage)
    for (float &X : S)
      X += 1;
  ASSERT_TRUE(bool(writeCheckpointShard(Dir, 9, 0, 1, A.Views)));
  writeBytes(Dir + "/.checkpoint.json.tmp-12345678", "{\"half");
  EXPECT_EQ(cantFail(readCheckpointMeta(Dir)).Step, 7);
  A.scramble();
  cantFail(readCheckpoint(Dir, "0x0123456789abcdef", A.Views));
  EXPECT_EQ(A.Storage, Want);
  EXPECT_FALSE(errorText(checkCheckpointTarget(Dir)).size());
  EXPECT_EQ(cantFail(cleanCheckpointDir(Dir)), 2);
  EXPECT_EQ(listDir(Dir),
            (std::vector<std::string>{"checkpoint.json", "tensors-7.bin"}));

  // Killed before the first commit: only leftovers (and a lock file). It is
  // a checkpoint directory to write, with no checkpoint to read.
  std::string First = D.file("first");
  ASSERT_TRUE(bool(writeCheckpointShard(First, 3, 0, 1, A.Views)));
  writeBytes(First + "/.sp-run.lock", "pid 1\n");
  EXPECT_FALSE(checkpointExists(First));
  EXPECT_FALSE(errorText(checkCheckpointTarget(First)).size());
  EXPECT_EQ(cantFail(cleanCheckpointDir(First)), 1);
  EXPECT_EQ(listDir(First), (std::vector<std::string>{".sp-run.lock"}));
}

TEST(Checkpoint, RewritingTheSameStepNeverTouchesTheCommittedFile) {
  TempDir D;
  FakeState A;
  std::string Dir = D.file("ckpt");
  ASSERT_FALSE(errorText(writeCheckpoint(Dir, someMeta(), A.Views)).size());
  auto Committed = cantFail(errorOrToExpected(
      MemoryBuffer::getFile(Dir + "/tensors-7.bin", false, false)));
  auto Shard = writeCheckpointShard(Dir, 7, 0, 1, A.Views);
  ASSERT_TRUE(bool(Shard));
  EXPECT_NE(Shard->find("tensors-7.g1.bin"), std::string::npos);
  ASSERT_FALSE(errorText(commitCheckpoint(Dir, someMeta(), {*Shard})).size());
  EXPECT_EQ(listDir(Dir),
            (std::vector<std::string>{"checkpoint.json", "tensors-7.g1.bin"}));
  A.scramble();
  cantFail(readCheckpoint(Dir, "0x0123456789abcdef", A.Views));
  EXPECT_EQ(StringRef(reinterpret_cast<const char *>(A.Storage[0].data()),
                      A.Storage[0].size() * 4),
            Committed->getBuffer().take_front(A.Storage[0].size() * 4));
}

TEST(Checkpoint, ReadsVersion1) {
  // Version 1: one rank, tensors.bin, the tensors at the top of the index.
  TempDir D;
  FakeState A;
  std::string Dir = D.file("v1");
  sys::fs::create_directories(Dir);
  nlohmann::json Tensors = nlohmann::json::array();
  std::string Data;
  for (const TensorView &T : A.Views) {
    std::string Bytes(reinterpret_cast<const char *>(T.Data), T.size() * 4);
    Tensors.push_back({{"name", T.Name},
                       {"shape", std::vector<int64_t>(T.Type.Shape.begin(),
                                                      T.Type.Shape.end())},
                       {"offset", Data.size()},
                       {"bytes", Bytes.size()},
                       {"crc32", crc32(arrayRefFromStringRef(Bytes))}});
    Data += Bytes;
  }
  nlohmann::json Index = {{"format", "sp-checkpoint"},
                          {"version", 1},
                          {"step", 4},
                          {"seed", 9},
                          {"plan_fingerprint", "0x0123456789abcdef"},
                          {"data", "tensors.bin"},
                          {"losses", nlohmann::json::array()},
                          {"data_bytes", Data.size()},
                          {"tensors", Tensors}};
  Index["checksum"] = crc32(arrayRefFromStringRef(Index.dump()));
  writeBytes(Dir + "/checkpoint.json", Index.dump(1));
  writeBytes(Dir + "/tensors.bin", Data);
  auto Want = A.Storage;
  A.scramble();
  auto M = readCheckpoint(Dir, "0x0123456789abcdef", A.Views);
  ASSERT_TRUE(bool(M)) << errorText(M.takeError());
  EXPECT_EQ(M->Step, 4);
  EXPECT_EQ(A.Storage, Want);
  // The next write replaces it with version 2 and removes tensors.bin.
  CheckpointMeta Next = someMeta();
  ASSERT_FALSE(errorText(writeCheckpoint(Dir, Next, A.Views)).size());
  EXPECT_EQ(listDir(Dir),
            (std::vector<std::string>{"checkpoint.json", "tensors-7.bin"}));
}

TEST(Checkpoint, AnUnwritableDirectoryIsOneLineWithTheReason) {
  TempDir D;
  FakeState A;
  writeBytes(D.file("file"), "x");
  std::string Dir = D.file("file") + "/ckpt";
  Error E = writeCheckpoint(Dir, someMeta(), A.Views);
  EXPECT_EQ(errorText(std::move(E)),
            "cannot write checkpoint '" + Dir +
                "' (step 7): cannot create the directory: Not a directory");
}

TEST(Checkpoint, FingerprintIgnoresOffsetsButNotShapes) {
  Program P;
  ProgramBuffer W;
  W.Name = "w";
  W.K = ProgramBuffer::Param;
  W.Type = TensorType(DType::F32, {4, 4});
  W.Bytes = 64;
  W.Offset = 0;
  P.Buffers.push_back(W);
  P.ArenaBytes = P.PersistentBytes = 64;
  std::string F = planFingerprint(P);
  Program Moved = P;
  Moved.Buffers[0].Offset = 128;
  Moved.ArenaBytes = 192;
  EXPECT_EQ(planFingerprint(Moved), F);
  Program Reshaped = P;
  Reshaped.Buffers[0].Type = TensorType(DType::F32, {2, 8});
  EXPECT_NE(planFingerprint(Reshaped), F);
}

//===----------------------------------------------------------------------===//
// Schedule, loss log, plot, progress
//===----------------------------------------------------------------------===//

TEST(LossLog, LearningRateSchedule) {
  const double P = 1e-3, M = 1e-4;
  // Linear warmup to the peak.
  EXPECT_DOUBLE_EQ(learningRate(1, 100, 10, P, M), P / 10);
  EXPECT_DOUBLE_EQ(learningRate(5, 100, 10, P, M), P / 2);
  EXPECT_DOUBLE_EQ(learningRate(10, 100, 10, P, M), P);
  // Cosine from the peak to the minimum.
  EXPECT_DOUBLE_EQ(learningRate(100, 100, 10, P, M), M);
  EXPECT_DOUBLE_EQ(learningRate(55, 100, 10, P, M), (P + M) / 2);
  EXPECT_DOUBLE_EQ(learningRate(11, 100, 10, P, M),
                   M + 0.5 * (P - M) * (1 + std::cos(M_PI / 90)));
  // Without warmup, step 1 is already one step into the decay.
  EXPECT_DOUBLE_EQ(learningRate(1, 10, 0, P, M),
                   M + 0.5 * (P - M) * (1 + std::cos(M_PI * 0.1)));
  EXPECT_DOUBLE_EQ(learningRate(10, 10, 0, P, M), M);
  // A constant rate when min = peak; warmup longer than the run.
  EXPECT_DOUBLE_EQ(learningRate(7, 10, 0, P, P), P);
  EXPECT_DOUBLE_EQ(learningRate(5, 5, 10, P, M), P / 2);
  // Steps == warmup: the decay divides by max(1, N - W).
  EXPECT_DOUBLE_EQ(learningRate(4, 3, 3, P, M),
                   M + 0.5 * (P - M) * (1 + std::cos(M_PI)));
}

TEST(LossLog, CsvAndProgressLine) {
  std::vector<LossRow> Rows = {{1, 5.5, 1e-3}, {2, 5.25, 5e-4}};
  Rows[1].GradNorm = 0.75;
  Rows[1].ValLoss = 5.125;
  Rows[1].TokensPerSecond = 1000;
  Rows[1].FlopsPerSecond = 2.5e9;
  Rows[1].MFU = 0.125;
  // Unmeasured values are empty fields.
  EXPECT_EQ(lossCsv(Rows),
            "step,loss,lr,grad_norm,val_loss,tokens_per_s,model_flops_per_s,"
            "mfu\n1,5.5,0.001,,,,,\n2,5.25,0.0005,0.75,5.125,1000,2.5e+09,"
            "0.125\n");
  EXPECT_EQ(groupThousands(12345), "12,345");
  EXPECT_EQ(groupThousands(999), "999");
  EXPECT_EQ(groupThousands(1000000), "1,000,000");
  EXPECT_EQ(flopRate(1.234e12), "1.23 TFLOP/s");
  EXPECT_EQ(flopRate(456e9), "456 GFLOP/s");
  EXPECT_EQ(flopRate(78.9e6), "78.9 MFLOP/s");
  EXPECT_EQ(flopRate(12), "12.0 FLOP/s");
  LossRow R{7, 4.12341, 9.8e-4};
  R.TokensPerSecond = 12345.2;
  EXPECT_EQ(progressLine(20, R),
            "step 7/20 [#######.............] loss 4.1234 lr 9.8e-04 12,345 "
            "tok/s");
  R.GradNorm = 1.23456;
  R.FlopsPerSecond = 4.5e9;
  R.MFU = 0.0456;
  EXPECT_EQ(progressLine(20, R, /*BarWidth=*/0),
            "step 7/20 loss 4.1234 lr 9.8e-04 gnorm 1.23 12,345 tok/s 4.50 "
            "GFLOP/s MFU 4.6%");
  EXPECT_EQ(progressLine(20, LossRow{20, 1, 1e-4}),
            "step 20/20 [####################] loss 1.0000 lr 1.0e-04");
  // The float32 loss reads back exactly from the CSV.
  float L = 4.71956015f;
  std::string Csv = lossCsv({{1, double(L), 0}});
  EXPECT_EQ(float(std::stod(Csv.substr(Csv.find("\n1,") + 3))), L);
}

TEST(LossLog, ProgressEveryNStepsWithoutATerminal) {
  std::string Text;
  raw_string_ostream OS(Text);
  ProgressBar Bar(OS, /*Terminal=*/false, /*Every=*/4);
  for (int64_t Step = 3; Step <= 10; ++Step)
    Bar.update(10, LossRow{Step, 2, 1e-3}, /*FirstStep=*/3);
  Bar.note("step 10: validation loss 2.5000");
  Bar.finish();
  // The first step, every 4th, the last; then the note.
  EXPECT_EQ(OS.str(), "step 3/10 loss 2.0000 lr 1.0e-03\n"
                      "step 4/10 loss 2.0000 lr 1.0e-03\n"
                      "step 8/10 loss 2.0000 lr 1.0e-03\n"
                      "step 10/10 loss 2.0000 lr 1.0e-03\n"
                      "step 10: validation loss 2.5000\n");
  // On a terminal: one line redrawn; a note takes the bar's line.
  std::string Tty;
  raw_string_ostream TOS(Tty);
  ProgressBar TBar(TOS, /*Terminal=*/true, /*Every=*/4);
  TBar.update(2, LossRow{1, 2, 1e-3}, 1);
  TBar.note("v");
  TBar.update(2, LossRow{2, 2, 1e-3}, 1);
  TBar.finish();
  std::string Bar1 = progressLine(2, LossRow{1, 2, 1e-3});
  EXPECT_EQ(TOS.str(), "\r" + Bar1 + "\r" + "v" +
                           std::string(Bar1.size() - 1, ' ') + "\n\r" +
                           progressLine(2, LossRow{2, 2, 1e-3}) + "\n");
}

/// Well-formed enough: every tag closes in order, one root <svg>.
bool tagsBalance(StringRef S) {
  std::vector<std::string> Stack;
  bool SawRoot = false;
  while (true) {
    size_t Open = S.find('<');
    if (Open == StringRef::npos)
      break;
    size_t Close = S.find('>', Open);
    if (Close == StringRef::npos)
      return false;
    StringRef Tag = S.slice(Open + 1, Close);
    S = S.drop_front(Close + 1);
    if (Tag.startswith("?") || Tag.startswith("!"))
      continue;
    if (Tag.startswith("/")) {
      if (Stack.empty() || Stack.back() != Tag.drop_front(1).trim())
        return false;
      Stack.pop_back();
      continue;
    }
    std::string Name =
        Tag.take_until([](char C) { return C == ' ' || C == '/' || C == '\n'; })
            .str();
    if (Stack.empty()) {
      if (SawRoot || Name != "svg")
        return false;
      SawRoot = true;
    }
    if (!Tag.endswith("/"))
      Stack.push_back(Name);
  }
  return SawRoot && Stack.empty();
}

TEST(LossLog, SvgIsWellFormed) {
  std::vector<LossRow> Rows;
  for (int S = 1; S <= 30; ++S)
    Rows.push_back({S, 5.5 - std::log(double(S)), 1e-3});
  std::string Svg = lossSvg(Rows, "gpt <tiny> & co");
  EXPECT_TRUE(tagsBalance(Svg)) << Svg;
  EXPECT_NE(Svg.find("<svg"), std::string::npos);
  EXPECT_NE(Svg.find("</svg>"), std::string::npos);
  EXPECT_NE(Svg.find("gpt &lt;tiny&gt; &amp; co"), std::string::npos);
  EXPECT_NE(Svg.find("<polyline"), std::string::npos);
  EXPECT_NE(Svg.find(">step</text>"), std::string::npos);
  EXPECT_NE(Svg.find(">loss</text>"), std::string::npos);
  // Tick labels on both axes.
  EXPECT_NE(Svg.find(">10</text>"), std::string::npos);
  EXPECT_NE(Svg.find(">4</text>"), std::string::npos);
  // One point, no point, and a non-finite loss.
  EXPECT_TRUE(tagsBalance(lossSvg({{1, 2.0, 0}}, "one")));
  EXPECT_TRUE(tagsBalance(lossSvg({}, "none")));
  EXPECT_TRUE(
      tagsBalance(lossSvg({{1, 2.0, 0}, {2, NAN, 0}, {3, 1.0, 0}}, "nan")));
}

TEST(LossLog, SvgDrawsTheMovingAverageAndTheValidationLoss) {
  auto Count = [](StringRef S, StringRef What) {
    return S.count(What);
  };
  // 10 steps: the loss alone, no legend.
  std::vector<LossRow> Rows;
  for (int64_t S = 1; S <= 10; ++S)
    Rows.push_back({S, 5.0 - 0.1 * double(S), 1e-3});
  std::string Short = lossSvg(Rows, "t");
  EXPECT_EQ(Count(Short, "<polyline"), 1u);
  EXPECT_EQ(Count(Short, "validation loss"), 0u);
  // 40 steps with two validations: the loss, its mean over 5 steps, and
  // the validation line with a dot per validation, and a legend of three.
  for (int64_t S = 11; S <= 40; ++S)
    Rows.push_back({S, 4.0 + (S % 2 ? 0.5 : -0.5), 1e-3});
  Rows[19].ValLoss = 4.5;
  Rows[39].ValLoss = 4.25;
  std::string Svg = lossSvg(Rows, "t");
  EXPECT_TRUE(tagsBalance(Svg)) << Svg;
  EXPECT_EQ(Count(Svg, "<polyline"), 3u);
  EXPECT_EQ(Count(Svg, "fill=\"#ff7f0e\""), 2u); // the validation dots
  EXPECT_EQ(Count(Svg, ">training loss</text>"), 1u);
  EXPECT_EQ(Count(Svg, ">training, mean of 5 steps</text>"), 1u);
  EXPECT_EQ(Count(Svg, ">validation loss</text>"), 1u);
}

//===----------------------------------------------------------------------===//
// ONNX export
//===----------------------------------------------------------------------===//

const char *TinyModel = SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx";

/// The parameter's data as the importer reads it back.
std::vector<float> importedParam(StringRef Model, StringRef Name) {
  auto G = cantFail(importOnnx(Model, ImportOptions()));
  for (const auto &P : G->params())
    if (P->name() == Name) {
      auto Bytes = cantFail(P->data()->load());
      const float *F = reinterpret_cast<const float *>(Bytes.data());
      return std::vector<float>(F, F + Bytes.size() / 4);
    }
  ADD_FAILURE() << "no parameter " << Name.str();
  return {};
}

TEST(OnnxExport, ReplacesInitializersInlineOrExternal) {
  TempDir D;
  std::vector<float> Wpe(64 * 64), Bias(64);
  for (size_t I = 0; I < Wpe.size(); ++I)
    Wpe[I] = float(I) * 1e-3f;
  for (size_t I = 0; I < Bias.size(); ++I)
    Bias[I] = -float(I);
  StringMap<ArrayRef<float>> W;
  W["transformer.wpe.weight"] = Wpe;
  W["transformer.ln_f.bias"] = Bias;
  std::string Out = D.file("inline.onnx");
  ASSERT_FALSE(errorText(exportOnnxWeights(TinyModel, Out, W)).size());
  EXPECT_FALSE(sys::fs::exists(Out + ".data"));
  EXPECT_EQ(importedParam(Out, "transformer.wpe.weight"), Wpe);
  EXPECT_EQ(importedParam(Out, "transformer.ln_f.bias"), Bias);
  EXPECT_EQ(importedParam(Out, "transformer.wte.weight"),
            importedParam(TinyModel, "transformer.wte.weight"));

  // Past the size limit, large tensors move to OUT.data.
  OnnxExportOptions Small;
  Small.MaxInlineBytes = 1000;
  std::string Ext = D.file("external.onnx");
  ASSERT_FALSE(errorText(exportOnnxWeights(TinyModel, Ext, W, Small)).size());
  EXPECT_TRUE(sys::fs::exists(Ext + ".data"));
  uint64_t Size = 0;
  sys::fs::file_size(Ext, Size);
  EXPECT_LT(Size, 100000u);
  EXPECT_EQ(importedParam(Ext, "transformer.wpe.weight"), Wpe);
  EXPECT_EQ(importedParam(Ext, "transformer.h.1.mlp.c_fc.weight"),
            importedParam(TinyModel, "transformer.h.1.mlp.c_fc.weight"));
  // ... and a copy of an external-data model is self-contained again.
  std::string Again = D.file("again.onnx");
  ASSERT_FALSE(errorText(exportOnnxWeights(Ext, Again, {})).size());
  EXPECT_FALSE(sys::fs::exists(Again + ".data"));
  EXPECT_EQ(importedParam(Again, "transformer.wpe.weight"), Wpe);
}

TEST(OnnxExport, RefusesUnknownNamesAndWrongSizes) {
  TempDir D;
  std::vector<float> Five(5);
  StringMap<ArrayRef<float>> Unknown;
  Unknown["no.such.weight"] = Five;
  std::string Out = D.file("out.onnx");
  EXPECT_NE(errorText(exportOnnxWeights(TinyModel, Out, Unknown))
                .find("has no initializer 'no.such.weight'"),
            std::string::npos);
  StringMap<ArrayRef<float>> Wrong;
  Wrong["transformer.ln_f.bias"] = Five;
  EXPECT_NE(errorText(exportOnnxWeights(TinyModel, Out, Wrong))
                .find("initializer 'transformer.ln_f.bias' has 64 elements, "
                      "the new weights have 5"),
            std::string::npos);
  EXPECT_FALSE(sys::fs::exists(Out));
}

} // namespace

TEST(Sample, GreedyTopKTemperatureAndAllowedIds) {
  std::vector<float> L = {1.0f, 3.0f, 2.0f, 3.0f, 9.0f};
  // Greedy: the first most likely among the allowed ids (id 4 is not).
  EXPECT_EQ(sampleToken(L, 5, 0, 0, 0.5), 4);
  EXPECT_EQ(sampleToken(L, 4, 0, 0, 0.99), 1);
  // Top-2 of ids 0..3 (logits 3, 3): each half the mass, whatever U.
  EXPECT_EQ(sampleToken(L, 4, 1.0, 2, 0.0), 1);
  EXPECT_EQ(sampleToken(L, 4, 1.0, 2, 0.49), 1);
  EXPECT_EQ(sampleToken(L, 4, 1.0, 2, 0.51), 3);
  EXPECT_EQ(sampleToken(L, 4, 1.0, 2, 0.999999), 3);
  // All four: the cumulative softmax picks the id U falls in.
  double E1 = std::exp(1.0), E2 = std::exp(2.0), E3 = std::exp(3.0);
  double Sum = E1 + E3 + E2 + E3;
  EXPECT_EQ(sampleToken(L, 4, 1.0, 0, 0.999 * E1 / Sum), 0);
  EXPECT_EQ(sampleToken(L, 4, 1.0, 0, 1.001 * E1 / Sum), 1);
  EXPECT_EQ(sampleToken(L, 4, 1.0, 0, (E1 + E3 + 0.5 * E2) / Sum), 2);
  // A low temperature sharpens toward the largest: at T = 0.01 the mass of
  // ids 1 and 3 is all but all of it.
  EXPECT_EQ(sampleToken({0.0f, 1.0f}, 2, 0.01, 0, 0.5), 1);
}
