//===- HtmlReportTest.cpp - The --html report page ------------------------===//
//
// The page of html/HtmlReport.h from the facts of the default model compiled
// in process (one device, and t = 2 + SP with p = 2): every section and chart
// where it belongs and nowhere else, hostile names escaped, nothing that
// reaches outside the file, and SVG with scripts or references refused. The
// rendering in a browser is tests/e2e/check_html_report.py's.
//
//===----------------------------------------------------------------------===//
#include "html/HtmlReport.h"
#include "frontend/OnnxImporter.h"
#include "driver/Compile.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "gtest/gtest.h"
#include <regex>
#include <set>

using namespace sp;
using namespace llvm;

namespace {

/// The default model's compilation, pipelined (t = 2 + SP, p = 2, 4
/// microbatches) or on one device.
Compilation compileTiny(bool Pipelined) {
  auto G = cantFail(
      importOnnx(SP_SOURCE_DIR "/models/tiny/gpt-tiny.onnx", ImportOptions()));
  PassContext Ctx;
  Ctx.FusedAttention = true; // sp-compile's default
  if (Pipelined) {
    Ctx.TensorParallel = 2;
    Ctx.SequenceParallel = true;
    Ctx.Pipeline.Stages = 2;
    Ctx.Pipeline.Microbatches = 4;
  }
  return cantFail(compileToPlan(*G, Ctx, CompileOptions()));
}

/// A small chart as the tools' writers draw them (with the SVG namespace).
const char *const TinySvg =
    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100\" height=\"50\" "
    "viewBox=\"0 0 100 50\"><rect x=\"0\" y=\"0\" width=\"100\" "
    "height=\"50\" fill=\"white\"/><text x=\"5\" y=\"20\">a &amp; b</text>"
    "</svg>\n";

ReportPage compilePage(bool Pipelined) {
  Compilation C = compileTiny(Pipelined);
  ReportPage P;
  P.Tool = "sp-compile";
  P.Subject = "models/tiny/gpt-tiny.onnx";
  P.CommandLine = "sp-compile models/tiny/gpt-tiny.onnx --html r.html";
  P.Facts = C.Facts;
  P.Memory = {TinySvg, "the memory chart"};
  for (auto &[Name, Text] : C.P->Files)
    if (Name == "schedule.svg")
      P.Schedule = {Text, "the schedule"};
  return P;
}

ReportPage runPage() {
  ReportPage P = compilePage(/*Pipelined=*/true);
  P.Tool = "sp-run";
  P.Subject = "gpt-tiny.plan";
  P.Memory = {};
  P.Steps = 3;
  P.RunSettings = {{"steps", "3"}, {"seed", "1234"}};
  for (int S = 1; S <= 3; ++S)
    P.Loss.push_back({S, 5.5 - S, S == 3 ? 4.0 : NAN, 1e-3, 1.5, 2e4, NAN});
  P.LossChart = {TinySvg, "the loss"};
  ReportMeasuredMemory M;
  M.ArenaBytes = M.PlannedArenaBytes = M.HighWaterBytes = 2 << 20;
  M.PersistentBytes = 1 << 19;
  M.PeakLiveTempBytes = 1 << 20;
  M.StoredActivationBytes = 1 << 20;
  M.StoredBytesByLayer = {{-1, 8192}, {0, 544768}};
  P.Measured = M;
  return P;
}

/// The ids of the <section>s, in order.
std::vector<std::string> sections(const std::string &Html) {
  std::vector<std::string> Ids;
  std::regex Re("<section id=\"([a-z-]+)\">");
  for (auto It = std::sregex_iterator(Html.begin(), Html.end(), Re);
       It != std::sregex_iterator(); ++It)
    Ids.push_back((*It)[1]);
  return Ids;
}

size_t occurrences(StringRef Haystack, StringRef Needle) {
  size_t N = 0;
  for (size_t At = Haystack.find(Needle); At != StringRef::npos;
       At = Haystack.find(Needle, At + 1))
    ++N;
  return N;
}

/// The names of the attributes of every tag (lower case).
std::set<std::string> attributeNames(const std::string &Html) {
  std::set<std::string> Names;
  std::regex Tag("<[a-zA-Z][^>]*>"),
      Attr("\\s([^\\s=/>]+)\\s*=\\s*(\"[^\"]*\"|'[^']*')");
  for (auto T = std::sregex_iterator(Html.begin(), Html.end(), Tag);
       T != std::sregex_iterator(); ++T) {
    std::string Text = T->str();
    for (auto A = std::sregex_iterator(Text.begin(), Text.end(), Attr);
         A != std::sregex_iterator(); ++A)
      Names.insert(StringRef((*A)[1].str()).lower());
  }
  return Names;
}

/// What would make the page reach outside the file: a URL, a src or a
/// non-fragment href attribute, a CSS url() or @import.
void expectSelfContained(const std::string &Html) {
  EXPECT_EQ(Html.find("http://"), std::string::npos);
  EXPECT_EQ(Html.find("https://"), std::string::npos);
  EXPECT_EQ(Html.find("src="), std::string::npos);
  EXPECT_EQ(Html.find("url("), std::string::npos);
  EXPECT_EQ(Html.find("@import"), std::string::npos);
  EXPECT_FALSE(std::regex_search(Html, std::regex("href=\"[^#]")));
  EXPECT_FALSE(std::regex_search(
      Html,
      std::regex("<(img|iframe|object|embed|link|base|foreignObject)[ >/]")));
}

} // namespace

TEST(HtmlReport, CompilePageHasEverySection) {
  std::string Html = renderReportPage(compilePage(/*Pipelined=*/true));
  EXPECT_EQ(sections(Html),
            (std::vector<std::string>{"options", "model", "memory",
                                      "collectives", "pipeline", "flops"}));
  for (const char *Id :
       {"options", "model", "memory", "collectives", "pipeline", "flops"})
    EXPECT_NE(Html.find(formatv("<a href=\"#{0}\">", Id).str()),
              std::string::npos)
        << Id << " is not in the table of contents";
  for (const char *Chart : {"chart-memory", "chart-schedule"})
    EXPECT_EQ(
        occurrences(Html,
                    formatv("<svg id=\"{0}\" class=\"chart\"", Chart).str()),
        1u)
        << Chart;
  // The facts, as sp-compile prints them: the formula and the plan agree
  // on the middle layer, and the simulated bubble.
  EXPECT_NE(Html.find("532.00 KiB"), std::string::npos);
  EXPECT_NE(Html.find("the plan is 0.00% from it"), std::string::npos);
  EXPECT_NE(Html.find("73.2%"), std::string::npos);
  EXPECT_NE(Html.find("GPT-style decoder"), std::string::npos);
  EXPECT_NE(Html.find("layers 0-1"), std::string::npos);
  EXPECT_NE(Html.find("<div id=\"selfcheck\""), std::string::npos);
  expectSelfContained(Html);
}

TEST(HtmlReport, PageWithoutPipelineHasNoGantt) {
  ReportPage P = compilePage(/*Pipelined=*/false);
  EXPECT_TRUE(P.Schedule.empty());
  // A schedule chart given anyway stays out of a page of an unpipelined
  // plan (a stale schedule.svg in a plan directory).
  P.Schedule = {TinySvg, "stale"};
  std::string Html = renderReportPage(P);
  EXPECT_EQ(sections(Html),
            (std::vector<std::string>{"options", "model", "memory",
                                      "collectives", "flops"}));
  EXPECT_EQ(Html.find("chart-schedule"), std::string::npos);
  EXPECT_EQ(Html.find("#pipeline"), std::string::npos);
  EXPECT_EQ(Html.find("Gantt"), std::string::npos);
  expectSelfContained(Html);
}

TEST(HtmlReport, RunPageHasTrainingAndMeasuredMemory) {
  std::string Html = renderReportPage(runPage());
  EXPECT_EQ(sections(Html),
            (std::vector<std::string>{"training", "options", "model", "memory",
                                      "measured-memory", "collectives",
                                      "pipeline", "flops"}));
  EXPECT_EQ(occurrences(Html, "<svg id=\"chart-loss\" class=\"chart\""), 1u);
  EXPECT_EQ(occurrences(Html, "<svg id=\"chart-schedule\" class=\"chart\""),
            1u);
  EXPECT_EQ(Html.find("chart-memory"), std::string::npos);
  EXPECT_NE(Html.find("finished: step 3 of 3"), std::string::npos);
  EXPECT_NE(Html.find("<td class=\"n\" data-v=\"4\">4.0000</td>"),
            std::string::npos)
      << "the validation loss of step 3";
  // Layer 1 is on the other pipeline stage: the rank did not measure it.
  EXPECT_NE(Html.find("another rank's</span>"), std::string::npos);
  expectSelfContained(Html);

  ReportPage Stopped = runPage();
  Stopped.RunStatus = "stopped by SIGTERM after step 3 of 10";
  Stopped.Measured.reset();
  Html = renderReportPage(Stopped);
  EXPECT_NE(Html.find("stopped by SIGTERM after step 3 of 10"),
            std::string::npos);
  EXPECT_NE(Html.find("Not measured"), std::string::npos);
}

TEST(HtmlReport, EscapesHostileNames) {
  const std::string Evil = "<script>alert(1)</script>\"><img src=x "
                           "onerror=alert(2)>&'";
  ReportPage P = runPage();
  P.Subject = Evil;
  P.CommandLine = "sp-run '" + Evil + "'";
  P.RunSettings.push_back({Evil, Evil});
  P.RunStatus = Evil;
  P.Facts["model"]["family"] = Evil;
  P.Facts["model"]["activation"] = Evil;
  P.Facts["structure"]["layers"][0]["roles"][0] = Evil;
  P.Facts["memory"]["activation_bytes_per_layer_by_role"][Evil] = 5;
  P.Facts["memory"]["formula"]["text"] = Evil;
  P.Facts["memory"]["layer_recompute"][0] = Evil;
  P.Facts["bubble"]["schedule"] = Evil;
  P.Facts["source"] = Evil;
  P.Facts["collective_calls"] = Evil;
  P.Facts["auto"] = {{"cluster", Evil},
                     {"fits", {{{"layout", Evil}, {"recompute", Evil}}}},
                     {"rejected", {Evil}}};
  P.LossChart.Caption = Evil;
  std::string Html = renderReportPage(P);
  EXPECT_NE(Html.find(escapeHtml(Evil)), std::string::npos);
  EXPECT_EQ(Html.find("<img"), std::string::npos);
  EXPECT_EQ(Html.find("alert(1)</script>"), std::string::npos);
  // The page's own two scripts, and no other.
  EXPECT_EQ(occurrences(Html, "<script"), 2u);
  EXPECT_EQ(occurrences(Html, "</script>"), 2u);
  // Every tag's attributes are the page's own: no src, no event handler.
  std::set<std::string> Names = attributeNames(Html);
  EXPECT_TRUE(Names.count("class") && Names.count("aria-label"));
  EXPECT_FALSE(Names.count("src"));
  for (const std::string &Name : Names)
    EXPECT_FALSE(StringRef(Name).startswith("on")) << Name;
  EXPECT_EQ(escapeHtml("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
}

TEST(HtmlReport, OddFactsDoNotThrow) {
  // A plan directory is user input: a manifest with every entry of the
  // wrong type still gives a page, without the lines it cannot fill.
  ReportPage P = runPage();
  for (auto &[Key, Value] : P.Facts.items()) {
    (void)Key;
    Value = "not what it should be";
  }
  P.Facts["memory"] = {{"stored_bytes_by_layer", {1, "x", nullptr}},
                       {"layer_recompute", 7},
                       {"activation_layer", "one"}};
  P.Facts["parallel"] = {{"pp", "two"}, {"microbatches", 4.5}};
  std::string Html;
  EXPECT_NO_THROW(Html = renderReportPage(P));
  EXPECT_NE(Html.find("<section id=\"memory\">"), std::string::npos);
  P.Facts = nlohmann::json::array({1, 2});
  EXPECT_NO_THROW(Html = renderReportPage(P));
  EXPECT_NE(Html.find("<section id=\"training\">"), std::string::npos);
}

TEST(HtmlReport, InlineSvgKeepsOnlyDrawing) {
  auto Ok = inlineSvg(TinySvg, "chart-x", "a \"chart\"");
  ASSERT_TRUE(bool(Ok)) << toString(Ok.takeError());
  EXPECT_EQ(Ok->find("xmlns"), std::string::npos);
  EXPECT_EQ(Ok->rfind("<svg id=\"chart-x\" class=\"chart\" role=\"img\" "
                      "aria-label=\"a &quot;chart&quot;\" width=\"100\"",
                      0),
            0u);
  EXPECT_NE(Ok->find("<text x=\"5\" y=\"20\">a &amp; b</text></svg>"),
            std::string::npos);
  auto Prolog =
      inlineSvg(std::string("<?xml version=\"1.0\"?>\n") + TinySvg, "c", "c");
  EXPECT_TRUE(bool(Prolog)) << toString(Prolog.takeError());

  for (auto [Svg, Why] : std::vector<std::pair<std::string, std::string>>{
           {"<svg><script>alert(1)</script></svg>", "a <script> element"},
           {"<svg onload=\"alert(1)\"></svg>", "an event handler (onload)"},
           {"<svg><a href=\"x\"><rect/></a></svg>", "a <a> element"},
           {"<svg><rect xlink:href=\"#x\"/></svg>", "a reference (xlink:href)"},
           {"<svg><rect fill=\"url(http://x/y)\"/></svg>", "a URL in fill"},
           {"<svg><foreignObject/></svg>", "a <foreignObject> element"},
           {"<svg><!-- x --></svg>", "a comment"},
           {"<svg><rect width=5/></svg>", "an unquoted attribute (width)"},
           {"<svg><g></svg>", "a </svg> where </g> belongs"},
           {"<svg></g></svg>", "a </g> where </svg> belongs"},
           {"<svg><g>", "an unterminated <svg> element"},
           {"<svg></svg><script/>", "an element after </svg>"},
           {"<html></html>", "not an SVG document"}}) {
    auto R = inlineSvg(Svg, "c", "c");
    ASSERT_FALSE(bool(R)) << Svg;
    EXPECT_NE(toString(R.takeError()).find(Why), std::string::npos) << Svg;
  }

  // A refused chart is left out with the reason, never embedded.
  ReportPage P = compilePage(/*Pipelined=*/true);
  P.Schedule.Svg = "<svg><script>alert(1)</script></svg>";
  std::string Html = renderReportPage(P);
  EXPECT_EQ(Html.find("chart-schedule"), std::string::npos);
  EXPECT_NE(Html.find("The pipeline schedule is left out: it holds a "
                      "&lt;script&gt; element."),
            std::string::npos);
  EXPECT_EQ(occurrences(Html, "<script"), 2u);
}

TEST(HtmlReport, WritesAtomicallyAndReadsThePlanDirectory) {
  SmallString<128> Dir;
  ASSERT_FALSE(sys::fs::createUniqueDirectory("html-report", Dir));
  Compilation C = compileTiny(/*Pipelined=*/true);
  std::string PlanDir = (Dir + "/plan").str();
  ASSERT_FALSE(bool(writePlan(PlanDir, *C.P)));
  ReportPage P = planReportPage(C.P->Manifest, PlanDir);
  EXPECT_EQ(P.Tool, "sp-run");
  EXPECT_FALSE(P.Schedule.empty()) << "the plan's schedule.svg";
  std::string Page = (Dir + "/run.html").str();
  ASSERT_FALSE(bool(writeReportPage(Page, P)));
  auto Text = MemoryBuffer::getFile(Page);
  ASSERT_TRUE(bool(Text));
  EXPECT_EQ((*Text)->getBuffer().str(), renderReportPage(P));
  std::error_code EC;
  for (sys::fs::directory_iterator It(Dir, EC), End; It != End && !EC;
       It.increment(EC))
    EXPECT_FALSE(sys::path::filename(It->path()).startswith("."))
        << "a temporary left behind: " << It->path();
  Error Err = writeReportPage((Dir + "/no/such/x.html").str(), P);
  ASSERT_TRUE(bool(Err));
  EXPECT_NE(toString(std::move(Err)).find("x.html"), std::string::npos);
  sys::fs::remove_directories(Dir);
}

TEST(HtmlReport, CommandLineQuotesForTheShell) {
  const char *Argv[] = {"/opt/sp/build/bin/sp-compile",
                        "m.onnx",
                        "--html",
                        "a b.html",
                        "it's",
                        "--tp=2"};
  EXPECT_EQ(commandLine(6, Argv),
            "sp-compile m.onnx --html 'a b.html' 'it'\\''s' --tp=2");
}
