//===- TokenizerFiles.cpp - Reading byte-level BPE tokenizers -------------===//
#include "text/TokenizerFiles.h"
#include "support/Diagnostics.h"
#include "text/ByteLevel.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include <nlohmann/json.hpp>

using namespace llvm;
using json = nlohmann::json;

namespace sp {

static Expected<std::unique_ptr<MemoryBuffer>>
readTokenizerText(StringRef Path) {
  auto Buf = MemoryBuffer::getFile(Path, /*IsText=*/false,
                                   /*RequiresNullTerminator=*/false);
  if (!Buf)
    return makeError(formatv("cannot read tokenizer file '{0}': {1}", Path,
                             Buf.getError().message()));
  return std::move(*Buf);
}

static Expected<json> readTokenizerJsonFile(StringRef Path) {
  auto Buf = readTokenizerText(Path);
  if (!Buf)
    return Buf.takeError();
  json J = json::parse((*Buf)->getBuffer().begin(), (*Buf)->getBuffer().end(),
                       nullptr,
                       /*allow_exceptions=*/false);
  if (J.is_discarded() || !J.is_object())
    return makeError(formatv("'{0}' is not a JSON object; give a "
                             "tokenizer.json or GPT-2's encoder.json",
                             Path));
  return J;
}

/// Token -> id entries of a JSON object, their spellings turned to bytes.
static Expected<std::vector<std::pair<std::string, uint32_t>>>
readVocabObject(const json &V, StringRef Where) {
  std::vector<std::pair<std::string, uint32_t>> Vocab;
  Vocab.reserve(V.size());
  for (auto It = V.begin(); It != V.end(); ++It) {
    if (!It.value().is_number_unsigned())
      return makeError(formatv("{0}: the id of '{1}' is not a non-negative "
                               "integer",
                               Where, It.key()));
    auto Bytes = byteLevelToBytes(It.key());
    if (!Bytes)
      return makeError(formatv("{0}: token '{1}' is not spelt in byte-level "
                               "characters; this is not a byte-level BPE "
                               "vocabulary",
                               Where, It.key()));
    Vocab.emplace_back(std::move(*Bytes), It.value().get<uint32_t>());
  }
  return Vocab;
}

/// One merge, "a b" or ["a", "b"], as bytes.
static Expected<std::pair<std::string, std::string>>
readMerge(StringRef A, StringRef B, size_t Rank, StringRef Where) {
  auto L = byteLevelToBytes(A), R = byteLevelToBytes(B);
  if (!L || !R || L->empty() || R->empty())
    return makeError(formatv("{0}: merge {1} ('{2} {3}') is not two tokens "
                             "spelt in byte-level characters",
                             Where, Rank, A, B));
  return std::make_pair(std::move(*L), std::move(*R));
}

static Expected<std::pair<std::string, std::string>>
readMergeLine(StringRef Line, size_t Rank, StringRef Where) {
  auto [A, B] = Line.split(' ');
  if (B.empty() || B.contains(' '))
    return makeError(formatv("{0}: merge {1} ('{2}') is not two tokens "
                             "separated by one space",
                             Where, Rank, Line));
  return readMerge(A, B, Rank, Where);
}

/// The pattern of a pre_tokenizer, or an error naming what sp lacks.
static Expected<std::string> readPattern(const json &P, StringRef Where) {
  auto Type = P.is_object() ? P.value("type", "") : std::string();
  auto NoPrefixSpace = [&](const json &B) -> Error {
    if (B.value("add_prefix_space", false))
      return makeError(formatv("{0}: pre_tokenizer ByteLevel has "
                               "add_prefix_space true, which sp does not "
                               "implement",
                               Where));
    return Error::success();
  };
  if (Type == "ByteLevel") {
    if (auto E = NoPrefixSpace(P))
      return E;
    if (!P.value("use_regex", true))
      return makeError(formatv("{0}: pre_tokenizer ByteLevel without a "
                               "regex splits nothing; sp needs a pattern",
                               Where));
    return std::string(Gpt2Pattern);
  }
  if (Type == "Sequence" && P.contains("pretokenizers") &&
      P["pretokenizers"].is_array() && P["pretokenizers"].size() == 2) {
    const json &S = P["pretokenizers"][0], &B = P["pretokenizers"][1];
    if (S.is_object() && S.value("type", "") == "Split" && B.is_object() &&
        B.value("type", "") == "ByteLevel" && !B.value("use_regex", true) &&
        S.contains("pattern") && S["pattern"].is_object() &&
        S["pattern"].contains("Regex") && S["pattern"]["Regex"].is_string() &&
        S.value("behavior", "") == "Isolated" && !S.value("invert", false)) {
      if (auto E = NoPrefixSpace(B))
        return E;
      return S["pattern"]["Regex"].get<std::string>();
    }
  }
  return makeError(formatv("{0}: pre_tokenizer {1} is not one sp implements; "
                           "it reads ByteLevel (GPT-2) and a Sequence of a "
                           "Split by a Regex (Isolated) and a ByteLevel with "
                           "use_regex false (Llama 3)",
                           Where, P.dump()));
}

Expected<BpeSpec> readTokenizerJson(StringRef Path) {
  auto J = readTokenizerJsonFile(Path);
  if (!J)
    return J.takeError();
  const json &Model = (*J)["model"];
  if (!Model.is_object() || Model.value("type", "") != "BPE")
    return makeError(formatv("'{0}': model.type is not \"BPE\"; sp reads "
                             "byte-level BPE tokenizers (GPT-2, GPT-NeoX, "
                             "Llama 3)",
                             Path));
  std::string Where = formatv("'{0}'", Path).str();
  if (J->contains("normalizer") && !(*J)["normalizer"].is_null())
    return makeError(formatv("{0}: normalizer {1} is not implemented by sp; "
                             "only tokenizers without one are read",
                             Where, (*J)["normalizer"].dump()));
  auto Unset = [&](const char *Key) {
    if (!Model.contains(Key) || Model[Key].is_null())
      return true;
    const json &V = Model[Key];
    return (V.is_boolean() && !V.get<bool>()) ||
           (V.is_string() && V.get<std::string>().empty());
  };
  for (const char *Key : {"dropout", "continuing_subword_prefix",
                          "end_of_word_suffix", "byte_fallback"})
    if (!Unset(Key))
      return makeError(formatv("{0}: model.{1} is {2}, which sp does not "
                               "implement",
                               Where, Key, Model[Key].dump()));
  BpeSpec Spec;
  Spec.Name = sys::path::filename(Path).str();
  if (!Model.contains("vocab") || !Model["vocab"].is_object())
    return makeError(formatv("{0}: model.vocab is not an object", Where));
  auto Vocab = readVocabObject(Model["vocab"], Where + " model.vocab");
  if (!Vocab)
    return Vocab.takeError();
  Spec.Vocab = std::move(*Vocab);
  if (!Model.contains("merges") || !Model["merges"].is_array())
    return makeError(formatv("{0}: model.merges is not a list", Where));
  const json &Merges = Model["merges"];
  Spec.Merges.reserve(Merges.size());
  for (size_t I = 0; I < Merges.size(); ++I) {
    const json &M = Merges[I];
    Expected<std::pair<std::string, std::string>> Merge =
        M.is_string()
            ? readMergeLine(M.get_ref<const std::string &>(), I, Where)
        : M.is_array() && M.size() == 2 && M[0].is_string() && M[1].is_string()
            ? readMerge(M[0].get_ref<const std::string &>(),
                        M[1].get_ref<const std::string &>(), I, Where)
            : makeError(formatv("{0}: merge {1} is neither \"a b\" nor "
                                "[\"a\", \"b\"]",
                                Where, I));
    if (!Merge)
      return Merge.takeError();
    Spec.Merges.push_back(std::move(*Merge));
  }
  Spec.IgnoreMerges = Model.value("ignore_merges", false);
  if (J->contains("added_tokens") && (*J)["added_tokens"].is_array())
    for (const json &A : (*J)["added_tokens"]) {
      if (!A.is_object() || !A.contains("id") ||
          !A["id"].is_number_unsigned() || !A.contains("content") ||
          !A["content"].is_string())
        return makeError(formatv("{0}: added_tokens entry {1} lacks an id or "
                                 "a content",
                                 Where, A.dump()));
      Spec.Added.emplace_back(A["content"].get<std::string>(),
                              A["id"].get<uint32_t>());
    }
  if (!J->contains("pre_tokenizer"))
    return makeError(formatv("{0}: there is no pre_tokenizer", Where));
  auto Pattern = readPattern((*J)["pre_tokenizer"], Where);
  if (!Pattern)
    return Pattern.takeError();
  Spec.Pattern = std::move(*Pattern);
  return Spec;
}

Expected<BpeSpec> readGpt2Files(StringRef EncoderJson, StringRef VocabBpe) {
  auto J = readTokenizerJsonFile(EncoderJson);
  if (!J)
    return J.takeError();
  BpeSpec Spec;
  Spec.Name = sys::path::filename(EncoderJson).str() + "+" +
              sys::path::filename(VocabBpe).str();
  auto Vocab = readVocabObject(*J, formatv("'{0}'", EncoderJson).str());
  if (!Vocab)
    return Vocab.takeError();
  Spec.Vocab = std::move(*Vocab);
  auto Buf = readTokenizerText(VocabBpe);
  if (!Buf)
    return Buf.takeError();
  std::string Where = formatv("'{0}'", VocabBpe).str();
  StringRef Rest = (*Buf)->getBuffer();
  bool First = true;
  while (!Rest.empty()) {
    StringRef Line;
    std::tie(Line, Rest) = Rest.split('\n');
    Line = Line.rtrim("\r");
    if (Line.empty() || (First && Line.startswith("#version"))) {
      First = false;
      continue;
    }
    First = false;
    auto Merge = readMergeLine(Line, Spec.Merges.size(), Where);
    if (!Merge)
      return Merge.takeError();
    Spec.Merges.push_back(std::move(*Merge));
  }
  Spec.Pattern = Gpt2Pattern;
  return Spec;
}

} // namespace sp
