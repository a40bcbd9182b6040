//===- HtmlParts.cpp - The pieces the report page is made of --------------===//
//
// See HtmlParts.h.
//
//===----------------------------------------------------------------------===//
#include "html/HtmlParts.h"
#include "support/Format.h"
#include "support/Xml.h"
#include <algorithm>
#include <cmath>

using namespace llvm;

namespace sp {
namespace html {


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
std::string diffText(double Percent, const char *Fmt) {
  if (std::abs(Percent) < 0.005)
    Percent = 0;
  return cformat(Fmt, Percent);
}

std::string percentText(double Fraction, int Digits) {
  return cformat("%.*f%%", Digits, 100 * Fraction);
}

std::string lossText(double L) {
  return std::isfinite(L) ? cformat("%.4f", L) : "&mdash;";
}


std::string bar(double Value, double Max, std::optional<double> Tick,
                StringRef Colour, StringRef Label) {
  const double W = 140, H = 12;
  auto X = [&](double V) {
    return Max > 0 ? std::clamp(V / Max, 0.0, 1.0) * W : 0.0;
  };
  std::string S;
  raw_string_ostream OS(S);
  XmlWriter Svg(OS);
  Svg.setNewLines(false);
  Svg.open("svg", {{"class", "bar"},
                   {"width", W},
                   {"height", H},
                   {"viewBox", "0 0 " + fixedNumber(W, 2) + " " +
                                   fixedNumber(H, 2)},
                   {"role", "img"},
                   {"aria-label", Label}});
  Svg.leaf("rect", {{"width", W}, {"height", H}, {"fill", "#eef1f5"}});
  if (std::isfinite(Value) && Value > 0)
    Svg.leaf("rect", {{"width", std::max(X(Value), 1.0), 1},
                      {"height", H},
                      {"fill", Colour}});
  if (Tick && std::isfinite(*Tick)) {
    double T = std::clamp(X(*Tick), 1.0, W - 1);
    Svg.leaf("line", {{"x1", T, 1},
                      {"x2", T, 1},
                      {"y1", "0"},
                      {"y2", H},
                      {"stroke", "#1d2330"},
                      {"stroke-width", "2"}});
  }
  Svg.close();
  return OS.str();
}





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


/// Blocks side by side while the page is wide enough (empty ones left out).
std::string side(std::vector<std::string> Blocks) {
  std::string S;
  for (const std::string &B : Blocks)
    if (!B.empty())
      S += "<div>" + B + "</div>";
  return S.empty() ? S : "<div class=\"side\">" + S + "</div>\n";
}


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


} // namespace html
} // namespace sp
