//===- Xml.h - Writing XML (SVG, HTML fragments) ----------------*- C++ -*-===//
//
// The one XML writer of the repository: the charts (loss.svg, the memory
// and Gantt charts), the report page's inline bars and every other piece of
// markup are written through it, so escaping and number formatting are done
// one way. An XmlWriter writes to a raw_ostream as it goes: elements are
// opened and closed in order (open/close, or leaf and textElement for an
// element without children), attribute values and text are escaped, and
// raw() inserts markup made elsewhere (an already-written chart).
//
//   XmlWriter W(OS);
//   W.open("svg", {{"width", 640}, {"height", 400}});
//   W.textElement("text", {{"x", 12.5, 1}, {"y", 24}}, "loss <total>");
//   W.close();
//
// writes, one element a line (setNewLines(false) writes them run
// together):
//
//   <svg width="640" height="400">
//   <text x="12.5" y="24">loss &lt;total&gt;</text>
//   </svg>
//
//===----------------------------------------------------------------------===//
#ifndef SP_SUPPORT_XML_H
#define SP_SUPPORT_XML_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/raw_ostream.h"
#include <cstdint>
#include <string>
#include <vector>

namespace sp {

/// S with &, <, >, " and ' replaced by their entities: safe as XML or HTML
/// text and as a quoted attribute value.
std::string xmlEscape(llvm::StringRef S);
void writeXmlEscaped(llvm::raw_ostream &OS, llvm::StringRef S);

/// One attribute, its value as text (escaped when written). Numbers: an
/// integer as is; a double with Decimals digits after the point (as
/// formatv's "{0:F<Decimals>}"; 2, formatv's "{0}", by default), or with
/// Decimals < 0 in at most four significant digits (shortNumber).
struct XmlAttr {
  XmlAttr(llvm::StringRef Name, llvm::StringRef Value)
      : Name(Name.str()), Value(Value.str()) {}
  XmlAttr(llvm::StringRef Name, const char *Value)
      : Name(Name.str()), Value(Value) {}
  XmlAttr(llvm::StringRef Name, const std::string &Value)
      : Name(Name.str()), Value(Value) {}
  XmlAttr(llvm::StringRef Name, int Value)
      : Name(Name.str()), Value(std::to_string(Value)) {}
  XmlAttr(llvm::StringRef Name, int64_t Value)
      : Name(Name.str()), Value(std::to_string(Value)) {}
  XmlAttr(llvm::StringRef Name, double Value, int Decimals = 2);
  std::string Name, Value;
};

class XmlWriter {
public:
  explicit XmlWriter(llvm::raw_ostream &OS) : OS(OS) {}
  XmlWriter(const XmlWriter &) = delete;
  XmlWriter &operator=(const XmlWriter &) = delete;

  /// <Tag Attrs...>; its children follow, then close().
  XmlWriter &open(llvm::StringRef Tag, llvm::ArrayRef<XmlAttr> Attrs = {});
  /// </Tag> of the innermost element open.
  XmlWriter &close();
  /// Closes every element still open.
  XmlWriter &closeAll();
  /// <Tag Attrs.../>.
  XmlWriter &leaf(llvm::StringRef Tag, llvm::ArrayRef<XmlAttr> Attrs = {});
  /// <Tag Attrs...>Text</Tag>, Text escaped.
  XmlWriter &textElement(llvm::StringRef Tag, llvm::ArrayRef<XmlAttr> Attrs,
                         llvm::StringRef Text);
  /// Text (escaped) inside the element open.
  XmlWriter &text(llvm::StringRef Text);
  /// Markup written as is (the caller vouches for it).
  XmlWriter &raw(llvm::StringRef Markup);

  /// Whether a newline follows every tag that opens, closes or is an
  /// element of its own (on by default).
  XmlWriter &setNewLines(bool On) {
    NewLines = On;
    return *this;
  }
  /// The elements open.
  size_t depth() const { return Open.size(); }

private:
  void startTag(llvm::StringRef Tag, llvm::ArrayRef<XmlAttr> Attrs);
  void endLine() {
    if (NewLines)
      OS << '\n';
  }
  llvm::raw_ostream &OS;
  std::vector<std::string> Open;
  bool NewLines = true;
};

} // namespace sp

#endif // SP_SUPPORT_XML_H
