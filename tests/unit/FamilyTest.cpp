//===- FamilyTest.cpp - Roles by name, family templates -------------------===//
#include "ir/Family.h"
#include "gtest/gtest.h"

using namespace sp;

namespace {
using R = Role;

const std::vector<Role> GptLayer = {
    R::Ln1, R::Qkv, R::SplitHeads, R::Qk, R::Scale, R::Mask, R::Softmax, R::Av,
    R::MergeHeads, R::Proj, R::Residual1, R::Ln2, R::Fc1, R::Act, R::Fc2,
    R::Residual2};
const std::vector<Role> LlamaLayer = {
    R::Ln1, R::Q, R::K, R::V, R::QHeads, R::KHeads, R::VHeads, R::Qk,
    R::Softmax, R::Av, R::MergeHeads, R::Proj, R::Residual1, R::Ln2, R::Gate,
    R::Up, R::Act, R::Glu, R::Fc2, R::Residual2};

TEST(Roles, ParseWhatTheyPrintAndRefuseUnknownNames) {
  for (unsigned I = 0; I < NumRoles; ++I)
    EXPECT_EQ(parseRole(roleName(Role(I))), Role(I)) << roleName(Role(I)).str();
  EXPECT_EQ(parseRole(""), Role::None);
  EXPECT_EQ(parseRole("lm-head"), std::nullopt);
  EXPECT_EQ(parseRole("qkv_accumulate"), std::nullopt);
}

TEST(Roles, PropertiesComeFromTheTable) {
  EXPECT_EQ(roleProps(Role::Qkv).Parallel, RoleTp::Column);
  EXPECT_EQ(roleProps(Role::Qkv).Blocks, 3);
  EXPECT_EQ(roleProps(Role::Proj).F, Role::AttnFBar);
  EXPECT_EQ(roleProps(Role::Proj).Bias, Role::ProjBias);
  EXPECT_EQ(roleProps(Role::AttnF).Regather, Role::AttnFRegather);
  EXPECT_TRUE(isRegatherRole(Role::MlpFRegather));
  EXPECT_FALSE(isRegatherRole(Role::MlpF));
  EXPECT_FALSE(isRegatherRole(Role::None));
  EXPECT_EQ(roleProps(Role::PosEmbed).Split, Role::PosSplit);
  EXPECT_TRUE(isAttentionCoreRole(Role::Softmax));
  EXPECT_FALSE(isAttentionCoreRole(Role::Attention));
  EXPECT_EQ(roleGroup(Role::Fc1), RoleGroup::Mlp);
  EXPECT_EQ(roleGroupName(roleGroup(Role::Softmax)), "attention_core");
}

TEST(Families, EveryLayerFitsOneFamily) {
  ASSERT_NE(fitFamily({GptLayer, GptLayer}).Family, nullptr);
  EXPECT_STREQ(fitFamily({GptLayer, GptLayer}).Family->Name, "gpt");
  EXPECT_EQ(fitFamily({LlamaLayer}).Family, findFamily("llama"));

  FamilyFit Mixed = fitFamily({GptLayer, LlamaLayer});
  EXPECT_EQ(Mixed.Family, nullptr);
  EXPECT_EQ(Mixed.Layer, 1);
  EXPECT_EQ(Mixed.Why, "it is a llama layer but layer 0 is gpt");

  std::vector<Role> Odd = GptLayer;
  Odd.push_back(R::Glu);
  Odd.push_back(R::Glu);
  FamilyFit None = fitFamily({GptLayer, Odd});
  EXPECT_EQ(None.Layer, 1);
  EXPECT_EQ(None.Why.rfind("its blocks form no supported family: gpt has no "
                           "place for glu; llama would need",
                           0),
            0u)
      << None.Why;
}

TEST(Families, RecordsAreFoundByNameAndDescribeTheirBlocks) {
  EXPECT_EQ(findFamily("opt"), nullptr);
  const FamilyDef *Bert = findFamily("bert");
  ASSERT_NE(Bert, nullptr);
  EXPECT_TRUE(Bert->PostNorm);
  EXPECT_EQ(findFamily("llama")->Norm, NormKind::RmsNorm);
  EXPECT_EQ(findFamily("llama")->Mlp, MlpKind::Gated);
  // Every required role is a layer role the detector tags, never one the
  // parallel passes insert.
  for (const FamilyDef &F : families())
    for (Role X : F.Required)
      EXPECT_EQ(roleProps(X).Regather, Role::None) << F.Name;
}

} // namespace
