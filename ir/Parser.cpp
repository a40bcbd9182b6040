//===- Parser.cpp - Textual IR parser -------------------------------------===//
//
// A hand-written lexer and recursive-descent parser for the format described
// in AsmFormat.h. Result types are written out in the text, so parsing needs
// no shape inference; the verifier checks them afterwards.
//
//===----------------------------------------------------------------------===//
#include "ir/AsmFormat.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <variant>

using namespace llvm;

namespace sp {

namespace {

/// At most 2^48 elements in a type, as the ONNX importer allows, so that
/// element and byte counts never overflow.
constexpr int64_t MaxElements = int64_t(1) << 48;
/// A splat expands to this many bytes at most, so that a few characters
/// cannot ask for gigabytes; every other payload is as long as its text.
/// The inline data the compiler writes is far smaller (folded constants
/// have at most MaxFoldElements = 2^20 elements), and a larger constant
/// belongs in an external file.
constexpr int64_t MaxSplatBytes = int64_t(1) << 26;

struct Token {
  enum Kind { Eof, Ident, ValueRef, GraphRef, String, Number, Punct };
  Kind K = Eof;
  std::string Text; // identifier, unescaped string, ref name, number spelling
  bool Quoted = false; // for ValueRef: %"..."
  char P = 0;          // for Punct
  unsigned Line = 1, Col = 1;
};

class Lexer {
public:
  Lexer(StringRef Buf) : Buf(Buf) {}

  Expected<Token> next() {
    skipSpace();
    Token T;
    T.Line = Line;
    T.Col = Col;
    if (Pos >= Buf.size())
      return T;
    char C = Buf[Pos];
    if (C == '%' || C == '@') {
      advance();
      T.K = C == '%' ? Token::ValueRef : Token::GraphRef;
      if (Pos < Buf.size() && Buf[Pos] == '"') {
        T.Quoted = true;
        if (auto E = lexString(T.Text))
          return E;
        return T;
      }
      size_t Start = Pos;
      while (Pos < Buf.size() &&
             (isAlnum(Buf[Pos]) || Buf[Pos] == '_' || Buf[Pos] == '.'))
        advance();
      if (Start == Pos)
        return error(T, "expected a name after '" + std::string(1, C) + "'");
      T.Text = Buf.slice(Start, Pos).str();
      return T;
    }
    if (C == '"') {
      T.K = Token::String;
      if (auto E = lexString(T.Text))
        return E;
      return T;
    }
    if (isDigit(C) || C == '-' || C == '+') {
      size_t Start = Pos;
      advance();
      while (Pos < Buf.size() &&
             (isAlnum(Buf[Pos]) || Buf[Pos] == '.' ||
              ((Buf[Pos] == '-' || Buf[Pos] == '+') &&
               (Buf[Pos - 1] == 'e' || Buf[Pos - 1] == 'E'))))
        advance();
      T.K = Token::Number;
      T.Text = Buf.slice(Start, Pos).str();
      return T;
    }
    if (isAlpha(C) || C == '_') {
      size_t Start = Pos;
      while (Pos < Buf.size() &&
             (isAlnum(Buf[Pos]) || Buf[Pos] == '_' || Buf[Pos] == '.'))
        advance();
      T.K = Token::Ident;
      T.Text = Buf.slice(Start, Pos).str();
      return T;
    }
    if (StringRef("{}()[]<>,:=#").contains(C)) {
      advance();
      T.K = Token::Punct;
      T.P = C;
      return T;
    }
    return error(T, formatv("unexpected character '{0}'", C).str());
  }

  Error error(const Token &At, const Twine &Msg) {
    return createStringError(inconvertibleErrorCode(), "%u:%u: %s", At.Line,
                             At.Col, Msg.str().c_str());
  }

private:
  void advance() {
    if (Buf[Pos] == '\n') {
      ++Line;
      Col = 1;
    } else {
      ++Col;
    }
    ++Pos;
  }

  void skipSpace() {
    while (Pos < Buf.size()) {
      if (isSpace(Buf[Pos])) {
        advance();
      } else if (Buf.substr(Pos).startswith("//")) {
        while (Pos < Buf.size() && Buf[Pos] != '\n')
          advance();
      } else {
        break;
      }
    }
  }

  Error lexString(std::string &Out) {
    Token At;
    At.Line = Line;
    At.Col = Col;
    advance(); // opening quote
    while (Pos < Buf.size() && Buf[Pos] != '"') {
      char C = Buf[Pos];
      if (C == '\n')
        break;
      if (C == '\\' && Pos + 1 < Buf.size()) {
        char E = Buf[Pos + 1];
        if (E == '\\' || E == '"') {
          Out += E;
          advance();
          advance();
          continue;
        }
        if (E == 'n' || E == 't') {
          Out += E == 'n' ? '\n' : '\t';
          advance();
          advance();
          continue;
        }
        if (Pos + 2 < Buf.size() && isHexDigit(Buf[Pos + 1]) &&
            isHexDigit(Buf[Pos + 2])) {
          Out += char(hexFromNibbles(Buf[Pos + 1], Buf[Pos + 2]));
          advance();
          advance();
          advance();
          continue;
        }
      }
      Out += C;
      advance();
    }
    if (Pos >= Buf.size() || Buf[Pos] != '"')
      return error(At, "unterminated string");
    advance();
    // Names and strings end up in the plan's JSON, which holds UTF-8 only.
    const auto *P = reinterpret_cast<const UTF8 *>(Out.data());
    if (!isLegalUTF8String(&P, P + Out.size()))
      return error(At, "the string is not valid UTF-8");
    return Error::success();
  }

  StringRef Buf;
  size_t Pos = 0;
  unsigned Line = 1, Col = 1;
};

bool isFloatSpelling(StringRef S) {
  return S.find_first_of(".eEn") != StringRef::npos; // n: inf, nan
}

class Parser {
public:
  Parser(StringRef Text, StringRef BufName) : Lex(Text), BufName(BufName) {}

  Expected<std::unique_ptr<Graph>> parse() {
    if (auto E = consume())
      return E;
    if (auto E = expectKeyword("graph"))
      return E;
    if (Tok.K != Token::GraphRef)
      return fail("expected '@name' after 'graph'");
    auto G = std::make_unique<Graph>(Tok.Text);
    this->G = G.get();
    if (auto E = consume())
      return E;
    if (auto E = expectPunct('{'))
      return E;
    while (!(Tok.K == Token::Punct && Tok.P == '}')) {
      if (Tok.K == Token::Eof)
        return fail("expected '}' at the end of the graph");
      if (auto E = parseStatement())
        return E;
    }
    if (auto E = consume())
      return E;
    if (Tok.K != Token::Eof)
      return fail("unexpected text after the graph");
    return G;
  }

private:
  // Token helpers.
  Error consume() {
    auto T = Lex.next();
    if (!T)
      return withBuf(T.takeError());
    Tok = std::move(*T);
    return Error::success();
  }
  Error withBuf(Error E) {
    return createStringError(inconvertibleErrorCode(), "%s:%s",
                             BufName.c_str(),
                             toString(std::move(E)).c_str());
  }
  Error fail(const Twine &Msg) { return withBuf(Lex.error(Tok, Msg)); }
  bool isPunct(char C) const { return Tok.K == Token::Punct && Tok.P == C; }
  bool isKeyword(StringRef K) const {
    return Tok.K == Token::Ident && Tok.Text == K;
  }
  Error expectPunct(char C) {
    if (!isPunct(C))
      return fail(formatv("expected '{0}'", C));
    return consume();
  }
  Error expectKeyword(StringRef K) {
    if (!isKeyword(K))
      return fail("expected '" + K + "'");
    return consume();
  }
  /// The identifier at hand as Lookup (parseDType, parseOpName) reads it:
  /// fails with Missing if there is none, with "Unknown 'name'" if Lookup
  /// knows no such name.
  template <typename T>
  Expected<T> expectName(std::optional<T> (*Lookup)(StringRef),
                         const char *Missing, const char *Unknown) {
    if (Tok.K != Token::Ident)
      return fail(Missing);
    std::optional<T> V = Lookup(Tok.Text);
    if (!V)
      return fail(Twine(Unknown) + " '" + Tok.Text + "'");
    if (auto E = consume())
      return E;
    return *V;
  }
  /// "(" A, B, ... ")": a string or an integer each, as the Args point to.
  Error parseArgs(
      std::initializer_list<std::variant<std::string *, int64_t *>> Args) {
    if (auto E = expectPunct('('))
      return E;
    bool First = true;
    for (auto Arg : Args) {
      if (!First)
        if (auto E = expectPunct(','))
          return E;
      First = false;
      if (auto **S = std::get_if<std::string *>(&Arg)) {
        auto V = expectString();
        if (!V)
          return V.takeError();
        **S = std::move(*V);
      } else {
        auto V = expectInt();
        if (!V)
          return V.takeError();
        *std::get<int64_t *>(Arg) = *V;
      }
    }
    return expectPunct(')');
  }
  /// Open, then Element for each item of a comma-separated list, then Close.
  Error parseList(char Open, char Close, function_ref<Error()> Element) {
    if (auto E = expectPunct(Open))
      return E;
    for (bool First = true; !isPunct(Close); First = false) {
      if (!First)
        if (auto E = expectPunct(','))
          return E;
      if (auto E = Element())
        return E;
    }
    return consume();
  }
  Expected<std::string> expectString() {
    if (Tok.K != Token::String)
      return fail("expected a string");
    std::string S = Tok.Text;
    if (auto E = consume())
      return E;
    return S;
  }
  Expected<int64_t> expectInt() {
    int64_t V;
    if (Tok.K != Token::Number || isFloatSpelling(Tok.Text) ||
        StringRef(Tok.Text).getAsInteger(10, V))
      return fail("expected an integer");
    if (auto E = consume())
      return E;
    return V;
  }
  Expected<double> expectNumber() {
    if (Tok.K != Token::Number && !isKeyword("inf") && !isKeyword("nan"))
      return fail("expected a number");
    std::string S = Tok.Text;
    double V;
    if (S == "inf" || S == "+inf")
      V = HUGE_VAL;
    else if (S == "-inf")
      V = -HUGE_VAL;
    else if (S == "nan" || S == "+nan")
      V = std::nan("");
    else if (S == "-nan") // the printer writes the sign of a NaN
      V = -std::nan("");
    else {
      const char *B = S.data() + (S[0] == '+');
      auto R = std::from_chars(B, S.data() + S.size(), V);
      if (R.ec != std::errc() || R.ptr != S.data() + S.size())
        return fail("malformed number '" + S + "'");
    }
    if (auto E = consume())
      return E;
    return V;
  }

  // Grammar.
  Error parseStatement() {
    if (isKeyword("input") || isKeyword("param") || isKeyword("const") ||
        isKeyword("state"))
      return parseLeaf();
    if (isKeyword("output"))
      return parseOutput();
    if (Tok.K == Token::ValueRef || Tok.K == Token::Ident)
      return parseNode();
    return fail(
        "expected 'input', 'param', 'const', 'state', 'output' or a node");
  }

  Expected<TensorType> parseType() {
    auto D = expectName(parseDType, "expected a type such as f32[4, 8]",
                        "unknown element type");
    if (!D)
      return D.takeError();
    TensorType T;
    T.Dtype = *D;
    int64_t Elements = 1;
    if (auto E = parseList('[', ']', [&]() -> Error {
          auto Dim = expectInt();
          if (!Dim)
            return Dim.takeError();
          if (*Dim < 0)
            return fail("dimensions must be non-negative");
          if (__builtin_mul_overflow(Elements, *Dim, &Elements) ||
              Elements > MaxElements)
            return fail("the type has more than 2^48 elements");
          T.Shape.push_back(*Dim);
          return Error::success();
        }))
      return E;
    return T;
  }

  /// ": type" and an optional sharding, after the name of a value.
  Expected<std::pair<TensorType, Sharding>> parseValueType() {
    if (auto E = expectPunct(':'))
      return E;
    auto T = parseType();
    if (!T)
      return T.takeError();
    auto S = parseOptionalSharding(*T);
    if (!S)
      return S.takeError();
    return std::make_pair(std::move(*T), *S);
  }

  /// A sharding after a value's type T: a split names one of T's axes.
  Expected<Sharding> parseOptionalSharding(const TensorType &T) {
    Sharding S;
    if (!isPunct('#'))
      return S;
    Token At = Tok;
    if (auto E = consume())
      return E;
    if (isKeyword("replicated"))
      S.K = Sharding::Replicated;
    else if (isKeyword("partial"))
      S.K = Sharding::Partial;
    else if (isKeyword("split"))
      S.K = Sharding::Split;
    else
      return fail("expected 'replicated', 'partial' or 'split(...)'");
    if (auto E = consume())
      return E;
    // Fields: a split's dim, parts, blocks and padded; a replicated value's
    // sum_grad; either's dp_chunks.
    bool Split = S.K == Sharding::Split;
    if (Split || (S.K == Sharding::Replicated && isPunct('(')))
      if (auto E = parseList('(', ')', [&] { return parseShardingField(S); }))
        return E;
    if (Split) {
      if (S.Dim < 0 || S.Parts < 1 || S.Blocks < 1)
        return fail("a split needs dim >= 0, parts >= 1 and blocks >= 1");
      // A chunk's split names an axis of the value it is cut from.
      if (!S.DataChunks && S.Dim >= int64_t(T.rank()))
        return withBuf(Lex.error(
            At, "a split of dim " + Twine(S.Dim) + " needs a value of rank " +
                    Twine(S.Dim + 1) + " or more; the type is " + T.str()));
    }
    return S;
  }

  /// One field of a split's or a replicated value's (...).
  Error parseShardingField(Sharding &S) {
    bool Split = S.K == Sharding::Split;
    if (Tok.K != Token::Ident)
      return fail(Split ? "expected dim, parts, blocks, padded or dp_chunks"
                        : "expected sum_grad or dp_chunks");
    std::string Key = Tok.Text;
    if (auto E = consume())
      return E;
    if (!Split && Key == "sum_grad") {
      S.SumGrad = true;
      return Error::success();
    }
    if (auto E = expectPunct('='))
      return E;
    auto V = expectInt();
    if (!V)
      return V.takeError();
    if (Key != "padded" && (*V < INT_MIN || *V > INT_MAX))
      return fail("'" + Key + "' is out of range");
    if (Key == "dp_chunks" && *V < 1)
      return fail("'dp_chunks' must be a positive int");
    if (Key == "dp_chunks")
      S.DataChunks = *V;
    else if (Split && Key == "dim")
      S.Dim = *V;
    else if (Split && Key == "parts")
      S.Parts = *V;
    else if (Split && Key == "blocks")
      S.Blocks = *V;
    else if (Split && Key == "padded")
      S.Padded = *V;
    else
      return fail("unknown " + std::string(Split ? "split" : "replicated") +
                  " field '" + Key + "'");
    return Error::success();
  }

  Error define(const Token &Name, Value *V) {
    auto &Table = Name.Quoted || !isResultName(Name.Text) ? Leaves : Results;
    if (!Table.try_emplace(Name.Text, V).second)
      return withBuf(
          Lex.error(Name, "redefinition of '%" + Name.Text + "'"));
    return Error::success();
  }
  static bool isResultName(StringRef S) {
    return !S.empty() && isDigit(S[0]);
  }

  Expected<Value *> parseRef() {
    if (Tok.K != Token::ValueRef)
      return fail("expected a value such as %0 or %name");
    Value *V = nullptr;
    if (!Tok.Quoted) {
      auto It = Results.find(Tok.Text);
      if (It != Results.end())
        V = It->second;
    }
    if (!V) {
      auto It = Leaves.find(Tok.Text);
      if (It != Leaves.end())
        V = It->second;
    }
    if (!V)
      return fail("use of undefined value '%" + Tok.Text + "'");
    if (auto E = consume())
      return E;
    return V;
  }

  Error parseLeaf() {
    std::string Kind = Tok.Text;
    if (auto E = consume())
      return E;
    if (Tok.K != Token::ValueRef)
      return fail("expected '%name' after '" + Kind + "'");
    Token Name = Tok;
    if (!Name.Quoted && isResultName(Name.Text))
      return fail("names of inputs, parameters and constants must not start "
                  "with a digit unless quoted");
    if (auto E = consume())
      return E;
    auto TS = parseValueType();
    if (!TS)
      return TS.takeError();
    const auto &[T, S] = *TS;
    Value *V;
    if (Kind == "input") {
      InputRole Role = InputRole::None;
      if (isKeyword("as")) { // input %ids : i64[4,64] as tokens
        if (auto E = consume())
          return E;
        auto R = parseInputRole(Tok.Text);
        if (Tok.K != Token::Ident || !R)
          return fail("expected an input role (tokens, targets, positions, "
                      "mask, token_types, lr or step) after 'as'");
        Role = *R;
        if (auto E = consume())
          return E;
      }
      V = G->addInput(Name.Text, T, Role);
    } else if (Kind == "state") {
      V = G->addState(Name.Text, T);
    } else {
      if (auto E = expectPunct('='))
        return E;
      // The payload's type is the leaf's, unless a ": type" after it names
      // the whole source tensor of a sharded parameter.
      auto Saved = std::make_pair(Lex, Tok);
      auto D = parsePayload(T);
      if (!D)
        return D.takeError();
      if (isPunct(':')) {
        if (auto E = consume())
          return E;
        auto Source = parseType();
        if (!Source)
          return Source.takeError();
        Lex = Saved.first;
        Tok = Saved.second;
        D = parsePayload(*Source);
        if (!D)
          return D.takeError();
        if (auto E = expectPunct(':'))
          return E;
        if (auto E = parseType().takeError())
          return E;
      }
      V = Kind == "param" ? G->addParam(Name.Text, T, std::move(*D))
                          : G->addConst(Name.Text, T, std::move(*D));
    }
    V->setSharding(S);
    return define(Name, V);
  }

  Expected<std::shared_ptr<TensorData>> parsePayload(const TensorType &T) {
    // external("path", offset, length) or onnx("path", "initializer").
    bool External = isKeyword("external");
    if (External || isKeyword("onnx")) {
      if (auto E = consume())
        return E;
      DataRef R;
      R.K = External ? DataRef::External : DataRef::OnnxInitializer;
      if (auto E = External ? parseArgs({&R.Path, &R.Offset, &R.Length})
                            : parseArgs({&R.Path, &R.Key}))
        return E;
      return TensorData::makeRef(T, R);
    }
    if (isKeyword("dense"))
      return parseDense(T);
    return fail("expected 'dense<...>', 'external(...)' or 'onnx(...)'");
  }

  Error appendElement(const TensorType &T, std::vector<char> &Out) {
    auto Put = [&](auto V) {
      const char *P = reinterpret_cast<const char *>(&V);
      Out.insert(Out.end(), P, P + sizeof(V));
    };
    if (T.Dtype == DType::F32 || T.Dtype == DType::F64) {
      std::string S = Tok.Text;
      auto V = expectNumber();
      if (!V)
        return V.takeError();
      if (T.Dtype == DType::F32) {
        // Parse as float directly so the shortest spelling reads back exactly.
        float F = std::isnan(*V) ? std::copysign(std::nanf(""), float(*V))
                                 : float(*V);
        if (std::isfinite(*V))
          std::from_chars(S.data() + (S[0] == '+'), S.data() + S.size(), F);
        Put(F);
      } else {
        Put(*V);
      }
      return Error::success();
    }
    Token At = Tok;
    auto I = expectInt();
    if (!I)
      return I.takeError();
    // f16 and bf16 elements are their raw bits.
    auto [Min, Max] = [&]() -> std::pair<int64_t, int64_t> {
      switch (T.Dtype) {
      case DType::I32:
        return {INT32_MIN, INT32_MAX};
      case DType::I8:
        return {INT8_MIN, INT8_MAX};
      case DType::U8:
      case DType::Bool:
        return {0, UINT8_MAX};
      case DType::F16:
      case DType::BF16:
        return {0, UINT16_MAX};
      default:
        return {INT64_MIN, INT64_MAX};
      }
    }();
    if (*I < Min || *I > Max)
      return withBuf(Lex.error(At, formatv("{0} does not fit {1}", *I,
                                           dtypeName(T.Dtype))));
    switch (T.Dtype) {
    case DType::I64:
      Put(int64_t(*I));
      break;
    case DType::I32:
      Put(int32_t(*I));
      break;
    case DType::I8:
      Put(int8_t(*I));
      break;
    case DType::U8:
    case DType::Bool:
      Put(uint8_t(*I));
      break;
    default: // f16, bf16: raw bits
      Put(uint16_t(*I));
      break;
    }
    return Error::success();
  }

  Expected<std::shared_ptr<TensorData>> parseDense(const TensorType &T) {
    if (auto E = consume())
      return E;
    if (auto E = expectPunct('<'))
      return E;
    std::vector<char> Bytes;
    int64_t N = T.numElements();
    if (isKeyword("splat")) {
      if (auto E = consume())
        return E;
      if (auto E = appendElement(T, Bytes))
        return E;
      if (int64_t(Bytes.size()) * N > MaxSplatBytes)
        return fail(formatv("a splat of {0} is more than 64 MiB; store it as "
                            "external data",
                            T.str()));
      // Element 0 holds the value: double the filled prefix until full.
      size_t Size = Bytes.size();
      Bytes.resize(Size * N);
      for (size_t Done = Size; Done < Bytes.size(); Done *= 2)
        std::memcpy(Bytes.data() + Done, Bytes.data(),
                    std::min(Done, Bytes.size() - Done));
    } else if (isPunct('[')) {
      if (auto E = parseList('[', ']', [&] { return appendElement(T, Bytes); }))
        return E;
    } else {
      if (auto E = appendElement(T, Bytes))
        return E;
    }
    if (int64_t(Bytes.size()) != T.numBytes())
      return fail(formatv("dense data has {0} elements, the type {1} needs {2}",
                          Bytes.size() / dtypeSize(T.Dtype), T.str(), N));
    if (auto E = expectPunct('>'))
      return E;
    return TensorData::makeInline(T, std::move(Bytes));
  }

  Error parseOutput() {
    if (auto E = consume())
      return E;
    auto Name = expectString();
    if (!Name)
      return Name.takeError();
    if (auto E = expectPunct('='))
      return E;
    auto V = parseRef();
    if (!V)
      return V.takeError();
    G->addOutput(*Name, *V);
    return Error::success();
  }

  Expected<Attribute> parseAttrValue() {
    if (Tok.K == Token::String) {
      auto S = expectString();
      if (!S)
        return S.takeError();
      return Attribute(*S);
    }
    if (isPunct('[')) {
      std::vector<int64_t> Ints;
      std::vector<double> Floats;
      bool AnyFloat = false;
      if (auto E = parseList('[', ']', [&]() -> Error {
            if (isFloatSpelling(Tok.Text) || Tok.K == Token::Ident) {
              auto V = expectNumber();
              if (!V)
                return V.takeError();
              AnyFloat = true;
              Floats.push_back(*V);
              Ints.push_back(0);
            } else {
              auto V = expectInt();
              if (!V)
                return V.takeError();
              Ints.push_back(*V);
              Floats.push_back(double(*V));
            }
            return Error::success();
          }))
        return E;
      if (AnyFloat)
        return Attribute(Floats);
      return Attribute(Ints);
    }
    if (Tok.K == Token::Number || isKeyword("inf") || isKeyword("nan")) {
      if (isFloatSpelling(Tok.Text)) {
        auto V = expectNumber();
        if (!V)
          return V.takeError();
        return Attribute(*V);
      }
      auto V = expectInt();
      if (!V)
        return V.takeError();
      return Attribute(*V);
    }
    return fail("expected an attribute value");
  }

  Error parseNode() {
    // Results.
    SmallVector<Token, 2> Names;
    SmallVector<TensorType, 2> Types;
    SmallVector<Sharding, 2> Shards;
    while (Tok.K == Token::ValueRef) {
      Names.push_back(Tok);
      if (auto E = consume())
        return E;
      auto TS = parseValueType();
      if (!TS)
        return TS.takeError();
      Types.push_back(TS->first);
      Shards.push_back(TS->second);
      if (isPunct(',')) {
        if (auto E = consume())
          return E;
        continue;
      }
      if (auto E = expectPunct('='))
        return E;
      break;
    }
    // Op.
    auto Op = expectName(parseOpName, "expected an op name", "unknown op");
    if (!Op)
      return Op.takeError();
    SmallVector<Value *, 4> Operands;
    if (auto E = parseList('(', ')', [&]() -> Error {
          auto V = parseRef();
          if (!V)
            return V.takeError();
          Operands.push_back(*V);
          return Error::success();
        }))
      return E;
    Node *N = G->append(*Op, Operands, Types);
    for (unsigned I = 0; I < Names.size(); ++I) {
      N->result(I)->setSharding(Shards[I]);
      if (auto E = define(Names[I], N->result(I)))
        return E;
    }
    // Attributes.
    if (isPunct('{'))
      if (auto E = parseList('{', '}', [&] { return parseAttribute(*N); }))
        return E;
    // Location.
    if (isKeyword("loc")) {
      if (auto E = consume())
        return E;
      std::string Loc;
      if (auto E = parseArgs({&Loc}))
        return E;
      N->setName(Loc);
    }
    // Tags.
    if (isPunct('['))
      if (auto E = parseList('[', ']', [&] { return parseTag(N->tags()); }))
        return E;
    return Error::success();
  }

  /// name = value, in a node's {...}.
  Error parseAttribute(Node &N) {
    if (Tok.K != Token::Ident && Tok.K != Token::String)
      return fail("expected an attribute name");
    std::string Name = Tok.Text;
    if (N.attrs().has(Name))
      return fail("duplicate attribute '" + Name + "'");
    if (auto E = consume())
      return E;
    if (auto E = expectPunct('='))
      return E;
    auto A = parseAttrValue();
    if (!A)
      return A.takeError();
    N.attrs().set(Name, std::move(*A));
    return Error::success();
  }

  /// layer = N, stage = N, role = "name" or phase = name, in a node's [...].
  Error parseTag(Tags &T) {
    if (Tok.K != Token::Ident)
      return fail("expected a tag: layer, role, phase or stage");
    std::string Key = Tok.Text;
    if (auto E = consume())
      return E;
    if (auto E = expectPunct('='))
      return E;
    if (Key == "layer" || Key == "stage") {
      auto V = expectInt();
      if (!V)
        return V.takeError();
      if (*V < -1 || *V > INT_MAX)
        return fail("'" + Key + "' is out of range");
      (Key == "layer" ? T.Layer : T.Stage) = int(*V);
    } else if (Key == "role") {
      auto S = expectString();
      if (!S)
        return S.takeError();
      auto R = parseRole(*S);
      if (!R)
        return fail("unknown role '" + *S + "' (ir/Roles.def lists the roles)");
      T.Role = *R;
    } else if (Key == "phase") {
      auto P = Tok.K == Token::Ident ? parsePhase(Tok.Text) : std::nullopt;
      if (!P)
        return fail("expected a phase: fwd, bwd, recompute or opt");
      T.Ph = *P;
      if (auto E = consume())
        return E;
    } else {
      return fail("unknown tag '" + Key + "'");
    }
    return Error::success();
  }

  Lexer Lex;
  std::string BufName;
  Token Tok;
  Graph *G = nullptr;
  StringMap<Value *> Results, Leaves;
};

} // namespace

Expected<std::unique_ptr<Graph>> parseGraph(StringRef Text,
                                            StringRef BufferName) {
  return Parser(Text, BufferName).parse();
}

} // namespace sp
