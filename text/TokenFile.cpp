//===- TokenFile.cpp - The width and vocabulary of a token file -----------===//
#include "text/TokenFile.h"
#include "support/Diagnostics.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include <nlohmann/json.hpp>

using namespace llvm;
using json = nlohmann::json;

namespace sp {

std::string tokenSidecarPath(StringRef TokenFile) {
  return (TokenFile + ".json").str();
}

std::string tokenSidecarText(const TokenFileInfo &Info) {
  json J = {{"dtype", Info.Width == 4 ? "uint32" : "uint16"},
            {"vocab", Info.Vocab},
            {"tokens", Info.Tokens},
            {"tokenizer", Info.Tokenizer}};
  return J.dump(1) + "\n";
}

Expected<TokenFileInfo> parseTokenSidecar(StringRef Text, StringRef Name) {
  json J = json::parse(Text.begin(), Text.end(), nullptr,
                       /*allow_exceptions=*/false);
  auto Bad = [&](const Twine &What) {
    return makeError(formatv("token file sidecar '{0}': {1}; rewrite the "
                             "token file with sp-tokenize, or remove the "
                             "sidecar of a uint16 file",
                             Name, What.str()));
  };
  if (J.is_discarded() || !J.is_object())
    return Bad("not a JSON object");
  TokenFileInfo Info;
  Info.HasSidecar = true;
  std::string DType = J.contains("dtype") && J["dtype"].is_string()
                          ? J["dtype"].get<std::string>()
                          : "";
  if (DType == "uint16")
    Info.Width = 2;
  else if (DType == "uint32")
    Info.Width = 4;
  else
    return Bad("dtype is not \"uint16\" or \"uint32\"");
  if (!J.contains("vocab") || !J["vocab"].is_number_unsigned() ||
      J["vocab"].get<uint64_t>() < 1 ||
      J["vocab"].get<uint64_t>() > (1ull << 32))
    return Bad("vocab is not a vocabulary size (a positive integer)");
  Info.Vocab = J["vocab"].get<int64_t>();
  if (Info.Width == 2 && Info.Vocab > 65536)
    return Bad(formatv("dtype uint16 cannot hold the ids of a vocabulary of "
                       "{0}",
                       Info.Vocab));
  if (J.contains("tokens")) {
    if (!J["tokens"].is_number_unsigned())
      return Bad("tokens is not a count");
    Info.Tokens = J["tokens"].get<int64_t>();
  }
  if (J.contains("tokenizer") && J["tokenizer"].is_string())
    Info.Tokenizer = J["tokenizer"].get<std::string>();
  return Info;
}

Expected<TokenFileInfo> readTokenFileInfo(StringRef TokenFile) {
  std::string Side = tokenSidecarPath(TokenFile);
  if (!sys::fs::exists(Side))
    return TokenFileInfo();
  auto Buf = MemoryBuffer::getFile(Side, /*IsText=*/true);
  if (!Buf)
    return makeError(formatv("cannot read token file sidecar '{0}': {1}", Side,
                             Buf.getError().message()));
  return parseTokenSidecar((*Buf)->getBuffer(), Side);
}

} // namespace sp
