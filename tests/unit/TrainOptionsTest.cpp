//===- TrainOptionsTest.cpp - The training library's options and flags ----===//
//
// TrainOptions::validate names the bad flag and what to give (the same
// lines sp-run prints; tests/bad-inputs checks them through the tool), the
// defaults that depend on other settings, and TrainFlags filling the
// options from a command line.
//
//===----------------------------------------------------------------------===//
#include "runtime/BackendRegistry.h"
#include "train/TrainFlags.h"
#include "train/TrainOptions.h"
#include "gtest/gtest.h"

using namespace sp;
using namespace llvm;

namespace {

/// A run that validates: a plan and synthetic data.
TrainOptions valid() {
  TrainOptions O;
  O.PlanDir = "plan";
  O.SyntheticData = true;
  return O;
}

std::string problem(const TrainOptions &O) {
  Error E = O.validate();
  return E ? toString(std::move(E)) : "";
}

/// A backend with an index and a flag of its own, beside the CPU.
void registerTestDevice() {
  BackendEntry E;
  E.Name = "testdev";
  E.Description = "testdev (a unit test's)";
  E.IndexMeaning = "a test device index";
  E.Flags = {{"testdev-mode", "how it runs", {"fast", "exact"}, "fast|exact"},
             {"testdev-switch", "a switch", {}, ""}};
  E.NoFloat64Reason = "the test device is float32";
  BackendRegistry::instance().add(std::move(E));
}

} // namespace

TEST(TrainOptions, DefaultsValidate) {
  EXPECT_EQ(problem(valid()), "");
}

TEST(TrainOptions, NamesTheBadFlagAndWhatToGive) {
  TrainOptions O = valid();
  O.Steps = 0;
  EXPECT_EQ(problem(O), "--steps must be a positive integer");

  O = valid();
  O.MinLR = 1e-2;
  O.Given.insert("min-lr");
  EXPECT_EQ(problem(O), "--min-lr 1.0e-02 is above the peak --lr 1.0e-03");

  O = valid();
  O.SyntheticData = false;
  EXPECT_EQ(problem(O), "--data FILE is required (a token file from "
                        "sp-tokenize), or --synthetic-data for a benchmark");

  O = valid();
  O.Given.insert("eval-steps");
  EXPECT_EQ(problem(O),
            "--eval-steps needs --val-data FILE (the held-out tokens)");

  O = valid();
  O.Eval = true;
  O.Resume = true;
  EXPECT_EQ(problem(O),
            "--eval does not train; it cannot be combined with --resume");

  O = valid();
  O.Given.insert("sample");
  O.SamplePrompt = "def ";
  EXPECT_EQ(problem(O), "--sample generates text from the weights; it cannot "
                        "be combined with --synthetic-data");

  O = valid();
  O.Given.insert("checkpoint");
  EXPECT_EQ(problem(O), "--checkpoint DIR needs --checkpoint-every N or "
                        "--checkpoint-on-exit (to write) or --resume (to "
                        "read)");

  O = valid();
  O.Comm = "pigeons";
  EXPECT_EQ(problem(O), "--comm must be threads or mpi, got 'pigeons'");
}

TEST(TrainOptions, DefaultsFromOtherSettings) {
  TrainOptions O = valid();
  O.PlanDir = "p";
  O.LR = 3e-4;
  O.Steps = 55;
  EXPECT_DOUBLE_EQ(O.minLR(), 3e-5);
  EXPECT_EQ(O.evalEvery(), 5);
  EXPECT_EQ(O.checkpointDir(), "p/checkpoint");
  EXPECT_EQ(O.logDir(), "p/run");
  EXPECT_FALSE(O.dropout());
  O.Given.insert("dropout");
  EXPECT_EQ(O.dropout(), 0.0);
  O.LogDir = "logs";
  O.Given.insert("log-dir");
  EXPECT_EQ(O.logDir(), "logs");
}

TEST(TrainOptions, DeviceAndItsFlagsComeFromTheRegistry) {
  registerTestDevice();
  TrainOptions O = valid();
  O.Device = "tpu";
  std::string Bad = problem(O);
  EXPECT_NE(Bad.find("--device must be cpu, "), std::string::npos) << Bad;
  EXPECT_NE(Bad.find("testdev:N"), std::string::npos) << Bad;
  EXPECT_NE(Bad.find("N a test device index"), std::string::npos) << Bad;
  EXPECT_NE(Bad.find("got 'tpu'"), std::string::npos) << Bad;

  O.Device = "cpu:1";
  EXPECT_NE(problem(O).find("got 'cpu:1'"), std::string::npos);
  O.Device = "testdev:1";
  EXPECT_EQ(problem(O), "");
  EXPECT_EQ(O.deviceName(), "testdev");

  // A backend's flag: its values, and only with its device.
  O.BackendFlags["testdev-mode"] = "slow";
  EXPECT_EQ(problem(O), "--testdev-mode must be fast or exact, got 'slow'");
  O.BackendFlags["testdev-mode"] = "exact";
  EXPECT_EQ(problem(O), "");
  O.Device = "cpu";
  EXPECT_EQ(problem(O), "--testdev-mode is for --device testdev");

  O = valid();
  O.Device = "testdev";
  O.Float64 = true;
  // (Other tests' backends may be registered beside cpu.)
  std::string Float64 = problem(O);
  EXPECT_EQ(Float64.rfind("--float64 runs on --device cpu", 0), 0u) << Float64;
  EXPECT_NE(Float64.find(" (the test device is float32)"), std::string::npos)
      << Float64;
}

TEST(TrainFlags, FillTheOptionsDirectly) {
  cl::OptionCategory Cat("test options");
  TrainOptions O;
  {
    TrainFlags Flags(O, Cat);
    const char *Argv[] = {"sp-run",        "the-plan", "--steps",
                          "7",             "--min-lr", "2e-5",
                          "--objective",   "masked-lm", "--mask-rate",
                          "0.2",           "--synthetic-data"};
    ASSERT_TRUE(cl::ParseCommandLineOptions(std::size(Argv), Argv, "",
                                            &llvm::nulls()));
    Flags.collect();
  } // the flags unregister; the options keep what they were given
  EXPECT_EQ(O.PlanDir, "the-plan");
  EXPECT_EQ(O.Steps, 7);
  EXPECT_DOUBLE_EQ(O.minLR(), 2e-5);
  EXPECT_EQ(O.Obj.Kind, Objective::MaskedLM);
  EXPECT_DOUBLE_EQ(O.Obj.MaskRate, 0.2);
  EXPECT_TRUE(O.SyntheticData);
  EXPECT_TRUE(O.given("steps") && O.given("min-lr") && O.given("mask-rate"));
  EXPECT_FALSE(O.given("lr"));
  EXPECT_EQ(O.LR, 1e-3); // untouched: its default
  EXPECT_EQ(problem(O), "");
}
