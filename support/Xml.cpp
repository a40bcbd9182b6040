//===- Xml.cpp - Writing XML (SVG, HTML fragments) ------------------------===//
//
// See Xml.h.
//
//===----------------------------------------------------------------------===//
#include "support/Xml.h"
#include "support/Format.h"
#include <cassert>

using namespace llvm;

namespace sp {

void writeXmlEscaped(raw_ostream &OS, StringRef S) {
  size_t Start = 0;
  for (size_t I = 0; I < S.size(); ++I) {
    const char *Entity = nullptr;
    switch (S[I]) {
    case '&':
      Entity = "&amp;";
      break;
    case '<':
      Entity = "&lt;";
      break;
    case '>':
      Entity = "&gt;";
      break;
    case '"':
      Entity = "&quot;";
      break;
    case '\'':
      Entity = "&#39;";
      break;
    default:
      continue;
    }
    OS << S.slice(Start, I) << Entity;
    Start = I + 1;
  }
  OS << S.substr(Start);
}

std::string xmlEscape(StringRef S) {
  if (S.find_first_of("&<>\"'") == StringRef::npos)
    return S.str();
  std::string R;
  R.reserve(S.size() + 16);
  raw_string_ostream OS(R);
  writeXmlEscaped(OS, S);
  return OS.str();
}

XmlAttr::XmlAttr(StringRef Name, double Value, int Decimals)
    : Name(Name.str()), Value(Decimals < 0 ? shortNumber(Value)
                                           : fixedNumber(Value, Decimals)) {}

void XmlWriter::startTag(StringRef Tag, ArrayRef<XmlAttr> Attrs) {
  OS << '<' << Tag;
  for (const XmlAttr &A : Attrs) {
    OS << ' ' << A.Name << "=\"";
    writeXmlEscaped(OS, A.Value);
    OS << '"';
  }
}

XmlWriter &XmlWriter::open(StringRef Tag, ArrayRef<XmlAttr> Attrs) {
  startTag(Tag, Attrs);
  OS << '>';
  endLine();
  Open.push_back(Tag.str());
  return *this;
}

XmlWriter &XmlWriter::close() {
  assert(!Open.empty() && "close() without an element open");
  OS << "</" << Open.back() << '>';
  endLine();
  Open.pop_back();
  return *this;
}

XmlWriter &XmlWriter::closeAll() {
  while (!Open.empty())
    close();
  return *this;
}

XmlWriter &XmlWriter::leaf(StringRef Tag, ArrayRef<XmlAttr> Attrs) {
  startTag(Tag, Attrs);
  OS << "/>";
  endLine();
  return *this;
}

XmlWriter &XmlWriter::textElement(StringRef Tag, ArrayRef<XmlAttr> Attrs,
                                  StringRef Text) {
  startTag(Tag, Attrs);
  OS << '>';
  writeXmlEscaped(OS, Text);
  OS << "</" << Tag << '>';
  endLine();
  return *this;
}

XmlWriter &XmlWriter::text(StringRef Text) {
  writeXmlEscaped(OS, Text);
  return *this;
}

XmlWriter &XmlWriter::raw(StringRef Markup) {
  OS << Markup;
  return *this;
}

} // namespace sp
