//===- sp-fuzz-token-loader.cpp - Fuzz the token-file loader --------------===//
//
// An input is a token file (sp-run --data: little-endian uint16 or uint32
// ids) and, taken from its end by FuzzedDataProvider, the settings sp-run
// gives the loader: the batch, the sequence and the vocabulary (from the
// plan), --objective, --pad-token, --mask-token, --mask-rate, --shuffle,
// --seed, the data-parallel rank and size, three steps, and what a sidecar
// says (none, or a width, a vocabulary and a count). A file that opens
// (runtime/DataLoader.cpp) gives those steps' batches; every token must
// then be an id of the vocabulary (or the mask token), every target one or
// the ignored -100, and the mask 0 or 1. The whole input is also read as a
// float32 .npy file (runtime/Npy.cpp, the reader of sp-run's dumps), and as
// a token file's sidecar (text/TokenFile.cpp).
//
//===----------------------------------------------------------------------===//
#include "FuzzSupport.h"
#include "runtime/DataLoader.h"
#include "runtime/Npy.h"
#include "text/TokenFile.h"
#include "llvm/Support/MemoryBuffer.h"
#include <cstdint>
#include <fuzzer/FuzzedDataProvider.h>

using namespace llvm;
using namespace sp;
using namespace sp::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  if (auto A = parseNpy(StringRef(reinterpret_cast<const char *>(Data), Size),
                        "fuzz.npy")) {
    int64_t N = 1;
    for (int64_t D : A->Shape)
      N *= D;
    if (N != int64_t(A->Data.size()))
      invariantFailed("an .npy array's data does not match its shape");
  } else {
    checkMessage(A.takeError());
  }

  if (auto Info = parseTokenSidecar(
          StringRef(reinterpret_cast<const char *>(Data), Size), "fuzz.json")) {
    if ((Info->Width != 2 && Info->Width != 4) ||
        (Info->Width == 2 && Info->Vocab > 65536) || Info->Vocab < 1)
      invariantFailed("a sidecar read with an impossible width or vocabulary");
  } else {
    checkMessage(Info.takeError());
  }

  FuzzedDataProvider In(Data, Size);
  // Out-of-range settings now and then: the loader must refuse them.
  int64_t Batch = In.ConsumeIntegralInRange<int64_t>(-1, 8);
  int64_t Seq = In.ConsumeIntegralInRange<int64_t>(-1, 64);
  int64_t Vocab = In.ConsumeIntegralInRange<int64_t>(0, 70000);
  Objective Obj;
  Obj.Kind = In.ConsumeBool() ? Objective::MaskedLM : Objective::NextToken;
  Obj.PadToken = In.ConsumeIntegralInRange<int64_t>(-2, Vocab);
  Obj.MaskToken = In.ConsumeIntegralInRange<int64_t>(-1, Vocab);
  Obj.MaskRate = In.ConsumeFloatingPointInRange<double>(-0.1, 1.1);
  Obj.Seed = In.ConsumeIntegral<uint64_t>();
  bool Shuffle = In.ConsumeBool();
  int DpSize = In.ConsumeIntegralInRange<int>(1, 4);
  int DpRank = In.ConsumeIntegralInRange<int>(0, DpSize - 1);
  int64_t Steps[3];
  for (int64_t &S : Steps)
    S = In.ConsumeIntegralInRange<int64_t>(1, INT64_MAX);
  TokenFileInfo Info;
  if (In.ConsumeBool()) {
    Info.HasSidecar = true;
    Info.Width = In.ConsumeBool() ? 4 : 2;
    Info.Vocab = In.ConsumeIntegralInRange<int64_t>(1, 200000);
    Info.Tokens = In.ConsumeIntegralInRange<int64_t>(-1, 4096);
  }
  std::string File = In.ConsumeRemainingBytesAsString();

  auto D =
      DataLoader::create(MemoryBuffer::getMemBuffer(File, "fuzz.bin",
                                                    /*RequiresNull=*/false),
                         Batch, Seq, Vocab, Info);
  if (!D) {
    checkMessage(D.takeError());
    return 0;
  }
  if (Error E = checkObjective(Obj, Vocab)) {
    checkMessage(std::move(E));
    return 0;
  }
  (*D)->setObjective(Obj);
  (*D)->setShuffle(Shuffle, Obj.Seed);
  (*D)->setDataParallel(DpRank, DpSize);
  TokenBatch B;
  for (int64_t Step : Steps) {
    (*D)->getBatch(Step, B);
    size_t N = size_t(Batch * Seq);
    if (B.Tokens.size() != N || B.Targets.size() != N ||
        (Obj.PadToken >= 0 ? B.Real.size() != N : !B.Real.empty()))
      invariantFailed("a batch has the wrong size");
    for (size_t I = 0; I < N; ++I) {
      int64_t T = B.Tokens[I], Target = B.Targets[I];
      if ((T < 0 || T >= Vocab) &&
          !(Obj.Kind == Objective::MaskedLM && T == Obj.MaskToken))
        invariantFailed("a token is not an id of the vocabulary");
      if ((Target < 0 || Target >= Vocab) && Target != IgnoreTarget)
        invariantFailed("a target is not an id of the vocabulary");
      if (!B.Real.empty() && B.Real[I] > 1)
        invariantFailed("a mask value is neither 0 nor 1");
    }
  }
  return 0;
}
