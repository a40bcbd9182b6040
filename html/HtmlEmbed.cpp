//===- HtmlEmbed.cpp - Text and charts made safe for the page ---------------===//
//
// escapeHtml (the repository's one escaper, support/Xml.h) and inlineSvg:
// a chart drawn elsewhere embedded only if it holds nothing but drawing
// elements (html/HtmlReport.h says what is refused).
//
//===----------------------------------------------------------------------===//
#include "html/HtmlReport.h"
#include "plan/AtomicFile.h"
#include "support/Format.h"
#include "support/Xml.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include <algorithm>
#include <cmath>

using namespace llvm;

namespace sp {

std::string escapeHtml(StringRef S) { return xmlEscape(S); }

static bool isNameChar(char C) {
  return isAlnum(C) || C == ':' || C == '-' || C == '_' || C == '.';
}

static bool isDrawingElement(StringRef Name) {
  static const char *const Allowed[] = {
      "svg",    "g",       "rect", "line",  "polyline", "polygon", "path",
      "circle", "ellipse", "text", "tspan", "title",    "desc"};
  return is_contained(Allowed, Name);
}

Expected<std::string> inlineSvg(StringRef Svg, StringRef Id, StringRef Label) {
  auto Bad = [](const Twine &What) {
    return createStringError(inconvertibleErrorCode(), "it holds " + What);
  };
  StringRef S = Svg.trim();
  if (S.startswith("<?xml")) {
    size_t End = S.find("?>");
    if (End == StringRef::npos)
      return Bad("an unterminated XML declaration");
    S = S.drop_front(End + 2).ltrim();
  }
  if (!S.startswith("<svg"))
    return createStringError(inconvertibleErrorCode(),
                             "it is not an SVG document (no <svg> element "
                             "first)");
  std::string Out;
  std::vector<StringRef> Open;
  bool Closed = false;
  size_t I = 0;
  while (I < S.size()) {
    size_t Lt = S.find('<', I);
    StringRef Text = S.slice(I, Lt);
    if (Closed && !Text.trim().empty())
      return Bad("text after </svg>");
    Out += Text; // XML text: entities stay entities, and it has no '<'
    if (Lt == StringRef::npos)
      break;
    if (Closed)
      return Bad("an element after </svg>");
    if (S.substr(Lt).startswith("<!") || S.substr(Lt).startswith("<?"))
      return Bad("a comment, CDATA section, declaration or processing "
                 "instruction");
    bool EndTag = Lt + 1 < S.size() && S[Lt + 1] == '/';
    size_t P = Lt + 1 + EndTag, NameEnd = P;
    while (NameEnd < S.size() && isNameChar(S[NameEnd]))
      ++NameEnd;
    StringRef Name = S.slice(P, NameEnd);
    if (!isDrawingElement(Name))
      return Bad(Name.empty() ? Twine("a malformed tag")
                              : "a <" + Name + "> element");
    bool Root = Open.empty() && !EndTag;
    std::string Tag = "<" + std::string(EndTag ? "/" : "") + Name.str();
    if (Root)
      Tag += " id=\"" + escapeHtml(Id) +
             "\" class=\"chart\" role=\"img\" "
             "aria-label=\"" +
             escapeHtml(Label) + "\"";
    size_t Q = NameEnd;
    bool SelfClosing = false, Ended = false;
    while (Q < S.size()) {
      while (Q < S.size() && isSpace(S[Q]))
        ++Q;
      if (Q < S.size() && S[Q] == '>') {
        ++Q;
        Ended = true;
        break;
      }
      if (S.substr(Q).startswith("/>") && !EndTag) {
        Q += 2;
        SelfClosing = Ended = true;
        break;
      }
      size_t AttrEnd = Q;
      while (AttrEnd < S.size() && isNameChar(S[AttrEnd]))
        ++AttrEnd;
      StringRef Attr = S.slice(Q, AttrEnd);
      if (Attr.empty() || EndTag)
        return Bad("a malformed <" + Name + "> tag");
      Q = AttrEnd;
      while (Q < S.size() && isSpace(S[Q]))
        ++Q;
      if (Q >= S.size() || S[Q] != '=')
        return Bad("an attribute without a value (" + Attr + ")");
      ++Q;
      while (Q < S.size() && isSpace(S[Q]))
        ++Q;
      if (Q >= S.size() || (S[Q] != '"' && S[Q] != '\''))
        return Bad("an unquoted attribute (" + Attr + ")");
      char Quote = S[Q];
      size_t ValueEnd = S.find(Quote, Q + 1);
      if (ValueEnd == StringRef::npos)
        return Bad("an unterminated attribute (" + Attr + ")");
      StringRef Value = S.slice(Q + 1, ValueEnd);
      Q = ValueEnd + 1;
      std::string Lower = Attr.lower(), LowerValue = Value.lower();
      if (StringRef(Lower).startswith("xmlns"))
        continue; // HTML puts <svg> in the SVG namespace itself
      if (StringRef(Lower).startswith("on"))
        return Bad("an event handler (" + Attr + ")");
      if (StringRef(Lower).contains("href") || Lower == "src")
        return Bad("a reference (" + Attr + ")");
      if (StringRef(LowerValue).contains("url(") ||
          StringRef(LowerValue).contains("://") ||
          StringRef(LowerValue).contains("javascript:"))
        return Bad("a URL in " + Attr);
      if (Root && (Lower == "id" || Lower == "class" || Lower == "role" ||
                   Lower == "aria-label"))
        continue; // the page's own
      Tag += " " + Attr.str() + "=" + Quote + Value.str() + Quote;
    }
    if (!Ended)
      return Bad("an unterminated <" + Name + "> tag");
    Tag += SelfClosing ? "/>" : ">";
    Out += Tag;
    I = Q;
    if (EndTag) {
      if (Open.empty() || Open.back() != Name)
        return Bad("a </" + Name + "> where </" +
                   (Open.empty() ? StringRef("svg") : Open.back()) +
                   "> belongs");
      Open.pop_back();
      Closed = Open.empty();
    } else if (!SelfClosing) {
      Open.push_back(Name);
    } else if (Root) {
      Closed = true;
    }
  }
  if (!Closed)
    return Bad("an unterminated <svg> element");
  return Out;
}

} // namespace sp
