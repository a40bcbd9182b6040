//===- BpeTokenizer.cpp - Byte-level BPE ----------------------------------===//
#include "text/BpeTokenizer.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Threading.h"
#include <atomic>
#include <thread>

using namespace llvm;

namespace sp {

/// A token's bytes for a message: printable ASCII as is, the rest \xHH.
static std::string showBytes(StringRef Bytes) {
  std::string S;
  for (unsigned char C : Bytes) {
    if (C >= 0x20 && C < 0x7F)
      S.push_back(char(C));
    else
      S += formatv("\\x{0:x-2}", unsigned(C)).str();
  }
  return S;
}

Expected<std::unique_ptr<BpeTokenizer>> BpeTokenizer::create(BpeSpec Spec) {
  std::unique_ptr<BpeTokenizer> T(new BpeTokenizer());
  T->Name = Spec.Name;
  T->IgnoreMerges = Spec.IgnoreMerges;
  auto Pre = PreTokenizer::compile(Spec.Pattern);
  if (!Pre)
    return Pre.takeError();
  T->Pre = std::move(*Pre);

  StringMap<uint32_t> Ids;
  auto Place = [&](StringRef Bytes, uint32_t Id, bool Added) -> Error {
    if (Id >= (1u << 31))
      return makeError(formatv("{0}: token '{1}' has id {2}; ids must be "
                               "below 2^31",
                               Spec.Name, showBytes(Bytes), Id));
    if (Id >= T->Pieces.size()) {
      T->Pieces.resize(Id + 1);
      T->IsToken.resize(Id + 1);
    }
    if (T->IsToken[Id] && T->Pieces[Id] != Bytes)
      return makeError(formatv("{0}: id {1} is both '{2}' and '{3}'", Spec.Name,
                               Id, showBytes(T->Pieces[Id]), showBytes(Bytes)));
    T->Pieces[Id] = Bytes.str();
    T->IsToken[Id] = true;
    if (!Added)
      Ids.try_emplace(Bytes, Id);
    return Error::success();
  };
  for (auto &[Bytes, Id] : Spec.Vocab)
    if (auto E = Place(Bytes, Id, false))
      return E;
  for (auto &[Bytes, Id] : Spec.Added)
    if (auto E = Place(Bytes, Id, true))
      return E;
  for (unsigned B = 0; B < 256; ++B) {
    auto It = Ids.find(StringRef(reinterpret_cast<const char *>(&B), 1));
    if (It == Ids.end())
      return makeError(formatv("{0}: the vocabulary has no token for the "
                               "byte 0x{1:x-2}; this is not a byte-level BPE "
                               "vocabulary (GPT-2, GPT-NeoX, Llama 3)",
                               Spec.Name, B));
    T->ByteIds[B] = It->second;
  }
  uint32_t Rank = 0;
  for (auto &[Left, Right] : Spec.Merges) {
    auto L = Ids.find(Left), R = Ids.find(Right), M = Ids.find(Left + Right);
    if (L == Ids.end() || R == Ids.end() || M == Ids.end())
      return makeError(formatv("{0}: merge {1} ('{2}' '{3}') joins tokens "
                               "that are not all in the vocabulary",
                               Spec.Name, Rank, showBytes(Left),
                               showBytes(Right)));
    uint64_t Key = uint64_t(L->second) << 32 | R->second;
    // A repeated merge keeps its first (lowest) rank.
    T->Merges.try_emplace(Key, uint64_t(Rank) << 32 | M->second);
    ++Rank;
  }
  if (T->IgnoreMerges)
    T->Vocab = std::move(Ids);
  return T;
}

void BpeTokenizer::mergeWord(StringRef Word,
                             SmallVectorImpl<uint32_t> &Tokens) const {
  Tokens.clear();
  for (unsigned char C : Word)
    Tokens.push_back(ByteIds[C]);
  // Ranks[i]: the merge of Tokens[i] and Tokens[i + 1] (rank << 32 | id),
  // or ~0 when they do not merge.
  SmallVector<uint64_t, 32> Ranks;
  auto PairRank = [&](size_t I) -> uint64_t {
    auto It = Merges.find(uint64_t(Tokens[I]) << 32 | Tokens[I + 1]);
    return It == Merges.end() ? ~uint64_t(0) : It->second;
  };
  for (size_t I = 0; I + 1 < Tokens.size(); ++I)
    Ranks.push_back(PairRank(I));
  while (Tokens.size() > 1) {
    size_t Best = 0;
    for (size_t I = 1; I < Ranks.size(); ++I)
      if ((Ranks[I] >> 32) < (Ranks[Best] >> 32))
        Best = I;
    if (Ranks[Best] == ~uint64_t(0))
      break;
    Tokens[Best] = uint32_t(Ranks[Best]);
    Tokens.erase(Tokens.begin() + Best + 1);
    Ranks.erase(Ranks.begin() + Best);
    if (Best < Ranks.size())
      Ranks[Best] = PairRank(Best);
    if (Best > 0)
      Ranks[Best - 1] = PairRank(Best - 1);
  }
}

void BpeTokenizer::encodeWord(StringRef Word, WordCache &Cache,
                              std::vector<uint32_t> &Out) const {
  if (Word.size() == 1) {
    Out.push_back(ByteIds[uint8_t(Word[0])]);
    return;
  }
  auto [It, New] = Cache.Words.try_emplace(Word, 0, 0);
  if (New) {
    SmallVector<uint32_t, 32> Tokens;
    auto Whole = IgnoreMerges ? Vocab.find(Word) : Vocab.end();
    if (Whole != Vocab.end())
      Tokens.push_back(Whole->second);
    else
      mergeWord(Word, Tokens);
    It->second = {uint32_t(Cache.Ids.size()), uint32_t(Tokens.size())};
    Cache.Ids.insert(Cache.Ids.end(), Tokens.begin(), Tokens.end());
  }
  const uint32_t *Ids = Cache.Ids.data() + It->second.first;
  Out.insert(Out.end(), Ids, Ids + It->second.second);
}

Error BpeTokenizer::encodeChunk(StringRef Chunk, size_t Base, WordCache &Cache,
                                std::vector<uint32_t> &Out) const {
  size_t Bad = firstInvalidUtf8(Chunk);
  if (Bad != Chunk.size())
    return makeError(formatv("the text is not UTF-8 at byte {0} (0x{1:x-2}); "
                             "byte-level BPE tokenizers read UTF-8 text",
                             Base + Bad, unsigned(uint8_t(Chunk[Bad]))));
  Out.reserve(Chunk.size() / 3);
  // A bounded cache: past a few million distinct words, start afresh.
  if (Cache.Ids.size() > (size_t(1) << 24)) {
    Cache.Words.clear();
    Cache.Ids.clear();
  }
  if (auto E = Pre->split(
          Chunk, [&](StringRef Word) { encodeWord(Word, Cache, Out); }))
    return makeError(formatv("{0} (in the chunk at byte {1})",
                             toString(std::move(E)), Base));
  return Error::success();
}

/// Where the text may be cut: Text[Cut - 1] is a line break between two
/// printable ASCII characters (the header's rule).
static bool isSafeCut(StringRef Text, size_t Cut) {
  auto Printable = [](char C) { return C > ' ' && C < 0x7F; };
  return Cut >= 2 && Cut < Text.size() && Text[Cut - 1] == '\n' &&
         Printable(Text[Cut - 2]) && Printable(Text[Cut]);
}

Expected<std::vector<uint32_t>> BpeTokenizer::encode(StringRef Text,
                                                     unsigned Threads) const {
  if (Threads == 0)
    Threads = std::max(1u, llvm::hardware_concurrency().compute_thread_count());
  // Chunks of about 1 MiB (fewer, larger ones for a short text), cut at the
  // first safe place after each nominal cut.
  const size_t Target = std::max<size_t>(
      64 << 10, std::min<size_t>(1 << 20, Text.size() / (4 * Threads) + 1));
  std::vector<size_t> Cuts{0};
  for (size_t At = Target; At < Text.size(); At += Target) {
    if (At <= Cuts.back())
      continue;
    size_t Cut = At;
    while (Cut < Text.size() && !isSafeCut(Text, Cut)) {
      size_t NL = Text.find('\n', Cut);
      if (NL == StringRef::npos) {
        Cut = Text.size();
        break;
      }
      Cut = NL + 1;
    }
    if (Cut >= Text.size())
      break;
    Cuts.push_back(Cut);
    At = Cut;
  }
  Cuts.push_back(Text.size());
  size_t N = Cuts.size() - 1;
  std::vector<std::vector<uint32_t>> Parts(N);
  std::vector<std::string> Errors(N);
  std::atomic<size_t> Next{0};
  auto Work = [&] {
    WordCache Cache;
    for (size_t I; (I = Next.fetch_add(1)) < N;) {
      StringRef Chunk = Text.slice(Cuts[I], Cuts[I + 1]);
      if (auto E = encodeChunk(Chunk, Cuts[I], Cache, Parts[I]))
        Errors[I] = toString(std::move(E));
    }
  };
  unsigned Workers = unsigned(std::min<size_t>(Threads, N));
  std::vector<std::thread> Pool;
  for (unsigned W = 1; W < Workers; ++W)
    Pool.emplace_back(Work);
  Work();
  for (auto &Th : Pool)
    Th.join();
  size_t Total = 0;
  for (size_t I = 0; I < N; ++I) {
    if (!Errors[I].empty())
      return makeError(Errors[I]);
    Total += Parts[I].size();
  }
  std::vector<uint32_t> Ids;
  Ids.reserve(Total);
  for (auto &P : Parts)
    Ids.insert(Ids.end(), P.begin(), P.end());
  return Ids;
}

Expected<std::string> BpeTokenizer::decode(ArrayRef<uint32_t> Ids) const {
  std::string Text;
  for (uint32_t Id : Ids) {
    if (Id >= Pieces.size() || !IsToken[Id])
      return makeError(formatv("{0}: {1} is not a token id (the vocabulary "
                               "has {2} ids)",
                               Name, Id, Pieces.size()));
    Text += Pieces[Id];
  }
  return Text;
}

} // namespace sp
