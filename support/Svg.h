//===- Svg.h - The charts' SVG document and axes ----------------*- C++ -*-===//
//
// What every chart of the repository draws the same way, on the XML writer
// (Xml.h): the document (an <svg> of the given size, sans-serif 12 px, on
// a white background) and an axis's ticks (a step of 1, 2 or 5 times a
// power of ten) with their labels.
//
//===----------------------------------------------------------------------===//
#ifndef SP_SUPPORT_SVG_H
#define SP_SUPPORT_SVG_H

#include "support/Xml.h"
#include <string>
#include <vector>

namespace sp {

/// Opens the chart's <svg> element (the SVG namespace, Width x Height, its
/// viewBox, the font) and draws its white background; W.close() ends it.
void openSvgDocument(XmlWriter &W, double Width, double Height);

/// Tick positions over [Lo, Hi]: a step of 1, 2 or 5 times a power of ten
/// giving about Want ticks (a step of 1 for an empty range); Step is set
/// to it.
std::vector<double> niceTicks(double Lo, double Hi, int Want, double &Step);

/// A tick's label: as many decimals as Step needs (at most 6).
std::string tickLabel(double V, double Step);

} // namespace sp

#endif // SP_SUPPORT_SVG_H
