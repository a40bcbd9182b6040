//===- Svg.cpp - The charts' SVG document and axes ------------------------===//
//
// See Svg.h.
//
//===----------------------------------------------------------------------===//
#include "support/Svg.h"
#include "support/Format.h"
#include <algorithm>
#include <cmath>

namespace sp {

void openSvgDocument(XmlWriter &W, double Width, double Height) {
  std::string Box = "0 0 " + fixedNumber(Width, 2) + " " +
                    fixedNumber(Height, 2);
  W.open("svg", {{"xmlns", "http://www.w3.org/2000/svg"},
                 {"width", Width},
                 {"height", Height},
                 {"viewBox", Box},
                 {"font-family", "sans-serif"},
                 {"font-size", "12"}});
  W.leaf("rect", {{"x", "0"},
                  {"y", "0"},
                  {"width", Width},
                  {"height", Height},
                  {"fill", "white"}});
}

std::vector<double> niceTicks(double Lo, double Hi, int Want, double &Step) {
  double Range = Hi - Lo;
  double Raw = Range / std::max(1, Want);
  if (!(Raw > 0) || !std::isfinite(Raw))
    Raw = 1; // an empty or unbounded range: unit steps
  double Mag = std::pow(10.0, std::floor(std::log10(Raw)));
  Step = Mag;
  for (double M : {1.0, 2.0, 5.0, 10.0})
    if (M * Mag >= Raw) {
      Step = M * Mag;
      break;
    }
  std::vector<double> T;
  for (double V = std::ceil(Lo / Step - 1e-9) * Step; V <= Hi + Step * 1e-9;
       V += Step)
    T.push_back(std::abs(V) < Step * 1e-9 ? 0.0 : V);
  return T;
}

std::string tickLabel(double V, double Step) {
  int Decimals =
      Step >= 1 ? 0 : std::min(6, int(std::ceil(-std::log10(Step) - 1e-9)));
  char Text[64];
  std::snprintf(Text, sizeof(Text), "%.*f", Decimals, V);
  return Text;
}

} // namespace sp
