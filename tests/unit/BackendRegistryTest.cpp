//===- BackendRegistryTest.cpp - The backends by --device name ------------===//
//
// runtime/BackendRegistry.h: the CPU backend is there from the start and
// makes CpuBackends; entries are found by name and by their flags; --device
// values are read as NAME or NAME:N; the CPU's notes say how it computes a
// 16-bit plan.
//
//===----------------------------------------------------------------------===//
#include "plan/Plan.h"
#include "runtime/BackendRegistry.h"
#include "gtest/gtest.h"

using namespace sp;
using namespace llvm;

TEST(BackendRegistry, CpuIsRegisteredAndMakesItsBackend) {
  const BackendRegistry &R = BackendRegistry::instance();
  const BackendEntry *Cpu = R.find("cpu");
  ASSERT_TRUE(Cpu);
  EXPECT_EQ(Cpu->Description, "cpu (default)");
  EXPECT_TRUE(Cpu->PeakIsPerProcess);
  EXPECT_TRUE(Cpu->NoFloat64Reason.empty());
  auto B = Cpu->Create(BackendContext());
  ASSERT_TRUE(bool(B)) << toString(B.takeError());
  EXPECT_EQ((*B)->name(), "cpu");
  EXPECT_TRUE((*B)->hostMemory());
  EXPECT_FALSE(R.find("no-such-device"));
}

TEST(BackendRegistry, CpuNotesSayHowA16BitPlanComputes) {
  const BackendEntry *Cpu = BackendRegistry::instance().find("cpu");
  ASSERT_TRUE(Cpu && Cpu->Notes);
  Plan P;
  P.Manifest = {{"dtype", "f32"}};
  EXPECT_TRUE(Cpu->Notes(P, BackendContext()).Lines.empty());
  P.Manifest = {{"dtype", "f16"}};
  BackendNotes N = Cpu->Notes(P, BackendContext());
  ASSERT_EQ(N.Lines.size(), 1u);
  EXPECT_EQ(N.Lines[0], "fp16 compute: float32 on widened copies, each "
                        "result rounded once");
  P.Manifest = {{"dtype", "bf16"}};
  N = Cpu->Notes(P, BackendContext());
  ASSERT_EQ(N.Lines.size(), 1u);
  EXPECT_EQ(N.Lines[0].rfind("bf16 compute: ", 0), 0u) << N.Lines[0];
}

TEST(BackendRegistry, EntriesByNameFlagAndDeviceSpec) {
  BackendRegistry &R = BackendRegistry::instance();
  int Made = 0;
  BackendEntry E;
  E.Name = "regtest";
  E.Description = "regtest (a unit test's)";
  E.IndexMeaning = "a unit index";
  E.Flags = {{"regtest-flag", "help", {}, ""}};
  E.Create = [&Made](const BackendContext &C)
      -> Expected<std::unique_ptr<Backend>> {
    ++Made;
    EXPECT_EQ(C.DeviceIndex, 3);
    EXPECT_EQ(C.flag("regtest-flag"), "true");
    EXPECT_EQ(C.flag("other", "dflt"), "dflt");
    return createStringError(inconvertibleErrorCode(), "no regtest here");
  };
  R.add(E);
  R.add(E); // again: replaces, not a second entry
  EXPECT_EQ(count_if(R.entries(),
                     [](const BackendEntry *X) { return X->Name == "regtest"; }),
            1);
  EXPECT_EQ(R.entries().front()->Name, "cpu"); // in registration order
  EXPECT_EQ(R.ownerOfFlag("regtest-flag"), R.find("regtest"));
  EXPECT_FALSE(R.ownerOfFlag("steps"));

  auto C = R.parseDevice("regtest:3");
  ASSERT_TRUE(bool(C)) << toString(C.takeError());
  EXPECT_EQ(C->Entry, R.find("regtest"));
  EXPECT_EQ(C->Index, 3);
  auto Cpu = R.parseDevice("cpu");
  ASSERT_TRUE(bool(Cpu));
  EXPECT_FALSE(Cpu->Index);
  for (const char *Bad : {"cpu:0", "regtest:", "regtest:-1", "regtest:x", ""}) {
    auto D = R.parseDevice(Bad);
    ASSERT_FALSE(bool(D)) << Bad;
    std::string Msg = toString(D.takeError());
    EXPECT_NE(Msg.find("--device must be cpu"), std::string::npos) << Msg;
    EXPECT_NE(Msg.find("regtest:N"), std::string::npos) << Msg;
  }
  EXPECT_NE(R.deviceValueDesc().find("regtest[:N]"), std::string::npos);

  BackendContext Ctx;
  Ctx.DeviceIndex = C->Index;
  Ctx.Flags["regtest-flag"] = "true";
  auto B = C->Entry->Create(Ctx);
  EXPECT_EQ(Made, 1);
  ASSERT_FALSE(bool(B));
  EXPECT_EQ(toString(B.takeError()), "no regtest here");
}
