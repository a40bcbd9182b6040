//===- HtmlReport.cpp - One self-contained report page --------------------===//
//
// The page is assembled from sections, each a string of HTML built from the
// facts through a few helpers: the JSON readers (which return nothing for a
// missing or mistyped entry), key-value and column tables (numbers right
// aligned, with their raw value for sorting), and small inline bars (an SVG
// of one value against the largest of its table, with a tick at a reference
// value such as the formula's). The charts the callers drew are checked and
// embedded by inlineSvg. The table of contents lists the sections present.
//
//===----------------------------------------------------------------------===//
#include "reports/HtmlReport.h"
#include "plan/AtomicFile.h"
#include "support/Format.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include <algorithm>
#include <cmath>

using namespace llvm;
using json = nlohmann::json;

namespace sp {

std::string escapeHtml(StringRef S) {
  std::string Out;
  Out.reserve(S.size());
  for (char C : S) {
    switch (C) {
    case '&':
      Out += "&amp;";
      break;
    case '<':
      Out += "&lt;";
      break;
    case '>':
      Out += "&gt;";
      break;
    case '"':
      Out += "&quot;";
      break;
    case '\'':
      Out += "&#39;";
      break;
    default:
      Out += C;
    }
  }
  return Out;
}

//===----------------------------------------------------------------------===//
// Embedding SVG
//===----------------------------------------------------------------------===//

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

//===----------------------------------------------------------------------===//
// Reading the facts
//===----------------------------------------------------------------------===//

namespace {

/// J[Key] when J is an object that has it, else null.
const json *get(const json *J, StringRef Key) {
  if (!J || !J->is_object())
    return nullptr;
  auto It = J->find(Key.str());
  return It == J->end() ? nullptr : &*It;
}
const json *get(const json *J, StringRef K1, StringRef K2) {
  return get(get(J, K1), K2);
}
std::optional<double> num(const json *J) {
  if (J && J->is_number())
    return J->get<double>();
  return std::nullopt;
}
std::optional<int64_t> integer(const json *J) {
  if (J && J->is_number_integer())
    return J->get<int64_t>();
  if (J && J->is_number_float() && std::isfinite(J->get<double>()) &&
      J->get<double>() == std::floor(J->get<double>()) &&
      std::abs(J->get<double>()) < 9e15)
    return int64_t(J->get<double>());
  return std::nullopt;
}
std::optional<bool> flag(const json *J) {
  if (J && J->is_boolean())
    return J->get<bool>();
  if (J && J->is_number_integer())
    return J->get<int64_t>() != 0;
  return std::nullopt;
}
std::string str(const json *J) {
  return J && J->is_string() ? J->get<std::string>() : std::string();
}
const json *array(const json *J) { return J && J->is_array() ? J : nullptr; }

//===----------------------------------------------------------------------===//
// Formatting
//===----------------------------------------------------------------------===//

std::string esc(StringRef S) { return escapeHtml(S); }

/// snprintf into a string (numbers only, so 64 bytes hold them).
template <typename... Ts> std::string cformat(const char *Fmt, Ts... Args) {
  char Buf[64];
  std::snprintf(Buf, sizeof(Buf), Fmt, Args...);
  return Buf;
}

std::string thousands(int64_t N) {
  std::string D = std::to_string(N < 0 ? 0 - uint64_t(N) : uint64_t(N)), Out;
  for (size_t I = 0; I < D.size(); ++I) {
    if (I && (D.size() - I) % 3 == 0)
      Out += ',';
    Out += D[I];
  }
  return (N < 0 ? "-" : "") + Out;
}

std::string bytesText(double B) { return humanBytes(B); }

/// Three significant digits with an SI prefix: "805 MFLOP".
std::string siText(double V, StringRef Unit) {
  const char *Prefixes[] = {"", "k", "M", "G", "T", "P", "E", "Z"};
  unsigned K = 0;
  double A = std::abs(V);
  while (A >= 999.5 && K + 1 < std::size(Prefixes)) {
    A /= 1000;
    V /= 1000;
    ++K;
  }
  int Digits = A >= 99.95 ? 0 : A >= 9.995 ? 1 : 2;
  return cformat("%.*f", Digits, V) + " " + Prefixes[K] + Unit.str();
}

/// A relative difference in percent, "-0.00%" printed as "0.00%".
std::string diffText(double Percent, const char *Fmt = "%.2f%%") {
  if (std::abs(Percent) < 0.005)
    Percent = 0;
  return cformat(Fmt, Percent);
}

std::string percentText(double Fraction, int Digits = 1) {
  return cformat("%.*f%%", Digits, 100 * Fraction);
}

std::string lossText(double L) {
  return std::isfinite(L) ? cformat("%.4f", L) : "&mdash;";
}

const char *const Dash = "&mdash;";

/// An inline bar: Value against Max, and a tick at Tick (e.g. the formula).
std::string bar(double Value, double Max, std::optional<double> Tick,
                StringRef Colour, StringRef Label) {
  const double W = 140, H = 12;
  auto X = [&](double V) {
    return Max > 0 ? std::clamp(V / Max, 0.0, 1.0) * W : 0.0;
  };
  std::string S = formatv("<svg class=\"bar\" width=\"{0}\" height=\"{1}\" "
                          "viewBox=\"0 0 {0} {1}\" role=\"img\" "
                          "aria-label=\"{2}\"><rect width=\"{0}\" "
                          "height=\"{1}\" fill=\"#eef1f5\"/>",
                          W, H, esc(Label))
                      .str();
  if (std::isfinite(Value) && Value > 0)
    S += formatv("<rect width=\"{0:F1}\" height=\"{1}\" fill=\"{2}\"/>",
                 std::max(X(Value), 1.0), H, Colour)
             .str();
  if (Tick && std::isfinite(*Tick))
    S += formatv("<line x1=\"{0:F1}\" x2=\"{0:F1}\" y1=\"0\" y2=\"{1}\" "
                 "stroke=\"#1d2330\" stroke-width=\"2\"/>",
                 std::clamp(X(*Tick), 1.0, W - 1), H)
             .str();
  return S + "</svg>";
}

const char *const PlanColour = "#4c78a8";
const char *const MeasuredColour = "#f58518";
const char *const CommColour = "#e45756";

struct Cell {
  std::string Html;
  std::optional<double> Sort; // sorted by this value
  bool Number = false;        // right-aligned
};
Cell text(StringRef S) { return {esc(S), std::nullopt}; }
Cell html(std::string H) { return {std::move(H), std::nullopt}; }
Cell number(double V, std::string Shown) { return {esc(Shown), V, true}; }
/// A row's label that sorts by Key ("layer 3", "outside the layers").
Cell label(double Key, std::string Html) { return {std::move(Html), Key}; }
Cell bytes(double V) { return number(V, bytesText(V)); }
Cell none() { return {Dash, std::nullopt}; }
/// No value in a column of numbers.
Cell noNumber() { return {Dash, std::nullopt, true}; }

/// A table of columns; Sortable ones get the script's sorting.
class Table {
public:
  Table(std::vector<std::string> Headers, bool Sortable = false)
      : Headers(std::move(Headers)), Sortable(Sortable) {}
  void row(std::vector<Cell> Cells, StringRef Class = "") {
    Rows.push_back({std::move(Cells), Class.str()});
  }
  void footer(std::vector<Cell> Cells) {
    Foot.push_back({std::move(Cells), ""});
  }
  bool empty() const { return Rows.empty(); }
  std::string str() const {
    std::string S = Sortable ? "<table class=\"sortable\">" : "<table>";
    S += "<thead><tr>";
    for (size_t I = 0; I < Headers.size(); ++I) {
      // A column of numbers has its header over them, on the right.
      bool Right =
          !Rows.empty() && I < Rows[0].Cells.size() && Rows[0].Cells[I].Number;
      S += std::string(Right ? "<th scope=\"col\" class=\"n\">"
                             : "<th scope=\"col\">") +
           esc(Headers[I]) + "</th>";
    }
    S += "</tr></thead><tbody>";
    for (const auto &R : Rows)
      S += rowHtml(R);
    S += "</tbody>";
    if (!Foot.empty()) {
      S += "<tfoot>";
      for (const auto &R : Foot)
        S += rowHtml(R);
      S += "</tfoot>";
    }
    return S + "</table>\n";
  }

private:
  struct Row {
    std::vector<Cell> Cells;
    std::string Class;
  };
  static std::string rowHtml(const Row &R) {
    std::string S =
        R.Class.empty() ? "<tr>" : "<tr class=\"" + esc(R.Class) + "\">";
    for (const Cell &C : R.Cells)
      S += C.Sort ? formatv("<td{0} data-v=\"{1}\">{2}</td>",
                            C.Number ? " class=\"n\"" : "",
                            cformat("%.17g", *C.Sort), C.Html)
                        .str()
                  : (C.Number ? "<td class=\"n\">" : "<td>") + C.Html + "</td>";
    return S + "</tr>";
  }
  std::vector<std::string> Headers;
  bool Sortable;
  std::vector<Row> Rows, Foot;
};

/// A two-column table of labelled facts; a row whose value is empty is
/// left out.
class Facts {
public:
  void add(StringRef Label, std::string ValueHtml, StringRef Note = "") {
    if (ValueHtml.empty())
      return;
    Rows.push_back(
        {esc(Label), ValueHtml + (Note.empty() ? ""
                                               : " <span class=\"note\">" +
                                                     esc(Note) + "</span>")});
  }
  void addText(StringRef Label, StringRef Value, StringRef Note = "") {
    if (!Value.empty())
      add(Label, esc(Value), Note);
  }
  /// As a table, one fact a row.
  std::string str() const {
    if (Rows.empty())
      return "";
    std::string S = "<table class=\"kv\">";
    for (auto &[Label, Value] : Rows)
      S +=
          "<tr><th scope=\"row\">" + Label + "</th><td>" + Value + "</td></tr>";
    return S + "</table>\n";
  }
  /// As a grid of short facts, each label above its value.
  std::string grid() const {
    if (Rows.empty())
      return "";
    std::string S = "<dl class=\"grid\">";
    for (auto &[Label, Value] : Rows)
      S += "<div><dt>" + Label + "</dt><dd>" + Value + "</dd></div>";
    return S + "</dl>\n";
  }

private:
  std::vector<std::pair<std::string, std::string>> Rows; // HTML
};

std::string optBytes(const json *J) {
  auto V = num(J);
  return V ? esc(bytesText(*V)) : "";
}
std::string optCount(const json *J) {
  auto V = integer(J);
  return V ? esc(thousands(*V)) : "";
}
std::string yesNo(std::optional<bool> B) {
  return B ? (*B ? "yes" : "no") : "";
}

std::string figure(const ReportChart &C, StringRef Id, StringRef Label) {
  auto Svg = inlineSvg(C.Svg, Id, Label);
  if (!Svg)
    return "<p class=\"note\">The " + esc(Label) +
           " is left out: " + esc(toString(Svg.takeError())) + ".</p>\n";
  return "<figure>" + *Svg +
         (C.Caption.empty()
              ? ""
              : "<figcaption>" + esc(C.Caption) + "</figcaption>") +
         "</figure>\n";
}

struct Section {
  std::string Id, Title, Html;
};

/// Blocks side by side while the page is wide enough (empty ones left out).
std::string side(std::vector<std::string> Blocks) {
  std::string S;
  for (const std::string &B : Blocks)
    if (!B.empty())
      S += "<div>" + B + "</div>";
  return S.empty() ? S : "<div class=\"side\">" + S + "</div>\n";
}

//===----------------------------------------------------------------------===//
// The sections
//===----------------------------------------------------------------------===//

bool pipelined(const json &F) {
  const json *Par = get(&F, "parallel");
  return get(&F, "bubble") || integer(get(Par, "pp")).value_or(1) > 1 ||
         integer(get(Par, "microbatches")).value_or(1) > 1 ||
         integer(get(Par, "interleave")).value_or(1) > 1;
}

/// "none in 2 layers", "full in 1 layer, none in 3 layers".
std::string recomputeSummary(const json &F) {
  const json *Kinds = array(get(&F, "memory", "layer_recompute"));
  if (!Kinds)
    return "";
  std::map<std::string, int> N;
  for (const json &K : *Kinds)
    ++N[K.is_string() ? K.get<std::string>() : "?"];
  std::string S;
  for (auto &[Kind, Count] : N)
    S += (S.empty() ? "" : ", ") +
         formatv("{0} in {1} layer{2}", Kind, Count, Count == 1 ? "" : "s")
             .str();
  return S;
}

Section optionsSection(const ReportPage &P) {
  const json &F = P.Facts;
  const json *Par = get(&F, "parallel");
  Facts T;
  auto Int = [&](StringRef Key) {
    auto V = integer(get(Par, Key));
    if (!V)
      V = integer(get(&F, Key)); // a manifest's top-level copy
    return V ? std::to_string(*V) : std::string();
  };
  T.addText("tensor parallel t", Int("tp"));
  std::optional<bool> SP = flag(get(Par, "sp"));
  if (!SP)
    SP = flag(get(&F, "sp"));
  T.addText("sequence parallel", yesNo(SP));
  T.addText("pipeline stages p", Int("pp"));
  T.addText("model chunks per rank", Int("interleave"));
  T.addText("microbatches per step", Int("microbatches"));
  std::string Schedule = str(get(&F, "bubble", "schedule"));
  if (Schedule.empty())
    Schedule = str(get(&F, "schedule"));
  if (pipelined(F))
    T.addText("schedule", Schedule);
  T.addText("data-parallel replicas d", Int("dp"));
  if (auto Z = integer(get(Par, "zero")))
    T.addText("ZeRO stage", std::to_string(*Z));
  T.addText("recomputation", recomputeSummary(F));
  std::string Dtype = str(get(&F, "plan", "dtype"));
  T.addText("activation dtype", Dtype.empty() ? str(get(&F, "dtype")) : Dtype);
  if (const json *LS = get(&F, "loss_scale"))
    T.addText("initial loss scale", optCount(get(LS, "initial")));
  T.addText("source model", str(get(&F, "source")));
  std::string Run;
  if (!P.RunSettings.empty()) {
    Facts R;
    for (auto &[K, V] : P.RunSettings)
      R.addText(K, V);
    Run = "<h3>The run</h3>" + R.grid();
  }
  std::string H = (Run.empty() ? "" : "<h3>The plan</h3>") + T.grid() + Run;
  if (!P.CommandLine.empty())
    H += "<p>Command:</p><pre class=\"cmd\">" + esc(P.CommandLine) + "</pre>\n";
  return {"options", "Options", H};
}

/// Consecutive layers with the same roles, as "layers 0-11".
std::string layerStructure(const json *Layers) {
  if (!array(Layers))
    return "";
  std::vector<std::vector<std::string>> Roles;
  for (const json &L : *Layers) {
    Roles.emplace_back();
    if (const json *R = array(get(&L, "roles")))
      for (const json &Role : *R)
        Roles.back().push_back(Role.is_string() ? Role.get<std::string>()
                                                : "?");
  }
  Table T({"layers", "roles in program order"});
  for (size_t First = 0, Last; First < Roles.size(); First = Last + 1) {
    Last = First;
    while (Last + 1 < Roles.size() && Roles[Last + 1] == Roles[First])
      ++Last;
    T.row({text(First == Last ? formatv("layer {0}", First).str()
                              : formatv("layers {0}-{1}", First, Last).str()),
           text(join(Roles[First], " "))});
  }
  return T.str();
}

Section modelSection(const ReportPage &P) {
  const json *M = get(&P.Facts, "model"), *St = get(&P.Facts, "structure");
  Facts T;
  std::string Family = str(get(M, "family"));
  static const std::map<std::string, std::string> Families = {
      {"gpt", "GPT-style decoder (pre-norm LayerNorm, fused QKV)"},
      {"llama", "Llama-style decoder (RMSNorm, rotary, gated MLP)"},
      {"bert", "BERT-style post-norm encoder"}};
  auto It = Families.find(Family);
  T.addText("family", It != Families.end() ? It->second : Family);
  T.add("layers", optCount(get(M, "layers")));
  T.add("hidden size h", optCount(get(M, "hidden")));
  auto Heads = integer(get(M, "heads")), Kv = integer(get(M, "kv_heads")),
       Hidden = integer(get(M, "hidden"));
  if (Heads)
    T.add("attention heads a", esc(thousands(*Heads)),
          Hidden && *Heads > 0
              ? formatv("head size {0}", *Hidden / *Heads).str()
              : "");
  if (Kv)
    T.add("key/value heads", esc(thousands(*Kv)),
          Heads && *Kv != *Heads ? "grouped-query attention" : "");
  T.add("MLP width", optCount(get(M, "ffn")));
  T.add("sequence s", optCount(get(M, "seq")));
  T.add("vocabulary v", optCount(get(M, "vocab")));
  T.add("batch b (per microbatch)", optCount(get(M, "batch")));
  if (auto Params = num(get(M, "params")))
    T.add("parameters", esc(thousands(int64_t(*Params))),
          siText(*Params, "") + (flag(get(M, "tied")).value_or(false)
                                     ? "; input and output embeddings tied"
                                     : ""));
  T.addText("MLP activation", str(get(M, "activation")));
  std::string Attn;
  if (flag(get(M, "causal")).value_or(false))
    Attn = "causal";
  if (flag(get(M, "padding_mask")).value_or(false))
    Attn += std::string(Attn.empty() ? "" : ", ") + "padding mask";
  T.addText("attention", Attn);
  if (auto PN = flag(get(M, "post_norm")))
    T.addText("norm placement", *PN ? "post-norm" : "pre-norm");
  std::string H = T.grid();
  if (St) {
    Facts S;
    std::string Embed = "token";
    if (flag(get(St, "position_embedding")).value_or(false))
      Embed += " + position";
    if (flag(get(St, "token_type_embedding")).value_or(false))
      Embed += " + token type";
    if (flag(get(St, "embedding_norm")).value_or(false))
      Embed += ", then a norm";
    S.addText("embedding", Embed);
    S.addText("final norm", yesNo(flag(get(St, "final_norm"))));
    S.addText("head transform", yesNo(flag(get(St, "head_transform"))));
    S.addText("LM head", flag(get(M, "tied")).value_or(false)
                             ? "tied to the token embedding"
                             : "its own weight");
    H += "<h3>Recognised structure</h3>" + S.grid() +
         layerStructure(get(St, "layers"));
  }
  return {"model", "Model", H};
}

/// Each layer's stored bytes against the formula (for the layers recomputed
/// as the formula's layer is) and, for a run, what the rank measured.
std::string storedByLayer(const ReportPage &P, const json *Mem) {
  auto Layer = integer(get(Mem, "activation_layer"));
  auto FB = num(get(Mem, "formula", "bytes_per_layer"));
  const json *ByLayer = array(get(Mem, "stored_bytes_by_layer"));
  const json *Kinds = array(get(Mem, "layer_recompute"));
  std::string MidKind;
  if (Kinds && Layer && *Layer >= 0 && size_t(*Layer) < Kinds->size() &&
      (*Kinds)[*Layer].is_string())
    MidKind = (*Kinds)[*Layer].get<std::string>();
  if (!ByLayer)
    return "";
  std::vector<std::string> Cols = {
      "layer", "recompute", "stored (plan)", "formula", "plan vs formula", ""};
  if (P.Measured)
    Cols.insert(Cols.begin() + 3, "measured");
  double Max = 0;
  for (const json &L : *ByLayer)
    Max = std::max(Max, num(get(&L, "bytes")).value_or(0));
  if (FB)
    Max = std::max(Max, *FB);
  if (P.Measured)
    for (auto &[L, B] : P.Measured->StoredBytesByLayer)
      Max = std::max(Max, double(B));
  Table T(Cols, /*Sortable=*/true);
  for (const json &L : *ByLayer) {
    auto Index = integer(get(&L, "layer"));
    auto B = num(get(&L, "bytes"));
    if (!Index || !B)
      continue;
    std::string Kind;
    if (Kinds && *Index >= 0 && size_t(*Index) < Kinds->size() &&
        (*Kinds)[*Index].is_string())
      Kind = (*Kinds)[*Index].get<std::string>();
    bool Comparable = FB && *Index >= 0 && !MidKind.empty() && Kind == MidKind;
    std::vector<Cell> Row = {
        label(double(*Index), *Index < 0
                                  ? "outside the layers <span class=\"note\">"
                                    "(embedding, head, loss)</span>"
                                  : "layer " + std::to_string(*Index)),
        Kind.empty() ? none() : text(Kind),
        bytes(*B),
        Comparable ? bytes(*FB) : noNumber(),
        Comparable && *FB > 0
            ? number(100 * (*B - *FB) / *FB, diffText(100 * (*B - *FB) / *FB))
            : noNumber(),
        html(bar(
            *B, Max, Comparable ? FB : std::nullopt, PlanColour,
            formatv("layer {0}: {1} stored", *Index, bytesText(*B)).str()))};
    if (P.Measured) {
      auto It = P.Measured->StoredBytesByLayer.find(int(*Index));
      Row.insert(Row.begin() + 3,
                 It == P.Measured->StoredBytesByLayer.end()
                     ? Cell{"<span class=\"note\">another rank's</span>",
                            std::nullopt, true}
                     : bytes(double(It->second)));
    }
    T.row(std::move(Row));
  }
  return "<h3>Stored activations by layer</h3>" + T.str() +
         "<p class=\"note\">Bytes of one microbatch; the tick on a bar is "
         "the formula's bytes for a layer recomputed as layer " +
         (Layer ? std::to_string(*Layer) : std::string("?")) + " is." +
         (P.Measured ? " Measured: what " + esc(P.Measured->Rank) +
                           " stored in its last step, for the layers it "
                           "holds."
                     : std::string()) +
         " Click a column to sort.</p>\n";
}

/// The middle layer's stored bytes by the role of their first reader.
std::string storedByRole(const json *Mem) {
  auto Layer = integer(get(Mem, "activation_layer"));
  const json *Roles = get(Mem, "activation_bytes_per_layer_by_role");
  if (!Roles || !Roles->is_object() || Roles->empty())
    return "";
  double Max = 0;
  for (auto &[Role, B] : Roles->items())
    Max = std::max(Max, num(&B).value_or(0));
  Table T({"reader role", "stored", ""}, /*Sortable=*/true);
  for (auto &[Role, B] : Roles->items())
    if (auto V = num(&B))
      T.row({text(Role), bytes(*V),
             html(bar(*V, Max, std::nullopt, PlanColour,
                      Role + ": " + bytesText(*V)))});
  return "<h3>Layer " + (Layer ? std::to_string(*Layer) : std::string("?")) +
         " by the role of its first backward reader</h3>" + T.str();
}

Section memorySection(const ReportPage &P) {
  const json &F = P.Facts;
  const json *Mem = get(&F, "memory"), *Plan = get(&F, "plan");
  std::string H;
  if (!P.Memory.empty())
    H += figure(P.Memory, "chart-memory", "memory chart");

  Facts A;
  A.add("instructions", optCount(get(Plan, "instructions")));
  A.add("buffers", optCount(get(Plan, "buffers")));
  auto Arena = num(get(Plan, "arena_bytes")),
       Persistent = num(get(Plan, "persistent_bytes"));
  A.add("arena (rank 0)", optBytes(get(Plan, "arena_bytes")),
        "what the runtime allocates: the planned peak");
  A.add("persistent", optBytes(get(Plan, "persistent_bytes")),
        "parameters, optimizer state, inputs");
  if (Arena && Persistent)
    A.add("temporaries", esc(bytesText(*Arena - *Persistent)));
  A.add("peak live temporaries", optBytes(get(Plan, "peak_live_temp_bytes")));
  A.add("largest arena of any rank", optBytes(get(Mem, "peak_bytes_per_rank")));
  std::string PlanBlock = A.str().empty() ? "" : "<h3>The plan</h3>" + A.str();

  std::string StateBlock, StateNote;
  const json *MS = get(Mem, "model_state");
  if (MS) {
    Table T({"model state (rank 0)", "plan", "formula"});
    auto Row = [&](StringRef Label, const json *Plan, const json *Formula) {
      auto V = num(Plan);
      if (!V)
        return;
      auto Fm = num(Formula);
      T.row({text(Label), bytes(*V), Fm ? bytes(*Fm) : none()});
    };
    Row("parameters", get(Mem, "parameter_bytes"),
        get(MS, "formula_parameter_bytes"));
    Row("gradients", get(Mem, "gradient_bytes"),
        get(MS, "formula_gradient_bytes"));
    Row("AdamW moments", get(Mem, "optimizer_state_bytes"),
        get(MS, "formula_optimizer_state_bytes"));
    if (num(get(MS, "compute_copy_bytes")).value_or(0) > 0)
      Row("16-bit compute copies", get(MS, "compute_copy_bytes"),
          get(MS, "formula_compute_copy_bytes"));
    StateBlock = "<h3>Model state</h3>" + T.str();
    std::string Formula = str(get(MS, "formula"));
    if (!Formula.empty())
      StateNote = "<p class=\"note\">Psi = " + optCount(get(MS, "parameters")) +
                  " parameter elements on this rank: " + esc(Formula) +
                  ".</p>\n";
  }
  H += side({PlanBlock, StateBlock}) + StateNote;

  if (Mem) {
    Facts T;
    auto Layer = integer(get(Mem, "activation_layer"));
    T.add("stored per layer", optBytes(get(Mem, "activation_bytes_per_layer")),
          Layer ? formatv("layer {0}, one microbatch", *Layer).str() : "");
    const json *Fm = get(Mem, "formula");
    auto FB = num(get(Fm, "bytes_per_layer")),
         Got = num(get(Mem, "activation_bytes_per_layer"));
    if (FB)
      T.add("the " + str(get(Fm, "family")) + " formula", esc(bytesText(*FB)),
            Got && *FB > 0 ? "the plan is " +
                                 diffText(100 * (*Got - *FB) / *FB) + " from it"
                           : "");
    T.add("stored in all", optBytes(get(Mem, "stored_activation_bytes")),
          "one microbatch through every layer");
    T.add("first stage, whole step",
          optBytes(get(Mem, "first_stage_activation_bytes")),
          integer(get(Mem, "microbatches_in_flight"))
              ? formatv("{0} microbatch-chunks in flight",
                        *integer(get(Mem, "microbatches_in_flight")))
                    .str()
              : "");
    T.add("transient recomputation",
          optBytes(get(Mem, "recompute_transient_bytes")));
    T.addText("recomputation", recomputeSummary(F));
    H += "<h3>Stored activations</h3>" + T.str();
    std::string FText = str(get(Fm, "text"));
    if (!FText.empty())
      H += "<p class=\"note\">Formula (e bytes per element, masks 1 byte): "
           "<code>" +
           esc(FText) + "</code></p>\n";

    H += storedByLayer(P, Mem) + storedByRole(Mem);
  }
  if (H.empty())
    H = "<p class=\"note\">The facts hold no memory report.</p>\n";
  return {"memory", "Memory", H};
}

Section collectivesSection(const ReportPage &P) {
  const json *C = get(&P.Facts, "collectives");
  auto T = integer(get(&P.Facts, "parallel", "tp"));
  std::string H = formatv("<p>Bytes one rank sends per microbatch, ring "
                          "algorithms{0}. Regather is communication "
                          "recomputation: the backward all-gathers that "
                          "rebuild a saved sequence shard.</p>\n",
                          T ? formatv(", t = {0}", *T).str() : "")
                      .str();
  const json *Layers = array(get(C, "per_layer"));
  if (!Layers) {
    H += "<p class=\"note\">The facts hold no collective report.</p>\n";
    return {"collectives", "Collectives", H};
  }
  double Max = 0;
  for (const json &L : *Layers)
    Max = std::max(Max, num(get(&L, "forward_bytes")).value_or(0) +
                            num(get(&L, "backward_bytes")).value_or(0) +
                            num(get(&L, "regather_bytes")).value_or(0));
  Table Tab({"layer", "forward", "backward", "regather", "beside a GEMM",
             "total", ""},
            /*Sortable=*/true);
  for (const json &L : *Layers) {
    auto Index = integer(get(&L, "layer"));
    if (!Index)
      continue;
    double Fw = num(get(&L, "forward_bytes")).value_or(0),
           Bw = num(get(&L, "backward_bytes")).value_or(0),
           Rg = num(get(&L, "regather_bytes")).value_or(0),
           Ov = num(get(&L, "overlapped_bytes")).value_or(0);
    Tab.row({label(double(*Index),
                   *Index < 0 ? "outside the layers <span class=\"note\">"
                                "(embedding, head, gradient sums)</span>"
                              : "layer " + std::to_string(*Index)),
             bytes(Fw), bytes(Bw), bytes(Rg), bytes(Ov), bytes(Fw + Bw + Rg),
             html(bar(
                 Fw + Bw + Rg, Max, std::nullopt, CommColour,
                 formatv("layer {0}: {1} sent", *Index, bytesText(Fw + Bw + Rg))
                     .str()))});
  }
  double TF = num(get(C, "total_forward_bytes")).value_or(0),
         TB = num(get(C, "total_backward_bytes")).value_or(0),
         TR = num(get(C, "total_regather_bytes")).value_or(0),
         TO = num(get(C, "total_overlapped_bytes")).value_or(0);
  Tab.footer({text("all"), bytes(TF), bytes(TB), bytes(TR), bytes(TO),
              bytes(TF + TB + TR), text("")});
  H += Tab.str();
  std::string Calls = str(get(&P.Facts, "collective_calls"));
  if (!Calls.empty())
    H += "<details><summary>Each call of rank 0's program</summary><pre>" +
         esc(Calls) + "</pre></details>\n";
  return {"collectives", "Collectives", H};
}

Section pipelineSection(const ReportPage &P) {
  const json &F = P.Facts;
  const json *Par = get(&F, "parallel"), *Bubble = get(&F, "bubble"),
             *Mem = get(&F, "memory");
  Facts T;
  T.addText("schedule", str(get(Bubble, "schedule")).empty()
                            ? str(get(&F, "schedule"))
                            : str(get(Bubble, "schedule")));
  T.add("pipeline ranks p", optCount(get(Par, "pp")));
  T.add("model chunks per rank", optCount(get(Par, "interleave")));
  T.add("microbatches per step", optCount(get(Par, "microbatches")));
  if (auto S = num(get(Bubble, "simulated")))
    T.add("bubble (simulated)", esc(percentText(*S)),
          "of the ideal time, from each stage's GEMM work");
  if (auto O = num(get(Bubble, "one_f_one_b")))
    T.add("1F1B's (p - 1) / N", esc(percentText(*O)));
  T.add("microbatch-chunks in flight on the first stage",
        optCount(get(Mem, "microbatches_in_flight")));
  std::string H = T.str();
  const json *Arena = array(get(Mem, "stage_arena_bytes")),
             *Stored = array(get(Mem, "stage_activation_bytes"));
  if (Arena) {
    double Max = 0;
    for (const json &B : *Arena)
      Max = std::max(Max, num(&B).value_or(0));
    Table Tab({"pipeline rank", "arena", "stored activations (whole step)", ""},
              /*Sortable=*/true);
    for (size_t K = 0; K < Arena->size(); ++K) {
      auto A = num(&(*Arena)[K]);
      if (!A)
        continue;
      auto S = Stored && K < Stored->size() ? num(&(*Stored)[K]) : std::nullopt;
      Tab.row(
          {label(double(K), "rank " + std::to_string(K)), bytes(*A),
           S ? bytes(*S) : none(),
           html(bar(*A, Max, std::nullopt, PlanColour,
                    formatv("rank {0}: arena {1}", K, bytesText(*A)).str()))});
    }
    H += "<h3>Memory by pipeline rank</h3>" + Tab.str();
  }
  if (!P.Schedule.empty())
    H += "<h3>Schedule</h3>" +
         figure(P.Schedule, "chart-schedule", "pipeline schedule");
  else
    H += "<p class=\"note\">No schedule chart: the plan directory holds no "
         "schedule.svg.</p>\n";
  return {"pipeline", "Pipeline", H};
}

Section flopsSection(const ReportPage &P) {
  const json *Fl = get(&P.Facts, "flops");
  Facts T;
  auto Model = num(get(Fl, "model_flops_per_iteration"));
  auto Add = [&](StringRef Label, const json *J, StringRef Note = "") {
    if (auto V = num(J))
      T.add(
          Label,
          esc(siText(*V, "FLOP")) +
              formatv(" <span class=\"note\">({0})</span>", cformat("%.4e", *V))
                  .str(),
          Note);
  };
  Add("model FLOPs per iteration", get(Fl, "model_flops_per_iteration"),
      "forward and backward");
  Add("hardware FLOPs per iteration", get(Fl, "hardware_flops_per_iteration"),
      "with recomputation");
  if (auto R = num(get(Fl, "recompute_flops_per_iteration")))
    T.add("recompute FLOPs per iteration", esc(siText(*R, "FLOP")),
          num(get(Fl, "recompute_overhead"))
              ? "+" + percentText(*num(get(Fl, "recompute_overhead")), 2) +
                    " over the model FLOPs"
              : "");
  if (auto Paper = num(get(Fl, "paper_model_flops_per_iteration")))
    T.add("the paper's 72 B L s h\u00b2 (1 + s/6h + v/12hL)",
          esc(siText(*Paper, "FLOP")),
          Model && *Paper > 0
              ? "the plan is " + diffText(100 * (*Model / *Paper - 1)) +
                    " from it"
              : "");
  if (auto S = num(get(Fl, "paper_selective_overhead")))
    T.add("the paper's selective-recompute overhead s/6h",
          esc(percentText(*S, 2)));
  std::string H = T.str();
  if (const json *G = get(&P.Facts, "gemm_flops_per_rank")) {
    Table Tab({"GEMM FLOPs per rank, one microbatch", "FLOP", ""});
    double Fw = num(get(G, "forward")).value_or(0),
           Bw = num(get(G, "backward")).value_or(0),
           Rc = num(get(G, "recompute")).value_or(0);
    double Max = std::max({Fw, Bw, Rc});
    for (auto [Label, V] :
         {std::pair{"forward", Fw}, {"backward", Bw}, {"recompute", Rc}})
      Tab.row({text(Label), number(V, siText(V, "FLOP")),
               html(bar(V, Max, std::nullopt, PlanColour,
                        std::string(Label) + ": " + siText(V, "FLOP")))});
    H += Tab.str();
  }
  std::string Counted = str(get(Fl, "counted"));
  if (!Counted.empty())
    H += "<p class=\"note\">Counted: " + esc(Counted) + ".</p>\n";
  if (H.empty())
    H = "<p class=\"note\">The facts hold no FLOP report.</p>\n";
  return {"flops", "FLOPs", H};
}

Section estimateSection(const json &E) {
  Facts T;
  T.addText("cluster", str(get(&E, "cluster")));
  T.add("GPUs", optCount(get(&E, "gpus")));
  auto Sec = [&](StringRef Label, StringRef Key, StringRef Note = "") {
    if (auto V = num(get(&E, Key)))
      T.add(Label, esc(humanSeconds(*V)), Note);
  };
  Sec("step", "step_seconds");
  Sec("pipeline", "pipeline_seconds");
  if (auto B = num(get(&E, "bubble")))
    T.add("bubble", esc(percentText(*B)));
  Sec("GEMMs (busiest rank)", "gemm_seconds");
  Sec("memory-bound ops", "memory_bound_seconds");
  Sec("tensor collectives", "tensor_comm_seconds");
  Sec("exposed data-parallel sum", "data_parallel_seconds");
  Sec("optimizer", "optimizer_seconds");
  if (auto M = num(get(&E, "mfu")))
    T.add("MFU", esc(percentText(*M)));
  if (auto M = num(get(&E, "hfu")))
    T.add("HFU", esc(percentText(*M)), "recomputation counted");
  return {"estimate", "Estimate on a GPU cluster",
          "<p>The plan's step by the cost model of <code>--estimate</code> "
          "(passes/CostModel.h).</p>\n" +
              T.str()};
}

Section searchSection(const json &A) {
  Facts T;
  T.add("GPUs", optCount(get(&A, "gpus")));
  T.add("memory per GPU", optBytes(get(&A, "gpu_memory_bytes")));
  T.addText("cluster", str(get(&A, "cluster")));
  T.add("layouts compiled", optCount(get(&A, "compiled")));
  T.add("layouts skipped", optCount(get(&A, "skipped")),
        "ruled out before compiling");
  if (auto S = num(get(&A, "seconds")))
    T.add("search time", esc(humanSeconds(*S)));
  std::string H = T.str();
  if (const json *Fits = array(get(&A, "fits"))) {
    Table Tab({"rank", "t", "SP", "p", "m", "d", "ZeRO",
               "microbatches", "recompute", "peak per GPU", "step", "MFU",
               "bubble"},
              /*Sortable=*/true);
    int Rank = 0;
    for (const json &C : *Fits) {
      ++Rank;
      auto Int = [&](StringRef K) {
        auto V = integer(get(&C, K));
        return V ? number(double(*V), std::to_string(*V)) : noNumber();
      };
      // Stage-aware recomputation: the first ranks recompute in full.
      std::string Recompute = str(get(&C, "recompute"));
      if (auto Full = integer(get(&C, "full_recompute_ranks")); Full && *Full)
        Recompute += formatv(" (full on rank{0} 0{1})", *Full > 1 ? "s" : "",
                             *Full > 1 ? formatv("-{0}", *Full - 1).str()
                                       : std::string())
                         .str();
      auto Step = num(get(&C, "step_seconds")), Mfu = num(get(&C, "mfu")),
           Bub = num(get(&C, "bubble")), Peak = num(get(&C, "peak_bytes"));
      Tab.row({number(Rank, Rank == 1 ? "1 (chosen)" : std::to_string(Rank)),
               Int("tp"),
               text(yesNo(flag(get(&C, "sp")))), Int("pp"), Int("interleave"),
               Int("dp"), Int("zero"), Int("microbatches"),
               text(Recompute), Peak ? bytes(*Peak) : noNumber(),
               Step ? number(*Step, humanSeconds(*Step)) : noNumber(),
               Mfu ? number(*Mfu, percentText(*Mfu)) : noNumber(),
               Bub ? number(*Bub, percentText(*Bub)) : noNumber()},
              Rank == 1 ? "chosen" : "");
    }
    H += "<h3>Layouts that fit, fastest first</h3>" + Tab.str() +
         "<p class=\"note\">This page describes the chosen layout, rank "
         "1.</p>\n";
  }
  if (const json *Rejected = array(get(&A, "rejected"));
      Rejected && !Rejected->empty()) {
    H += formatv("<details><summary>Why the other {0} were not taken"
                 "</summary><ul>",
                 Rejected->size())
             .str();
    for (const json &R : *Rejected)
      H += "<li>" + esc(R.is_string() ? R.get<std::string>() : R.dump()) +
           "</li>";
    H += "</ul></details>\n";
  }
  return {"search", "Layout search (--auto)", H};
}

/// Where the run stands, when the caller did not say.
std::string runStatus(const ReportPage &P) {
  if (!P.RunStatus.empty() || P.Loss.empty())
    return P.RunStatus;
  int64_t Last = P.Loss.back().Step;
  if (P.Steps > 0 && Last >= P.Steps)
    return formatv("finished: step {0} of {1}", Last, P.Steps).str();
  if (P.Steps > 0)
    return formatv("at step {0} of {1} (still running, or stopped)", Last,
                   P.Steps)
        .str();
  return formatv("at step {0}", Last).str();
}

Section trainingSection(const ReportPage &P) {
  std::string H;
  Facts T;
  T.addText("status", runStatus(P));
  const std::vector<ReportLossRow> &Rows = P.Loss;
  if (!Rows.empty()) {
    T.add("steps logged",
          esc(formatv("{0}-{1}", Rows.front().Step, Rows.back().Step).str()));
    T.add("final training loss", lossText(Rows.back().Loss));
    double Min = INFINITY;
    int64_t MinStep = 0;
    for (const ReportLossRow &R : Rows)
      if (std::isfinite(R.Loss) && R.Loss < Min) {
        Min = R.Loss;
        MinStep = R.Step;
      }
    if (std::isfinite(Min))
      T.add("lowest training loss", lossText(Min),
            formatv("step {0}", MinStep).str());
    for (auto It = Rows.rbegin(); It != Rows.rend(); ++It)
      if (std::isfinite(It->ValLoss)) {
        T.add("last validation loss", lossText(It->ValLoss),
              formatv("step {0}", It->Step).str());
        break;
      }
    std::vector<double> Rates;
    for (const ReportLossRow &R : Rows)
      if (std::isfinite(R.TokensPerSecond))
        Rates.push_back(R.TokensPerSecond);
    if (!Rates.empty()) {
      std::sort(Rates.begin(), Rates.end());
      T.add("throughput (median step)",
            esc(thousands(int64_t(std::llround(Rates[Rates.size() / 2])))) +
                " tok/s");
    }
    std::vector<double> Mfus;
    for (const ReportLossRow &R : Rows)
      if (std::isfinite(R.MFU))
        Mfus.push_back(R.MFU);
    if (!Mfus.empty()) {
      std::sort(Mfus.begin(), Mfus.end());
      T.add("MFU (median step)", esc(percentText(Mfus[Mfus.size() / 2], 2)));
    }
  }
  H += T.grid();
  if (!P.LossChart.empty())
    H += figure(P.LossChart, "chart-loss", "loss chart");
  if (!Rows.empty()) {
    // About twenty rows: every k-th step, the validated ones and the last.
    size_t Every = std::max<size_t>(1, (Rows.size() + 19) / 20);
    Table Tab({"step", "loss", "validation loss", "learning rate",
               "gradient norm", "tok/s"},
              /*Sortable=*/true);
    for (size_t K = 0; K < Rows.size(); ++K) {
      const ReportLossRow &R = Rows[K];
      if (K && R.Step % int64_t(Every) && K + 1 != Rows.size() &&
          !std::isfinite(R.ValLoss))
        continue;
      auto Num = [](double V, std::string Shown) {
        return std::isfinite(V) ? number(V, std::move(Shown)) : noNumber();
      };
      Tab.row({number(double(R.Step), std::to_string(R.Step)),
               Num(R.Loss, cformat("%.4f", R.Loss)),
               Num(R.ValLoss, cformat("%.4f", R.ValLoss)),
               Num(R.LR, cformat("%.2e", R.LR)),
               Num(R.GradNorm, cformat("%.3f", R.GradNorm)),
               Num(R.TokensPerSecond,
                   std::isfinite(R.TokensPerSecond)
                       ? thousands(int64_t(std::llround(R.TokensPerSecond)))
                       : "")});
    }
    H +=
        "<h3>The loss log</h3><p class=\"note\">" +
        (Every == 1 ? formatv("All {0} steps.", Rows.size()).str()
                    : formatv("The steps that are multiples of {0}, the first, "
                              "the validated ones and the last (of {1}); "
                              "loss.csv holds them all.",
                              Every, Rows.size())
                          .str()) +
        "</p>\n" + Tab.str();
  } else {
    H += "<p class=\"note\">No step was logged.</p>\n";
  }
  return {"training", "Training", H};
}

Section measuredSection(const ReportPage &P) {
  if (!P.Measured)
    return {"measured-memory", "Measured memory",
            "<p class=\"note\">Not measured: no training step ran.</p>\n"};
  const ReportMeasuredMemory &M = *P.Measured;
  const json *Plan = get(&P.Facts, "plan"), *Mem = get(&P.Facts, "memory");
  std::optional<double> PlannedTemp = num(get(Plan, "peak_live_temp_bytes")),
                        PlannedStored =
                            num(get(Mem, "first_stage_activation_bytes")),
                        PlannedPersistent = num(get(Plan, "persistent_bytes"));
  double Max =
      std::max<double>({double(M.ArenaBytes), double(M.PlannedArenaBytes),
                        double(M.HighWaterBytes)});
  Table T({"", "measured", "planned", "", "measured vs planned"});
  auto Row = [&](StringRef Label, double Got, std::optional<double> Want) {
    T.row({text(Label), bytes(Got), Want ? bytes(*Want) : none(),
           html(bar(Got, Max, Want, MeasuredColour,
                    formatv("{0}: {1} measured", Label, bytesText(Got)).str())),
           Want && *Want > 0
               ? number(100 * (Got - *Want) / *Want,
                        diffText(100 * (Got - *Want) / *Want, "%+.2f%%"))
               : none()});
  };
  Row("arena", double(M.ArenaBytes), double(M.PlannedArenaBytes));
  Row("persistent", double(M.PersistentBytes), PlannedPersistent);
  Row("high-water mark", double(M.HighWaterBytes), double(M.PlannedArenaBytes));
  Row("peak live temporaries", double(M.PeakLiveTempBytes), PlannedTemp);
  Row("stored activations (whole step)", double(M.StoredActivationBytes),
      PlannedStored);
  return {"measured-memory", "Measured memory",
          "<p>What " + esc(M.Rank) +
              " measured while it trained (the highest arena address an "
              "instruction touched, the live temporaries and the stored "
              "activations of the last step), against its plan. The tick is "
              "the planned value; the per-layer figures are in the "
              "<a href=\"#memory\">memory</a> table.</p>\n" +
              T.str()};
}

const char *const Style = R"css(
:root{color-scheme:light}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0;color:#1d2330;background:#fff;line-height:1.45}
header,nav,main,footer{max-width:1180px;margin:0 auto;padding:0 24px}
header{padding-top:18px}
h1{font-size:1.55em;margin:0 0 2px}
h2{font-size:1.3em;margin:30px 0 8px;padding-top:10px;border-top:1px solid #d8dde6}
h3{font-size:1.05em;margin:18px 0 6px}
.subject{font-size:1.05em;margin:0 0 8px;color:#4a5262;overflow-wrap:anywhere}
code,pre{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:.88em}
pre{background:#f5f7fa;padding:8px 10px;overflow-x:auto;border:1px solid #e4e8ee;white-space:pre-wrap;overflow-wrap:anywhere}
table{border-collapse:collapse;margin:6px 0 12px;font-size:.92em}
th,td{padding:3px 10px;border-bottom:1px solid #e4e8ee;text-align:left;vertical-align:middle}
thead th{background:#f0f3f7;font-weight:600}
td:first-child{white-space:nowrap}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tfoot td{font-weight:600;border-top:1px solid #b8c0cc}
table.kv th{font-weight:normal;color:#4a5262;white-space:nowrap;padding-right:18px}
table.sortable thead th{cursor:pointer}
tr.chosen td{background:#eef6ea}
figure{margin:10px 0 18px}
figcaption{color:#4a5262;font-size:.9em;max-width:960px;margin-top:4px}
svg.chart{max-width:100%;height:auto;display:block;border:1px solid #e4e8ee}
svg.bar{display:block}
.note{color:#5a6272;font-size:.92em}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:0 28px;margin:6px 0 14px}
.grid div{border-bottom:1px solid #e4e8ee;padding:4px 2px}
.grid dt{color:#5a6272;font-size:.82em}
.grid dd{margin:0;overflow-wrap:anywhere}
.side{display:flex;flex-wrap:wrap;gap:0 48px;align-items:flex-start}
.side h3:first-child{margin-top:6px}
nav ol{columns:3;margin:4px 0 0;padding-left:22px}
nav h2{border:0;margin-top:14px;padding:0}
details{margin:6px 0 12px}
summary{cursor:pointer;color:#2b5797}
footer{padding-bottom:30px}
.selfcheck{font-size:.85em;color:#5a6272;margin-top:28px}
.selfcheck.bad{color:#b00020;font-weight:600}
)css";

/// Errors anywhere on the page, for the self-check.
const char *const ErrorScript =
    "window.spErrors=[];window.onerror=function(m,s,l){"
    "window.spErrors.push(String(m)+(l?' (line '+l+')':''));"
    "var e=document.getElementById('selfcheck');"
    "if(e){e.textContent='error: '+window.spErrors.join('; ');"
    "e.className='selfcheck bad';}};";

/// Sortable tables; then the self-check: every SVG has a non-empty
/// bounding box, and nothing threw.
const char *const PageScript = R"js(
(function(){
  function key(c){var v=c.getAttribute('data-v');return v===null?null:parseFloat(v);}
  function sortBy(th){
    var table=th.closest('table'),body=table.tBodies[0];
    var col=Array.prototype.indexOf.call(th.parentNode.children,th);
    var up=th.getAttribute('aria-sort')!=='ascending';
    var rows=Array.prototype.slice.call(body.rows);
    rows.sort(function(a,b){
      var x=a.cells[col],y=b.cells[col];if(!x||!y)return 0;
      var u=key(x),v=key(y),c;
      if(u!==null&&v!==null)c=u-v;else if(u===null&&v===null)c=x.textContent.localeCompare(y.textContent);else c=u===null?-1:1;
      return up?c:-c;});
    rows.forEach(function(r){body.appendChild(r);});
    Array.prototype.forEach.call(th.parentNode.children,function(h){h.removeAttribute('aria-sort');});
    th.setAttribute('aria-sort',up?'ascending':'descending');
  }
  document.querySelectorAll('table.sortable thead th').forEach(function(th){
    th.addEventListener('click',function(){sortBy(th);});});
  var out=document.getElementById('selfcheck'),empty=[],charts=0,bars=0;
  document.querySelectorAll('svg').forEach(function(s){
    var b=s.getBBox();
    if(!(b.width>0&&b.height>0))empty.push(s.id||s.getAttribute('aria-label')||'an svg');
    if(s.classList.contains('chart'))charts++;else bars++;});
  if(empty.length||window.spErrors.length){
    out.textContent='error: '+(empty.length?'nothing drawn in '+empty.join(', ')+'. ':'')+window.spErrors.join('; ');
    out.className='selfcheck bad';
  }else{
    out.textContent='ok '+charts+' charts, '+bars+' bars';
    out.className='selfcheck ok';
  }
})();
)js";

} // namespace

std::string renderReportPage(const ReportPage &P) {
  const json &F = P.Facts;
  // A run's page opens with its loss.
  std::vector<Section> Sections;
  if (P.isRun())
    Sections.push_back(trainingSection(P));
  Sections.push_back(optionsSection(P));
  Sections.push_back(modelSection(P));
  Sections.push_back(memorySection(P));
  if (P.isRun())
    Sections.push_back(measuredSection(P));
  Sections.push_back(collectivesSection(P));
  if (pipelined(F))
    Sections.push_back(pipelineSection(P));
  Sections.push_back(flopsSection(P));
  if (const json *E = get(&F, "estimate"); E && E->is_object())
    Sections.push_back(estimateSection(*E));
  if (const json *A = get(&F, "auto"); A && A->is_object())
    Sections.push_back(searchSection(*A));

  std::string Kind = P.isRun() ? "training run" : "compiled plan";
  std::string S;
  raw_string_ostream OS(S);
  OS << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">"
        "\n<meta name=\"viewport\" content=\"width=device-width, "
        "initial-scale=1\">\n<title>"
     << esc(P.Tool) << ": " << esc(sys::path::filename(P.Subject))
     << "</title>\n<style>" << Style << "</style>\n<script>" << ErrorScript
     << "</script>\n</head>\n"
     << "<body>\n<header>\n<h1>" << esc(P.Tool) << " report: the " << Kind
     << "</h1>\n<p class=\"subject\">" << esc(P.Subject) << "</p>\n";
  static const std::map<std::string, std::string> Families = {
      {"gpt", "GPT-style decoder"},
      {"llama", "Llama-style decoder"},
      {"bert", "BERT-style encoder"}};
  std::string Model = str(get(&F, "model", "family"));
  auto Family = Families.find(Model);
  if (auto L = integer(get(&F, "model", "layers")))
    OS << "<p>"
       << esc(Family != Families.end() ? Family->second : Model + " model")
       << ", " << *L << " layers, " << optCount(get(&F, "model", "params"))
       << " parameters; t = "
       << esc(std::to_string(integer(get(&F, "parallel", "tp")).value_or(1)))
       << (flag(get(&F, "parallel", "sp")).value_or(false) ? " with SP" : "")
       << ", p = " << integer(get(&F, "parallel", "pp")).value_or(1)
       << ", d = " << integer(get(&F, "parallel", "dp")).value_or(1);
  if (auto A = num(get(&F, "plan", "arena_bytes")))
    OS << "; arena " << esc(bytesText(*A)) << " on rank 0";
  if (P.isRun() && !runStatus(P).empty())
    OS << "; " << esc(runStatus(P));
  OS << ".</p>\n</header>\n<nav id=\"toc\" aria-label=\"contents\">\n"
        "<h2>Contents</h2>\n<ol>\n";
  for (const Section &Sec : Sections)
    OS << "<li><a href=\"#" << Sec.Id << "\">" << esc(Sec.Title)
       << "</a></li>\n";
  OS << "</ol>\n</nav>\n<main>\n";
  for (const Section &Sec : Sections)
    OS << "<section id=\"" << Sec.Id << "\">\n<h2>" << esc(Sec.Title)
       << "</h2>\n"
       << Sec.Html << "</section>\n";
  OS << "</main>\n<footer>\n<div id=\"selfcheck\" class=\"selfcheck\">"
        "Self-check not run (scripts are off); the page is complete without "
        "it.</div>\n<p class=\"note\">Written by "
     << esc(P.Tool)
     << ". Everything is in this file: no network, scripts only to sort the "
        "tables and check the charts.</p>\n</footer>\n<script>"
     << PageScript << "</script>\n</body>\n</html>\n";
  return OS.str();
}

Error writeReportPage(StringRef Path, const ReportPage &P) {
  std::string Html = renderReportPage(P);
  return writeFileAtomically(Path, [&](raw_ostream &OS) { OS << Html; });
}

ReportPage planReportPage(const json &Manifest, StringRef Dir) {
  ReportPage P;
  P.Tool = "sp-run";
  P.Subject = Dir.str();
  if (Manifest.is_object())
    P.Facts = Manifest;
  SmallString<256> Chart(Dir);
  sys::path::append(Chart, "schedule.svg");
  if (auto B = MemoryBuffer::getFile(Chart)) {
    P.Schedule.Svg = (*B)->getBuffer().str();
    P.Schedule.Caption = "The pipeline schedule the plan runs (its "
                         "schedule.svg), timed by each stage's GEMM work: one "
                         "row per pipeline rank; the empty space is the "
                         "bubble.";
  }
  return P;
}

std::string commandLine(int Argc, const char *const *Argv) {
  std::string S;
  for (int I = 0; I < Argc; ++I) {
    StringRef A = I ? StringRef(Argv[I]) : sys::path::filename(Argv[I]);
    bool Plain = !A.empty() && all_of(A, [](char C) {
      return isAlnum(C) || StringRef("_./=:,+@%-").contains(C);
    });
    if (I)
      S += ' ';
    if (Plain) {
      S += A.str();
      continue;
    }
    S += '\'';
    for (char C : A)
      S += C == '\'' ? std::string("'\\''") : std::string(1, C);
    S += '\'';
  }
  return S;
}

} // namespace sp
