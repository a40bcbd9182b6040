//===- RolesTest.cpp - Family templates -----------------------------------===//
#include "passes/Roles.h"
#include "gtest/gtest.h"

using namespace sp;

namespace {

const std::vector<std::string> GptLayer = {
    "ln1", "qkv", "split_heads", "qk", "scale", "mask", "softmax", "av",
    "merge_heads", "proj", "residual1", "ln2", "fc1", "act", "fc2",
    "residual2"};
const std::vector<std::string> LlamaLayer = {
    "ln1", "q", "k", "v", "q_heads", "k_heads", "v_heads", "qk", "softmax",
    "av", "merge_heads", "proj", "residual1", "ln2", "gate", "up", "act",
    "glu", "fc2", "residual2"};

TEST(Roles, EveryLayerFitsOneFamily) {
  EXPECT_STREQ(fitFamily({GptLayer, GptLayer}).Family, "gpt");
  EXPECT_STREQ(fitFamily({LlamaLayer}).Family, "llama");

  FamilyFit Mixed = fitFamily({GptLayer, LlamaLayer});
  EXPECT_EQ(Mixed.Family, nullptr);
  EXPECT_EQ(Mixed.Layer, 1);
  EXPECT_EQ(Mixed.Why, "it is a llama layer but layer 0 is gpt");

  std::vector<std::string> Odd = GptLayer;
  Odd.push_back("glu");
  Odd.push_back("glu");
  FamilyFit None = fitFamily({GptLayer, Odd});
  EXPECT_EQ(None.Layer, 1);
  EXPECT_EQ(None.Why.rfind("its blocks form no supported family: gpt has no "
                           "place for glu; llama would need",
                           0),
            0u)
      << None.Why;
}

} // namespace
