//===- ProgramPrinter.cpp - A program as text -----------------------------===//
#include "plan/ProgramPrinter.h"
#include "ir/AsmFormat.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"

using namespace llvm;

namespace sp {

namespace {

class Printer {
public:
  Printer(const Program &P, raw_ostream &OS) : P(P), OS(OS) {}

  void print() {
    OS << "program {\n";
    for (const ProgramBuffer &B : P.Buffers)
      if (B.isPersistent())
        printDecl(B);
    size_t NextTemplate = 0;
    for (size_t K = 0; K < P.Instrs.size(); ++K) {
      for (; NextTemplate < P.Templates.size() &&
             P.Templates[NextTemplate].Begin == int(K);
           ++NextTemplate) {
        const ProgramTemplate &T = P.Templates[NextTemplate];
        OS << "  // template " << templateKindName(T.Kind);
        if (T.Chunk >= 0)
          OS << ", chunk " << T.Chunk;
        OS << "\n";
      }
      printInstr(P.Instrs[K]);
    }
    for (const auto &[Name, Id] : P.Outputs) {
      OS << "  output ";
      printQuoted(Name);
      OS << " = ";
      printRef(Id);
      OS << "\n";
    }
    OS << "}\n";
  }

private:
  static std::string quoted(StringRef S) {
    std::string Q;
    raw_string_ostream QS(Q);
    sp::printQuoted(QS, S);
    return Q;
  }
  void printQuoted(StringRef S) { sp::printQuoted(OS, S); }

  /// A buffer: a temporary's name is "%N" already.
  std::string ref(int Id) const {
    if (Id < 0 || size_t(Id) >= P.Buffers.size())
      return "%<bad buffer " + std::to_string(Id) + ">";
    const std::string &Name = P.Buffers[Id].Name;
    return StringRef(Name).startswith("%") ? Name : "%" + Name;
  }
  void printRef(int Id) { OS << ref(Id); }

  void printTyped(int Id) {
    printRef(Id);
    if (Id < 0 || size_t(Id) >= P.Buffers.size())
      return;
    const ProgramBuffer &B = P.Buffers[Id];
    OS << " : " << B.Type.str();
    if (B.Shard.K != Sharding::None)
      OS << ' ' << B.Shard.str();
  }

  void printDecl(const ProgramBuffer &B) {
    OS << "  " << bufferKindName(B.K) << ' ';
    printTyped(&B - P.Buffers.data());
    if (B.K == ProgramBuffer::Input && B.Feed != InputRole::None)
      OS << " as " << inputRoleName(B.Feed);
    OS << "\n";
  }

  void printAttr(const Attribute &A) { printAttribute(OS, A); }


  void printInstr(const Instruction &I) {
    OS << "  ";
    interleaveComma(I.Out, OS, [&](int Id) { printTyped(Id); });
    if (!I.Out.empty())
      OS << " = ";
    OS << opName(I.Op) << '(';
    interleaveComma(I.In, OS, [&](int Id) { printRef(Id); });
    OS << ')';
    if (!I.Attrs.empty()) {
      OS << " {";
      interleaveComma(I.Attrs.entries(), OS, [&](const AttrList::Entry &E) {
        OS << E.first << " = ";
        printAttr(E.second);
      });
      OS << '}';
    }
    if (!I.Name.empty()) {
      OS << " loc(";
      printQuoted(I.Name);
      OS << ')';
    }
    SmallVector<std::string, 4> Tags;
    if (I.Layer >= 0)
      Tags.push_back("layer = " + std::to_string(I.Layer));
    if (I.Role != Role::None)
      Tags.push_back("role = " + quoted(roleName(I.Role)));
    if (I.Ph != Phase::Forward)
      Tags.push_back("phase = " + phaseName(I.Ph).str());
    if (I.Beside >= 0 && size_t(I.Beside) < P.Instrs.size() &&
        !P.Instrs[I.Beside].Out.empty())
      Tags.push_back("beside = " + ref(P.Instrs[I.Beside].Out[0]));
    if (!Tags.empty()) {
      OS << " [";
      interleaveComma(Tags, OS);
      OS << ']';
    }
    OS << '\n';
  }

  const Program &P;
  raw_ostream &OS;
};

} // namespace

void printProgram(const Program &P, raw_ostream &OS) {
  Printer(P, OS).print();
}

} // namespace sp
