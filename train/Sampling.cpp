//===- Sampling.cpp - sp-run --sample: text drawn from the model ----------===//
//
// RankRun::generate (RankRun.h): the prompt's continuation, one token at a
// time from the last position's logits (runtime/Sample.h), printed by the
// lead; with --dump, the drawn positions' logits. Tokens are bytes, or those
// of --tokenizer (the prompt encoded and the text decoded by it).
//
//===----------------------------------------------------------------------===//
#include "runtime/Npy.h"
#include "runtime/Sample.h"
#include "support/Diagnostics.h"
#include "train/RankRun.h"
#include "llvm/Support/FormatVariadic.h"
#include <chrono>
#include <limits>
#include <random>

using namespace llvm;

namespace sp {

Error RankRun::generate() {
  Executor &E = *Exec;
  const std::string &Prompt = O.SamplePrompt;
  uint64_t Seed = T.R.Seed;
  // Every rank runs the same forwards: each step's batch holds the last
  // seq() tokens of the text in every row, the rest of the row padding
  // that a causal model's earlier positions never see. The last stage's
  // first tensor-parallel rank of the first replica draws the next token
  // from the logits of the text's last position, and the ranks agree on it
  // with a sum (the others add 0).
  const BpeTokenizer *Tok = T.R.Tokenizer.get();
  int64_t B = E.batch(), Seq = E.seq(),
          Allowed = std::min<int64_t>(E.vocab(),
                                      Tok ? int64_t(Tok->vocabSize()) : 256);
  bool LastStage = E.stage() == E.numStages() - 1;
  bool Picks =
      LastStage && (E.groupSize() == 1 || E.rank() == 0) && Groups.At.Data == 0;
  // Under context parallelism the context rank holding the text's last
  // position draws (its logits are its positions').
  const ContextLayout &Cp = E.context();
  std::vector<int64_t> Text = T.R.PromptIds;
  const size_t PromptLength = Text.size();
  std::mt19937_64 Rng(Seed);
  std::vector<float> Drawn; // the logits of each drawn position (--dump)
  auto Start = std::chrono::steady_clock::now();
  for (int64_t K = 0; K < O.SampleTokens; ++K) {
    int64_t First = std::max<int64_t>(0, int64_t(Text.size()) - Seq);
    int64_t Len = int64_t(Text.size()) - First;
    Batch.Tokens.assign(B * Seq, 0);
    Batch.Targets.assign(B * Seq, IgnoreTarget);
    Batch.Real.clear();
    for (int64_t Row = 0; Row < B; ++Row)
      std::copy(Text.begin() + First, Text.end(),
                Batch.Tokens.begin() + Row * Seq);
    if (auto L = E.evalLoss(Batch); !L)
      return L.takeError();
    double Token = 0;
    // Every rank steps the generator, so that whichever context rank draws
    // a token uses the step's number, as one device would.
    const double U = double(Rng() >> 11) * 0x1.0p-53;
    int64_t Last = Len - 1; // the row of the logits to draw from
    bool Draws = Picks;
    if (Cp.Parts > 1) {
      Draws = false;
      for (const ContextLayout::Run &R : Cp.runs(E.contextRank()))
        if (Len - 1 >= R.Global && Len - 1 < R.Global + R.Length) {
          Draws = Picks;
          Last = R.Local + (Len - 1 - R.Global);
        }
    }
    if (LastStage) {
      if (auto Err = E.download())
        return Err;
      auto Logits = E.logits();
      if (!Logits)
        return usageError("the plan exposes no logits to sample from");
      auto Whole = E.gather(*Logits); // every tensor-parallel part
      if (!Whole)
        return Whole.takeError();
      int64_t V = int64_t(Whole->size()) / (B * Cp.local());
      if (Draws) {
        ArrayRef<float> Row(Whole->data() + Last * V, size_t(V));
        // An id of no token (a gap in --tokenizer's ids) is never drawn.
        std::vector<float> Masked;
        if (Tok) {
          Masked.assign(Row.begin(), Row.end());
          for (int64_t Id = 0; Id < V; ++Id)
            if (!Tok->isToken(uint32_t(Id)))
              Masked[Id] = -std::numeric_limits<float>::infinity();
        }
        Token = double(sampleToken(Tok ? ArrayRef<float>(Masked) : Row, Allowed,
                                   O.Temperature, O.TopK, U));
        Drawn.insert(Drawn.end(), Row.begin(), Row.end());
      }
    }
    if (World)
      if (auto Err = World->allReduceSum(&Token, 1))
        return Err;
    Text.push_back(int64_t(Token));
  }
  double Seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - Start)
          .count();
  // (--dump with a cp plan is refused: the drawn rows are on several ranks.)
  if (Picks && !O.DumpDir.empty()) {
    int64_t V = O.SampleTokens ? int64_t(Drawn.size()) / O.SampleTokens : 0;
    if (auto Err = makeDir(O.DumpDir, "--dump"))
      return Err;
    if (auto Err = writeNpy(O.DumpDir + "/sample_logits.npy",
                            {O.SampleTokens, V}, Drawn))
      return Err;
  }
  if (!Lead)
    return Error::success();
  std::string Generated;
  if (Tok) {
    std::vector<uint32_t> Ids(Text.begin() + PromptLength, Text.end());
    auto Decoded = Tok->decode(Ids);
    if (!Decoded)
      return Decoded.takeError();
    Generated = std::move(*Decoded);
  } else {
    for (size_t I = PromptLength; I < Text.size(); ++I)
      Generated += char(Text[I]);
  }
  std::string WeightsFrom =
      T.R.Resumed
          ? formatv("the weights of checkpoint '{0}' (step {1})",
                    O.checkpointDir(), T.R.Resumed->Step)
                .str()
          : std::string("the model's own weights (no --checkpoint)");
  std::string PromptSize =
      Tok ? formatv("{0}-token ({1})", PromptLength, Tok->name()).str()
          : formatv("{0}-byte", Prompt.size()).str();
  Out << formatv("sp-run: sampling {0}: {1} tokens after a {2} prompt, "
                 "{3}, seed {4}, {5} ({6:F2} s)\n",
                 ModelName, O.SampleTokens, PromptSize,
                 O.Temperature <= 0
                     ? std::string("greedy")
                     : formatv("temperature {0}, top-k {1}", O.Temperature,
                               O.TopK ? std::to_string(O.TopK) : "all")
                           .str(),
                 Seed, WeightsFrom, Seconds);
  Out << Prompt << Generated << "\n";
  Out.flush();
  return Error::success();
}

} // namespace sp
