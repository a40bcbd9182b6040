//===- HtmlParts.h - The pieces the report page is made of ------*- C++ -*-===//
//
// The report library's own helpers (not part of its interface): the JSON
// readers, which return nothing for a missing or mistyped entry (a plan
// directory is user input); number and text formats; key-value and column
// tables (numbers right aligned, with their raw value for sorting); small
// inline bars (an SVG of one value against the largest of its table, with
// a tick at a reference value such as the formula's); figures of the
// charts the callers drew (checked by inlineSvg); and the sections, each a
// string of HTML built from the facts (HtmlPlanSections.cpp,
// HtmlCostSections.cpp, HtmlRunSections.cpp), which HtmlPage.cpp puts
// together.
//
//===----------------------------------------------------------------------===//
#ifndef SP_HTML_HTMLPARTS_H
#define SP_HTML_HTMLPARTS_H

#include "html/HtmlReport.h"
#include "llvm/Support/FormatVariadic.h"
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace sp {
namespace html {

using json = nlohmann::json;

// Reading the facts.

/// J[Key] when J is an object that has it, else null.
const json *get(const json *J, llvm::StringRef Key);
const json *get(const json *J, llvm::StringRef K1, llvm::StringRef K2);
std::optional<double> num(const json *J);
std::optional<int64_t> integer(const json *J);
std::optional<bool> flag(const json *J);
std::string str(const json *J);
const json *array(const json *J);

// Formatting.

inline std::string esc(llvm::StringRef S) { return escapeHtml(S); }
/// snprintf into a string (numbers only, so 64 bytes hold them).
template <typename... Ts> std::string cformat(const char *Fmt, Ts... Args) {
  char Buf[64];
  std::snprintf(Buf, sizeof(Buf), Fmt, Args...);
  return Buf;
}
std::string thousands(int64_t N);
std::string bytesText(double B);
/// Three significant digits with an SI prefix: "805 MFLOP".
std::string siText(double V, llvm::StringRef Unit);
/// A relative difference in percent, "-0.00%" printed as "0.00%".
std::string diffText(double Percent, const char *Fmt = "%.2f%%");
std::string percentText(double Fraction, int Digits = 1);
std::string lossText(double L);

inline constexpr const char * Dash = "&mdash;";

/// An inline bar: Value against Max, and a tick at Tick (e.g. the formula).
std::string bar(double Value, double Max, std::optional<double> Tick,
                llvm::StringRef Colour, llvm::StringRef Label);

inline constexpr const char * PlanColour = "#4c78a8";
inline constexpr const char * MeasuredColour = "#f58518";
inline constexpr const char * CommColour = "#e45756";

struct Cell {
  std::string Html;
  std::optional<double> Sort; // sorted by this value
  bool Number = false;        // right-aligned
};
inline Cell text(llvm::StringRef S) { return {esc(S), std::nullopt}; }
inline Cell html(std::string H) { return {std::move(H), std::nullopt}; }
inline Cell number(double V, std::string Shown) { return {esc(Shown), V, true}; }
/// A row's label that sorts by Key ("layer 3", "outside the layers").
inline Cell label(double Key, std::string Html) { return {std::move(Html), Key}; }
inline Cell bytes(double V) { return number(V, bytesText(V)); }
inline Cell none() { return {Dash, std::nullopt}; }
/// No value in a column of numbers.
inline Cell noNumber() { return {Dash, std::nullopt, true}; }

/// A table of columns; Sortable ones get the script's sorting.
class Table {
public:
  Table(std::vector<std::string> Headers, bool Sortable = false)
      : Headers(std::move(Headers)), Sortable(Sortable) {}
  void row(std::vector<Cell> Cells, llvm::StringRef Class = "") {
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
      S += C.Sort ? llvm::formatv("<td{0} data-v=\"{1}\">{2}</td>",
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
  void add(llvm::StringRef Label, std::string ValueHtml, llvm::StringRef Note = "") {
    if (ValueHtml.empty())
      return;
    Rows.push_back(
        {esc(Label), ValueHtml + (Note.empty() ? ""
                                               : " <span class=\"note\">" +
                                                     esc(Note) + "</span>")});
  }
  void addText(llvm::StringRef Label, llvm::StringRef Value, llvm::StringRef Note = "") {
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

std::string optBytes(const json *J);
std::string optCount(const json *J);
std::string yesNo(std::optional<bool> B);
/// The chart C as a figure with its caption, or a note saying why it is
/// left out.
std::string figure(const ReportChart &C, llvm::StringRef Id,
                   llvm::StringRef Label);
/// Blocks side by side while the page is wide enough (empty ones left out).
std::string side(std::vector<std::string> Blocks);

// The sections.

struct Section {
  std::string Id, Title, Html;
};

/// Whether the facts are of a pipelined plan.
bool pipelined(const json &F);
/// How the plan recomputes, in a few words.
std::string recomputeSummary(const json &F);

Section optionsSection(const ReportPage &P);
Section modelSection(const ReportPage &P);
Section memorySection(const ReportPage &P);
Section collectivesSection(const ReportPage &P);
Section pipelineSection(const ReportPage &P);
Section flopsSection(const ReportPage &P);
Section estimateSection(const json &E);
Section searchSection(const json &A);
/// Where a run stands ("stopped by SIGTERM after step 12"; empty: no rows).
std::string runStatus(const ReportPage &P);
Section trainingSection(const ReportPage &P);
Section measuredSection(const ReportPage &P);

} // namespace html
} // namespace sp

#endif // SP_HTML_HTMLPARTS_H
