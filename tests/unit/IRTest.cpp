//===- IRTest.cpp - IR construction, printing, parsing, verification ------===//
#include "ir/AsmFormat.h"
#include "ir/Float16.h"
#include "ir/OpDef.h"
#include "ir/ShapeInference.h"
#include "ir/Verifier.h"
#include "gtest/gtest.h"
#include <cmath>
#include <cstring>

using namespace sp;
using namespace llvm;

namespace {

std::vector<char> floatBytes(std::initializer_list<float> Values) {
  std::vector<char> B(Values.size() * 4);
  std::memcpy(B.data(), Values.begin(), B.size());
  return B;
}

/// x -> layer_norm -> linear -> gelu -> output, built through the API.
std::unique_ptr<Graph> buildSmallGraph() {
  auto G = std::make_unique<Graph>("small");
  Value *X = G->addInput("x", TensorType(DType::F32, {2, 3, 4}));
  TensorType Vec(DType::F32, {4});
  Value *Gamma = G->addParam(
      "ln.weight", Vec, TensorData::makeInline(Vec, floatBytes({1, 1, 1, 1})));
  Value *Beta = G->addParam(
      "ln.bias", Vec, TensorData::makeInline(Vec, floatBytes({0, 0, 0, 0})));
  TensorType WT(DType::F32, {8, 4});
  DataRef Ref;
  Ref.K = DataRef::External;
  Ref.Path = "/nonexistent/weights.bin";
  Ref.Offset = 128;
  Ref.Length = WT.numBytes();
  Value *W = G->addParam("fc.weight", WT, TensorData::makeRef(WT, Ref));
  AttrList LNA;
  LNA.set("epsilon", 1e-5);
  Node *LN = cantFail(
      buildNode(*G, G->nodes().end(), OpKind::LayerNorm, {X, Gamma, Beta}, LNA,
                "ln"));
  LN->tags().Layer = 0;
  LN->tags().Role = Role::Ln1;
  AttrList LA;
  LA.set("trans_w", int64_t(1));
  Node *L = cantFail(buildNode(*G, G->nodes().end(), OpKind::Linear,
                               {LN->result(), W}, LA, "fc"));
  L->tags().Ph = Phase::Backward;
  L->tags().Stage = 1;
  AttrList GA;
  GA.set("approximate", std::string("tanh"));
  Node *Act = cantFail(buildNode(*G, G->nodes().end(), OpKind::Gelu,
                                 {L->result()}, GA));
  Act->result()->setSharding(Sharding::split(1, 4));
  G->addOutput("y", Act->result());
  return G;
}

TEST(IR, BuildAndVerify) {
  auto G = buildSmallGraph();
  EXPECT_FALSE(verifyGraph(*G));
  EXPECT_EQ(G->numNodes(), 3u);
  const Node &L = *std::next(G->nodes().begin());
  EXPECT_EQ(L.op(), OpKind::Linear);
  EXPECT_EQ(L.result()->type(), TensorType(DType::F32, {2, 3, 8}));
  EXPECT_EQ(L.operand(0)->users().size(), 1u);
}

TEST(IR, ParametersAreLazy) {
  auto G = buildSmallGraph();
  Value *W = G->lookup("fc.weight");
  ASSERT_TRUE(W && W->isParam());
  EXPECT_FALSE(W->data()->isLoaded());
  // The weights file does not exist: compiling never needed it, loading
  // reports it by name.
  auto D = W->data()->load();
  ASSERT_FALSE(D);
  EXPECT_NE(toString(D.takeError()).find("/nonexistent/weights.bin"),
            std::string::npos);
}

TEST(IR, PrintParseRoundTrip) {
  auto G = buildSmallGraph();
  std::string Text = graphToString(*G);
  EXPECT_NE(Text.find("[layer = 0, role = \"ln1\"]"), std::string::npos);
  EXPECT_NE(Text.find("#split(dim=1, parts=4)"), std::string::npos);
  EXPECT_NE(Text.find("phase = bwd, stage = 1"), std::string::npos);
  auto P = parseGraph(Text, "round-trip");
  ASSERT_TRUE(bool(P)) << toString(P.takeError());
  EXPECT_FALSE(verifyGraph(**P));
  EXPECT_EQ(graphToString(**P), Text);
}

/// The verifier holds every core op to its declared attributes
/// (ir/ops/): no unknown one, none of another kind, none required
/// missing, and a group only on an op that communicates.
TEST(IR, CoreOpsHaveTheirDeclaredAttributes) {
  auto Verify = [](StringRef Node) {
    std::string Text = ("graph @g {\n  input %x : f32[1, 4, 8]\n"
                        "  param %w : f32[8, 8] = dense<splat 1.0>\n  " +
                        Node + "\n  output \"y\" = %0\n}\n")
                           .str();
    auto G = parseGraph(Text, "t");
    if (!G)
      return "parse: " + toString(G.takeError());
    return toString(verifyGraph(**G));
  };
  EXPECT_EQ(Verify("%0 : f32[1, 4, 8] = linear(%x, %w) {trans_w = 1}"), "");
  EXPECT_EQ(Verify("%0 : f32[1, 4, 8] = linear(%x, %w) {trans_w = \"yes\"}"),
            "verifier: node <unnamed> (linear): attribute 'trans_w' has the "
            "wrong kind (ir/ops/)");
  EXPECT_EQ(Verify("%0 : f32[1, 2, 4, 4] = to_heads(%x)"),
            "verifier: node <unnamed> (to_heads): needs attribute 'heads'");
  EXPECT_EQ(Verify("%0 : f32[1, 4, 8] = scale(%x) {alpha = 2}"), "")
      << "an integer literal is a float";
  EXPECT_EQ(Verify("%0 : f32[1, 4, 8] = all_reduce(%x) {group = \"\"}"),
            "verifier: node <unnamed> (all_reduce): its group must be a name "
            "(tp, pp, dp or a named subgroup)");
  EXPECT_EQ(attrFloat(OpKind::LayerNorm, AttrList(), "epsilon"), 1e-5);
  EXPECT_EQ(attrInt(OpKind::CrossEntropy, AttrList(), "ignore_index"),
            IgnoreTarget);
  EXPECT_EQ(attrString(OpKind::Gelu, AttrList(), "approximate"), "none");
}

/// Every core op has its definition (ir/ops/), and each activation its
/// gradient op, derived from one line of ir/Ops.def for the SP_UNARY_OPs:
/// relu's shape, saved values, gradient and layout come from the generic
/// unary rules.
TEST(IR, EveryCoreOpIsDefined) {
  unsigned Core = 0;
  for (unsigned I = 0; I < unsigned(OpKind::PipeBroadcast) + 1; ++I) {
    OpKind K = OpKind(I);
    if (isOnnxOp(K))
      continue;
    ++Core;
    const OpDef &D = opDef(K);
    EXPECT_TRUE(D.Shape || !D.Group.empty()) << opName(K).str();
    EXPECT_LE(D.MinOperands, D.MaxOperands) << opName(K).str();
  }
  EXPECT_GT(Core, 50u);
  for (OpKind K : activationOps()) {
    const OpDef &D = opDef(K);
    EXPECT_EQ(D.MinOperands, 1u) << opName(K).str();
    EXPECT_TRUE(D.Saved && D.Grad) << opName(K).str();
  }
  EXPECT_TRUE(isActivation(OpKind::Relu));
  EXPECT_FALSE(isActivation(OpKind::Softmax));

  // relu, built and differentiated through its definition.
  auto G = parseGraph("graph @g {\n  input %x : f32[2, 3]\n"
                      "  %0 : f32[2, 3] = relu(%x)\n"
                      "  %1 : f32[2, 3] = relu_grad(%x, %0)\n"
                      "  output \"y\" = %1\n}\n",
                      "t");
  ASSERT_TRUE(bool(G)) << toString(G.takeError());
  EXPECT_EQ(toString(verifyGraph(**G)), "");
  Value *X = (*G)->inputs()[0].get();
  EXPECT_EQ(toString(inferTypes(OpKind::ReluGrad, {X}, AttrList())
                         .takeError()),
            "expected 2 operands, got 1");
}

/// Every half and bfloat16 bit pattern widens to float exactly and rounds
/// back to itself (NaNs stay NaNs); halfway cases round to even.
TEST(IR, SixteenBitFloatsRoundTrip) {
  for (uint32_t H = 0; H < 0x10000; ++H) {
    float F = halfToFloat(uint16_t(H)), B = bfloat16ToFloat(uint16_t(H));
    if (std::isnan(F))
      EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(F)))) << H;
    else
      ASSERT_EQ(floatToHalf(F), H) << H;
    if (std::isnan(B))
      EXPECT_TRUE(std::isnan(bfloat16ToFloat(floatToBFloat16(B)))) << H;
    else
      ASSERT_EQ(floatToBFloat16(B), H) << H;
  }
  EXPECT_EQ(halfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(floatToHalf(1.0f + 0x1p-11f), 0x3c00);     // tie: to even
  EXPECT_EQ(floatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02); // tie: to even
  EXPECT_EQ(floatToBFloat16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(floatToHalf(70000.0f), 0x7c00); // past the largest half: inf
}

TEST(IR, RoundTripConstantsAndAttributes) {
  const char *Text = R"(graph @"odd name" {
  input %"0ids" : i64[2, 3]
  param %w : f32[5, 4] = onnx("/m/model.onnx", "onnx::MatMul_7")
  const %eps : f32[] = dense<1e-05>
  const %half : f32[] = dense<0.5>
  const %big : f64[] = dense<-inf>
  const %shape : i64[3] = dense<[-1, 9223372036854775807, 0]>
  const %ones : f32[2, 2] = dense<splat 1.0>
  const %mask : bool[2, 2] = dense<[1, 0, 1, 1]>
  %0 : f32[2, 3, 4] = embedding(%w, %"0ids") loc("Gather_0") [role = "embed"]
  %1 : f32[2, 3, 4] = scale(%0) {alpha = 0.1, list = [1.5, -2.0], name = "a\"b", perm = [0, 2, 1]}
  output "out" = %1
}
)";
  auto G = parseGraph(Text, "t");
  ASSERT_TRUE(bool(G)) << toString(G.takeError());
  // Every kind of attribute prints and parses back; the verifier then
  // refuses the ones scale does not declare (ir/ops/).
  EXPECT_EQ(toString(verifyGraph(**G)),
            "verifier: node <unnamed> (scale): has no attribute 'list' "
            "(ir/ops/)");
  EXPECT_EQ(graphToString(**G), Text);
  auto Shape = constInts((*G)->lookup("shape"));
  ASSERT_TRUE(bool(Shape));
  EXPECT_EQ((*Shape)[1], INT64_MAX);
}

TEST(IR, ParseErrorsNameTheLine) {
  auto Check = [](const char *Text, const char *Want) {
    auto G = parseGraph(Text, "bad.sp");
    ASSERT_FALSE(G) << "expected a parse error for: " << Text;
    std::string Msg = toString(G.takeError());
    EXPECT_NE(Msg.find(Want), std::string::npos) << Msg;
  };
  Check("graph @g {\n  %0 : f32[2] = nosuch(%x)\n}", "bad.sp:2:17: unknown op 'nosuch'");
  Check("graph @g {\n  %0 : f32[2] = gelu(%x)\n}", "use of undefined value '%x'");
  Check("graph @g {\n  input %x : f99[2]\n}", "unknown element type 'f99'");
  Check("graph @g {\n  const %c : f32[2] = dense<[1.0]>\n}", "dense data has 1 elements");
  Check("graph @g {\n  input %x : f32[2]\n  input %x : f32[2]\n}", "redefinition of '%x'");
  Check("graph @g {\n  input %x : f32[2]\n", "expected '}'");
}

TEST(IR, VerifierCatchesTypeErrors) {
  const char *Text = R"(graph @g {
  input %x : f32[2, 3]
  %0 : f32[2, 4] = gelu(%x)
  output "y" = %0
}
)";
  auto G = parseGraph(Text, "t");
  ASSERT_TRUE(bool(G));
  Error E = verifyGraph(**G);
  ASSERT_TRUE(bool(E));
  EXPECT_NE(toString(std::move(E)).find("result 0 has type f32[2, 4], expected "
                                        "f32[2, 3]"),
            std::string::npos);
}

TEST(IR, VerifierCatchesArityAndShapeErrors) {
  const char *Text = R"(graph @g {
  input %x : f32[2, 3]
  param %w : f32[5, 4] = external("w.bin", 0, 80)
  %0 : f32[2, 5] = linear(%x, %w) {trans_w = 1}
  output "y" = %0
}
)";
  auto G = parseGraph(Text, "t");
  ASSERT_TRUE(bool(G));
  Error E = verifyGraph(**G);
  ASSERT_TRUE(bool(E));
  EXPECT_NE(toString(std::move(E)).find("input feature size 3 does not match"),
            std::string::npos);
}

TEST(IR, ReplaceAndErase) {
  auto G = buildSmallGraph();
  Node &LN = G->nodes().front();
  Value *X = LN.operand(0);
  // Bypass the layer norm: the linear reads x directly.
  G->replaceAllUsesWith(LN.result(), X);
  EXPECT_FALSE(LN.result()->hasUsers());
  G->erase(&LN);
  EXPECT_EQ(G->numNodes(), 2u);
  EXPECT_FALSE(verifyGraph(*G));
  EXPECT_EQ(G->removeUnusedConstants(), 2u); // ln.weight, ln.bias
  EXPECT_EQ(G->params().size(), 1u);
}

} // namespace
