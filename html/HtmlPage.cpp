//===- HtmlPage.cpp - The page: skeleton, style, script ---------------------===//
//
// The page is assembled from sections, each a string of HTML built from the
// facts through the helpers of HtmlParts.h; this file holds its skeleton
// (head, style, the small script that sorts tables and checks every chart
// rendered, the table of contents of the sections present), writing it,
// the plan part of a run's page, and the command line it shows.
//
//===----------------------------------------------------------------------===//
#include "html/HtmlParts.h"
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
using json = nlohmann::json;

namespace sp {

using namespace html;

namespace {

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
