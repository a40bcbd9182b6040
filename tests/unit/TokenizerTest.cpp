//===- TokenizerTest.cpp - Byte-level BPE and wide token files ------------===//
//
// The tokenizer of text/ on small hand-made vocabularies (the check of
// GPT-2's real one against js-tiktoken is tests/tokenizer/check_peer.sh),
// and token files of uint32 ids through the DataLoader.
//
//===----------------------------------------------------------------------===//
#include "TestSupport.h"
#include "runtime/DataLoader.h"
#include "text/BpeTokenizer.h"
#include "text/ByteLevel.h"
#include "text/TokenFile.h"
#include "text/TokenizerFiles.h"
#include <fstream>

using namespace llvm;
using namespace sp;
using namespace sp::test;

namespace {

void tokWriteFile(const std::string &Path, StringRef Bytes) {
  std::ofstream OS(Path, std::ios::binary);
  OS.write(Bytes.data(), Bytes.size());
}

std::vector<std::string> tokWords(const PreTokenizer &P, StringRef Text) {
  std::vector<std::string> W;
  cantFail(P.split(Text, [&](StringRef S) { W.push_back(S.str()); }));
  return W;
}

/// Every byte its own id, then the merges' tokens from 256 on.
BpeSpec tokSpec(std::vector<std::pair<std::string, std::string>> Merges,
                const char *Pattern = Gpt2Pattern) {
  BpeSpec S;
  for (unsigned B = 0; B < 256; ++B)
    S.Vocab.emplace_back(std::string(1, char(B)), B);
  uint32_t Next = 256;
  for (auto &M : Merges)
    S.Vocab.emplace_back(M.first + M.second, Next++);
  S.Merges = std::move(Merges);
  S.Pattern = Pattern;
  S.Name = "test";
  return S;
}

} // namespace

TEST(Tokenizer, ByteLevelSpellingIsGpt2s) {
  EXPECT_EQ(byteToCodePoint(' '), 0x120u);  // "Ġ"
  EXPECT_EQ(byteToCodePoint('\n'), 0x10Au); // "Ċ"
  EXPECT_EQ(byteToCodePoint('A'), unsigned('A'));
  EXPECT_EQ(*byteLevelToBytes("\xC4\xA0the"), " the");
  EXPECT_FALSE(byteLevelToBytes("\xE2\x82\xAC")); // U+20AC spells no byte
}

TEST(Tokenizer, Gpt2PatternCutsWordsAsGpt2Does) {
  auto P = cantFail(PreTokenizer::compile(Gpt2Pattern));
  EXPECT_EQ(tokWords(*P, "Hello world's  test\n\n  x"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " test",
                                      "\n\n ", " x"}));
  // Letters and numbers by Unicode property; punctuation runs.
  EXPECT_EQ(tokWords(*P, "caf\xC3\xA9 42\xE2\x82\xAC!!"),
            (std::vector<std::string>{"caf\xC3\xA9", " 42", "\xE2\x82\xAC!!"}));
  auto L = cantFail(PreTokenizer::compile(Llama3Pattern));
  // Llama 3: numbers in threes, case-insensitive contractions.
  EXPECT_EQ(tokWords(*L, "12345 IT'S"),
            (std::vector<std::string>{"123", "45", " IT", "'S"}));
  auto Bad = PreTokenizer::compile("(");
  ASSERT_FALSE(Bad);
  EXPECT_NE(errorText(Bad).find("does not compile"), std::string::npos);
}

TEST(Tokenizer, MergesApplyByRankNotByPosition) {
  // (b, c) ranks before (a, b): "abc" is a + bc, not ab + c.
  auto T = cantFail(
      BpeTokenizer::create(tokSpec({{"b", "c"}, {"a", "b"}, {"ab", "c"}})));
  EXPECT_EQ(cantFail(T->encode("abc")), (std::vector<uint32_t>{'a', 256}));
  EXPECT_EQ(cantFail(T->encode("abx")), (std::vector<uint32_t>{257, 'x'}));
  EXPECT_EQ(cantFail(T->decode({'a', 256, ' ', 257})), "abc ab");
  EXPECT_EQ(T->vocabSize(), 259u);
  auto Bad = T->decode({9999});
  ASSERT_FALSE(Bad);
  EXPECT_NE(errorText(Bad).find("9999 is not a token id"), std::string::npos);
}

TEST(Tokenizer, ThreadsGiveTheIdsOfOne) {
  auto T = cantFail(BpeTokenizer::create(tokSpec(
      {{" ", "t"}, {" t", "h"}, {"h", "e"}, {" th", "e"}, {"\n", "\n"}})));
  std::string Text;
  for (int I = 0; I < 40000; ++I)
    Text += (I % 7 ? "the theme\n" : "  then\n\n") + std::to_string(I) + "\n";
  auto One = cantFail(T->encode(Text, 1)), Four = cantFail(T->encode(Text, 4));
  EXPECT_GT(Text.size(), size_t(256) << 10); // several chunks
  EXPECT_EQ(One, Four);
  EXPECT_EQ(cantFail(T->decode(One)), Text);
}

TEST(Tokenizer, NonUtf8TextIsRefusedWithItsOffset) {
  auto T = cantFail(BpeTokenizer::create(tokSpec({})));
  auto Ids = T->encode(StringRef("ok \xFF", 4));
  ASSERT_FALSE(Ids);
  EXPECT_NE(errorText(Ids).find("not UTF-8 at byte 3 (0xff)"),
            std::string::npos);
}

TEST(Tokenizer, TokenizerJsonOfGpt2AndLlama3Kinds) {
  TempDir D;
  // "Ġ" is the space; merges as strings and as pairs.
  tokWriteFile(D.file("g.json"), R"({"normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
    "added_tokens": [{"id": 258, "content": "<|endoftext|>", "special": true}],
    "model": {"type": "BPE", "vocab": {"a": 97, "b": 98, "\u0120": 32,
      "\u0120a": 256, "\u0120ab": 257},
      "merges": ["\u0120 a", ["\u0120a", "b"]]}})");
  auto Spec = readTokenizerJson(D.file("g.json"));
  ASSERT_TRUE(bool(Spec)) << errorText(Spec);
  // The vocabulary lacks most bytes: refused by name.
  auto T = BpeTokenizer::create(*Spec);
  ASSERT_FALSE(T);
  EXPECT_NE(errorText(T).find("no token for the byte 0x00"), std::string::npos);
  for (unsigned B = 0; B < 256; ++B)
    if (B != 'a' && B != 'b' && B != ' ')
      Spec->Vocab.emplace_back(std::string(1, char(B)), B);
  auto Tok = cantFail(BpeTokenizer::create(*Spec));
  EXPECT_EQ(cantFail(Tok->encode("a ab")), (std::vector<uint32_t>{97, 257}));
  EXPECT_EQ(cantFail(Tok->decode({258})), "<|endoftext|>");
  EXPECT_EQ(Tok->vocabSize(), 259u);

  tokWriteFile(D.file("l.json"), R"({"normalizer": null,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}|[^\\p{N}]+"},
       "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
    "model": {"type": "BPE", "ignore_merges": true, "vocab": {}, "merges": []}})");
  auto L = readTokenizerJson(D.file("l.json"));
  ASSERT_TRUE(bool(L)) << errorText(L);
  EXPECT_EQ(L->Pattern, "\\p{N}{1,3}|[^\\p{N}]+");
  EXPECT_TRUE(L->IgnoreMerges);

  tokWriteFile(D.file("n.json"), R"({"normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {}, "merges": []}})");
  auto N = readTokenizerJson(D.file("n.json"));
  ASSERT_FALSE(N);
  EXPECT_NE(errorText(N).find("normalizer {\"type\":\"NFC\"} is not "
                              "implemented"),
            std::string::npos);
}

TEST(TokenFile, Uint32IdsRoundTripThroughTheDataLoader) {
  TempDir D;
  // Llama 3's ids: above 65535.
  std::vector<uint32_t> Ids;
  for (uint32_t I = 0; I < 300; ++I)
    Ids.push_back((I * 7919u + 65530u) % 128256u);
  std::string Bytes;
  for (uint32_t T : Ids)
    for (int B = 0; B < 4; ++B)
      Bytes += char(T >> (8 * B));
  std::string Bin = D.file("t.bin");
  tokWriteFile(Bin, Bytes);
  TokenFileInfo Info;
  Info.Width = 4;
  Info.Vocab = 128256;
  Info.Tokens = int64_t(Ids.size());
  Info.Tokenizer = "tokenizer.json";
  tokWriteFile(tokenSidecarPath(Bin), tokenSidecarText(Info));
  auto Read = cantFail(readTokenFileInfo(Bin));
  EXPECT_EQ(Read.Width, 4u);
  EXPECT_EQ(Read.Vocab, 128256);

  auto L = DataLoader::open(Bin, 1, 8, 128256);
  ASSERT_TRUE(bool(L)) << errorText(L);
  EXPECT_EQ((*L)->numTokens(), 300);
  EXPECT_EQ((*L)->tokenWidth(), 4u);
  TokenBatch B;
  (*L)->getBatch(1, B);
  for (int J = 0; J < 8; ++J) {
    EXPECT_EQ(B.Tokens[J], int64_t(Ids[J]));
    EXPECT_EQ(B.Targets[J], int64_t(Ids[J + 1]));
  }
  EXPECT_GT(*std::max_element(B.Tokens.begin(), B.Tokens.end()), 65535);

  // A model whose vocabulary is smaller than the tokenizer's.
  auto Small = DataLoader::open(Bin, 1, 8, 70000);
  ASSERT_FALSE(Small);
  EXPECT_NE(errorText(Small).find("vocabulary of 128256 (tokenizer.json), "
                                  "larger than the model's 70000"),
            std::string::npos);
  // A sidecar of another run.
  Info.Tokens = 299;
  tokWriteFile(tokenSidecarPath(Bin), tokenSidecarText(Info));
  auto Stale = DataLoader::open(Bin, 1, 8, 128256);
  ASSERT_FALSE(Stale);
  EXPECT_NE(errorText(Stale).find("holds 300 uint32 ids but its sidecar"),
            std::string::npos);
  // uint16 cannot hold a vocabulary of 128256.
  tokWriteFile(tokenSidecarPath(Bin),
               R"({"dtype": "uint16", "vocab": 128256})");
  auto Narrow = DataLoader::open(Bin, 1, 8, 128256);
  ASSERT_FALSE(Narrow);
  EXPECT_NE(errorText(Narrow).find("dtype uint16 cannot hold"),
            std::string::npos);
  // Without its sidecar, small uint32 ids read as uint16 would pass the
  // vocabulary check; their zero high halves give them away.
  sys::fs::remove(tokenSidecarPath(Bin));
  std::string Low;
  for (uint32_t I = 0; I < 300; ++I)
    for (int B = 0; B < 4; ++B)
      Low += char((I % 200 + 1) >> (8 * B));
  tokWriteFile(Bin, Low);
  auto Guess = DataLoader::open(Bin, 1, 8, 256);
  ASSERT_FALSE(Guess);
  EXPECT_NE(errorText(Guess).find("looks like uint32 ids"), std::string::npos);
}
