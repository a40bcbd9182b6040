//===- PreTokenizer.cpp - Text to words by a regular expression -----------===//
#include "text/PreTokenizer.h"
#include "support/Diagnostics.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/FormatVariadic.h"
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

using namespace llvm;

namespace sp {

const char *const Gpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char *const Llama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Expected<std::unique_ptr<PreTokenizer>>
PreTokenizer::compile(StringRef Pattern) {
  int Code;
  PCRE2_SIZE Offset;
  pcre2_code *C = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(Pattern.data()),
                                Pattern.size(), PCRE2_UTF | PCRE2_UCP, &Code,
                                &Offset, nullptr);
  if (!C) {
    PCRE2_UCHAR Msg[256];
    pcre2_get_error_message(Code, Msg, sizeof(Msg));
    return makeError(formatv("the pre-tokenizer pattern '{0}' does not "
                             "compile: {1} at offset {2}",
                             Pattern, reinterpret_cast<const char *>(Msg),
                             Offset));
  }
  // Without JIT (a platform PCRE2 cannot JIT for) matching is slower, not
  // different.
  pcre2_jit_compile(C, PCRE2_JIT_COMPLETE);
  std::unique_ptr<PreTokenizer> P(new PreTokenizer());
  P->Pattern = Pattern.str();
  P->Code = C;
  return P;
}

PreTokenizer::~PreTokenizer() {
  pcre2_code_free(static_cast<pcre2_code *>(Code));
}

namespace {
/// One thread's match state: match data and a JIT stack large enough for
/// long runs of white space.
struct MatchState {
  pcre2_match_data *Data;
  pcre2_match_context *Context;
  pcre2_jit_stack *Stack;
  explicit MatchState(const pcre2_code *C)
      : Data(pcre2_match_data_create_from_pattern(C, nullptr)),
        Context(pcre2_match_context_create(nullptr)),
        Stack(pcre2_jit_stack_create(32 << 10, 64 << 20, nullptr)) {
    pcre2_jit_stack_assign(Context, nullptr, Stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(Stack);
    pcre2_match_context_free(Context);
    pcre2_match_data_free(Data);
  }
};
} // namespace

Error PreTokenizer::split(StringRef Text,
                          function_ref<void(StringRef)> Word) const {
  const auto *C = static_cast<const pcre2_code *>(Code);
  MatchState S(C);
  const auto *Subject = reinterpret_cast<PCRE2_SPTR>(Text.data());
  size_t Pos = 0, Emitted = 0;
  while (Pos < Text.size()) {
    int Rc = pcre2_match(C, Subject, Text.size(), Pos, PCRE2_NO_UTF_CHECK,
                         S.Data, S.Context);
    if (Rc == PCRE2_ERROR_NOMATCH)
      break;
    if (Rc < 0) {
      PCRE2_UCHAR Msg[256];
      pcre2_get_error_message(Rc, Msg, sizeof(Msg));
      return makeError(formatv("the pre-tokenizer pattern failed at byte "
                               "{0}: {1}",
                               Pos, reinterpret_cast<const char *>(Msg)));
    }
    PCRE2_SIZE *V = pcre2_get_ovector_pointer(S.Data);
    size_t Begin = V[0], End = V[1];
    if (Begin > Emitted)
      Word(Text.slice(Emitted, Begin)); // the text between two matches
    if (End > Begin) {
      Word(Text.slice(Begin, End));
      Emitted = Pos = End;
      continue;
    }
    // An empty match: go on from the next character.
    Pos = End + 1;
    while (Pos < Text.size() && (uint8_t(Text[Pos]) & 0xC0) == 0x80)
      ++Pos;
  }
  if (Emitted < Text.size())
    Word(Text.drop_front(Emitted));
  return Error::success();
}

size_t firstInvalidUtf8(StringRef Text) {
  const auto *Begin = reinterpret_cast<const UTF8 *>(Text.begin());
  const auto *P = Begin;
  const auto *End = reinterpret_cast<const UTF8 *>(Text.end());
  while (P < End) {
    // ASCII runs fast; the rest a sequence at a time.
    if (*P < 0x80) {
      ++P;
      continue;
    }
    unsigned N = getNumBytesForUTF8(*P);
    if (N > size_t(End - P) || !isLegalUTF8Sequence(P, P + N))
      return size_t(P - Begin);
    P += N;
  }
  return Text.size();
}

} // namespace sp
