//===- Printer.cpp - Textual IR printer -----------------------------------===//
#include "ir/AsmFormat.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringExtras.h"
#include <charconv>
#include <cstring>

using namespace llvm;

namespace sp {

namespace {

bool isIdentifier(StringRef S) {
  if (S.empty() || !(isAlpha(S[0]) || S[0] == '_'))
    return false;
  return llvm::all_of(S, [](char C) {
    return isAlnum(C) || C == '_' || C == '.';
  });
}

} // namespace

/// A string in the escapes the parser reads: \\, \", \n, \t, and \HH (two
/// hex digits) for other control characters. Bytes from 0x80 up are written
/// as they are, so UTF-8 names stay readable (raw_ostream::write_escaped
/// writes octal escapes, which the parser does not read).
void printQuoted(raw_ostream &OS, StringRef S) {
  OS << '"';
  for (unsigned char C : S) {
    if (C == '\\' || C == '"')
      OS << '\\' << C;
    else if (C == '\n')
      OS << "\\n";
    else if (C == '\t')
      OS << "\\t";
    else if (C < 0x20 || C == 0x7f)
      OS << '\\' << hexdigit(C >> 4) << hexdigit(C & 15);
    else
      OS << C;
  }
  OS << '"';
}

/// Shortest decimal that reads back to the same double, always marked as a
/// float (".0" appended to integral values).
template <typename T> static void printFloat(raw_ostream &OS, T V) {
  char Buf[64];
  auto R = std::to_chars(Buf, Buf + sizeof(Buf), V);
  StringRef S(Buf, R.ptr - Buf);
  OS << S;
  if (S.find_first_of(".eEn") == StringRef::npos) // "n" covers inf and nan
    OS << ".0";
}

void printAttribute(raw_ostream &OS, const Attribute &A) {
  if (auto *I = std::get_if<int64_t>(&A))
    OS << *I;
  else if (auto *F = std::get_if<double>(&A))
    printFloat(OS, *F);
  else if (auto *S = std::get_if<std::string>(&A))
    printQuoted(OS, *S);
  else if (auto *L = std::get_if<std::vector<int64_t>>(&A)) {
    OS << '[';
    interleaveComma(*L, OS);
    OS << ']';
  } else if (auto *FL = std::get_if<std::vector<double>>(&A)) {
    OS << '[';
    interleave(
        *FL, OS, [&](double D) { printFloat(OS, D); }, ", ");
    OS << ']';
  }
}

namespace {

class Printer {
public:
  Printer(const Graph &G, raw_ostream &OS) : G(G), OS(OS) {}

  void print() {
    OS << "graph @";
    printName(G.name());
    OS << " {\n";
    for (const auto &V : G.inputs()) {
      OS << "  input ";
      printLeafDecl(*V);
      OS << "\n";
    }
    for (const auto &V : G.params()) {
      OS << "  param ";
      printLeafDecl(*V);
      printPayload(*V);
      OS << "\n";
    }
    for (const auto &V : G.consts()) {
      OS << "  const ";
      printLeafDecl(*V);
      printPayload(*V);
      OS << "\n";
    }
    for (const auto &V : G.states()) {
      OS << "  state ";
      printLeafDecl(*V);
      OS << "\n";
    }
    for (const Node &N : G.nodes())
      printNode(N);
    for (const Graph::Output &O : G.outputs()) {
      OS << "  output ";
      printQuoted(OS, O.Name);
      OS << " = ";
      printRef(O.V);
      OS << "\n";
    }
    OS << "}\n";
  }

private:
  void printName(StringRef N) {
    if (isIdentifier(N))
      OS << N;
    else
      printQuoted(OS, N);
  }

  void printRef(const Value *V) {
    if (!V) {
      OS << "<null>";
      return;
    }
    if (V->isResult()) {
      auto It = Numbers.find(V);
      if (It == Numbers.end())
        OS << "%<undefined>";
      else
        OS << '%' << It->second;
      return;
    }
    OS << '%';
    printName(V->name());
  }

  void printType(const Value &V) {
    OS << " : " << V.type().str();
    if (V.sharding().K != Sharding::None)
      OS << ' ' << V.sharding().str();
  }

  void printLeafDecl(const Value &V) {
    printRef(&V);
    printType(V);
    if (V.inputRole() != InputRole::None)
      OS << " as " << inputRoleName(V.inputRole());
  }

  void printPayload(const Value &V) {
    const TensorData *D = V.data().get();
    if (!D)
      return;
    const DataRef &R = D->ref();
    OS << " = ";
    switch (R.K) {
    case DataRef::External:
      OS << "external(";
      printQuoted(OS, R.Path);
      OS << ", " << R.Offset << ", " << R.Length << ")";
      break;
    case DataRef::OnnxInitializer:
      OS << "onnx(";
      printQuoted(OS, R.Path);
      OS << ", ";
      printQuoted(OS, R.Key);
      OS << ")";
      break;
    case DataRef::Inline:
      printDense(*D);
      break;
    }
    // A sharded parameter references its whole source tensor.
    if (D->type() != V.type())
      OS << " : " << D->type().str();
  }

  void printElement(const TensorData &D, int64_t I) {
    switch (D.type().Dtype) {
    case DType::F32:
      printFloat(OS, D.as<float>()[I]);
      return;
    case DType::F64:
      printFloat(OS, D.as<double>()[I]);
      return;
    case DType::F16:
    case DType::BF16: // raw bits, so that the text is exact
      OS << D.as<uint16_t>()[I];
      return;
    default:
      OS << D.getInt(I);
      return;
    }
  }

  void printDense(const TensorData &D) {
    int64_t N = D.type().numElements();
    unsigned Size = dtypeSize(D.type().Dtype);
    ArrayRef<char> B = *D.load(); // inline data is always loaded
    bool Splat = N > 1;
    for (int64_t I = 1; I < N && Splat; ++I)
      Splat = std::memcmp(B.data(), B.data() + I * Size, Size) == 0;
    OS << "dense<";
    if (Splat) {
      OS << "splat ";
      printElement(D, 0);
    } else if (D.type().rank() == 0) {
      printElement(D, 0);
    } else {
      OS << '[';
      for (int64_t I = 0; I < N; ++I) {
        if (I)
          OS << ", ";
        printElement(D, I);
      }
      OS << ']';
    }
    OS << '>';
  }

  void printAttr(const Attribute &A) { printAttribute(OS, A); }

  void printNode(const Node &N) {
    OS << "  ";
    for (unsigned I = 0; I < N.numResults(); ++I) {
      if (I)
        OS << ", ";
      const Value *R = N.result(I);
      unsigned Id = Numbers.size();
      Numbers[R] = Id;
      OS << '%' << Id;
      printType(*R);
    }
    if (N.numResults())
      OS << " = ";
    OS << N.opName() << '(';
    for (unsigned I = 0; I < N.numOperands(); ++I) {
      if (I)
        OS << ", ";
      printRef(N.operand(I));
    }
    OS << ')';
    if (!N.attrs().empty()) {
      OS << " {";
      bool First = true;
      for (const auto &[Name, A] : N.attrs().entries()) {
        if (!First)
          OS << ", ";
        First = false;
        printName(Name);
        OS << " = ";
        printAttr(A);
      }
      OS << '}';
    }
    if (!N.name().empty()) {
      OS << " loc(";
      printQuoted(OS, N.name());
      OS << ')';
    }
    const Tags &T = N.tags();
    SmallVector<std::string, 4> Parts;
    if (T.Layer >= 0)
      Parts.push_back("layer = " + std::to_string(T.Layer));
    if (T.Role != Role::None) {
      std::string S;
      raw_string_ostream SOS(S);
      SOS << "role = ";
      printQuotedTo(SOS, roleName(T.Role));
      Parts.push_back(SOS.str());
    }
    if (T.Ph != Phase::Forward)
      Parts.push_back("phase = " + phaseName(T.Ph).str());
    if (T.Stage >= 0)
      Parts.push_back("stage = " + std::to_string(T.Stage));
    if (!Parts.empty()) {
      OS << " [";
      interleaveComma(Parts, OS);
      OS << ']';
    }
    OS << '\n';
  }

  static void printQuotedTo(raw_ostream &OS, StringRef S) {
    printQuoted(OS, S);
  }

  const Graph &G;
  raw_ostream &OS;
  DenseMap<const Value *, unsigned> Numbers;
};

} // namespace

void printGraph(const Graph &G, raw_ostream &OS) { Printer(G, OS).print(); }

std::string graphToString(const Graph &G) {
  std::string S;
  raw_string_ostream OS(S);
  printGraph(G, OS);
  return OS.str();
}

} // namespace sp
