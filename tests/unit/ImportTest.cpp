//===- ImportTest.cpp - The ONNX importer
//----------------------------------===//
//
// Builds small ModelProtos with the protobuf API, writes them to a temporary
// folder and imports them. The last test imports real torch exports made by
// models/export_gpt.py with /usr/bin/python3 (Debian python3-torch); a
// missing torch fails the test, since CI installs it.
//
//===----------------------------------------------------------------------===//
#include "frontend/OnnxImporter.h"
#include "ir/AsmFormat.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "gtest/gtest.h"

#include "TestSupport.h"
#include "onnx/onnx_pb.h"
#include <cstring>
#include <fstream>
#include <map>

using namespace sp;
using namespace sp::test;
using namespace llvm;

namespace {

/// Dimension of a graph input: a value or a symbolic name.
struct Dim {
  Dim(int64_t V) : Value(V) {}
  Dim(const char *P) : Param(P) {}
  int64_t Value = -1;
  std::string Param;
};

/// Builds a ModelProto.
class ModelBuilder {
public:
  explicit ModelBuilder(int64_t Opset = 17) {
    M.set_ir_version(8);
    M.set_producer_name("sp-test");
    auto *O = M.add_opset_import();
    O->set_domain("");
    O->set_version(Opset);
    G = M.mutable_graph();
    G->set_name("test");
  }

  void input(const std::string &Name, int32_t Elem, std::vector<Dim> Dims) {
    auto *I = G->add_input();
    I->set_name(Name);
    auto *T = I->mutable_type()->mutable_tensor_type();
    T->set_elem_type(Elem);
    auto *S = T->mutable_shape();
    for (const Dim &D : Dims) {
      auto *X = S->add_dim();
      if (!D.Param.empty())
        X->set_dim_param(D.Param);
      else if (D.Value >= 0)
        X->set_dim_value(D.Value);
    }
  }
  void output(const std::string &Name) { G->add_output()->set_name(Name); }

  onnx::NodeProto *node(const std::string &Op, std::vector<std::string> In,
                        std::vector<std::string> Out,
                        const std::string &Name = "") {
    auto *N = G->add_node();
    N->set_op_type(Op);
    N->set_name(Name);
    for (auto &I : In)
      N->add_input(I);
    for (auto &O : Out)
      N->add_output(O);
    return N;
  }
  static void attr(onnx::NodeProto *N, const std::string &Name, int64_t V) {
    auto *A = N->add_attribute();
    A->set_name(Name);
    A->set_type(onnx::AttributeProto::INT);
    A->set_i(V);
  }
  static void attr(onnx::NodeProto *N, const std::string &Name,
                   std::vector<int64_t> V) {
    auto *A = N->add_attribute();
    A->set_name(Name);
    A->set_type(onnx::AttributeProto::INTS);
    for (int64_t X : V)
      A->add_ints(X);
  }

  /// A Constant node with int64 values (a scalar when Dims is empty).
  void constInts(const std::string &Out, std::vector<int64_t> V,
                 std::vector<int64_t> Dims) {
    auto *N = node("Constant", {}, {Out}, Out + "_node");
    auto *A = N->add_attribute();
    A->set_name("value");
    A->set_type(onnx::AttributeProto::TENSOR);
    auto *T = A->mutable_t();
    T->set_data_type(onnx::TensorProto::INT64);
    for (int64_t D : Dims)
      T->add_dims(D);
    for (int64_t X : V)
      T->add_int64_data(X);
  }

  onnx::TensorProto *initializer(const std::string &Name, int32_t Elem,
                                 std::vector<int64_t> Dims) {
    auto *T = G->add_initializer();
    T->set_name(Name);
    T->set_data_type(Elem);
    for (int64_t D : Dims)
      T->add_dims(D);
    return T;
  }
  /// A float initializer whose values are 0, 1, 2, ... in raw_data.
  onnx::TensorProto *floatInit(const std::string &Name,
                               std::vector<int64_t> Dims) {
    auto *T = initializer(Name, onnx::TensorProto::FLOAT, Dims);
    int64_t N = 1;
    for (int64_t D : Dims)
      N *= D;
    std::vector<float> V(N);
    for (int64_t I = 0; I < N; ++I)
      V[I] = float(I);
    T->set_raw_data(
        std::string(reinterpret_cast<const char *>(V.data()), V.size() * 4));
    return T;
  }
  static void external(onnx::TensorProto *T, const std::string &Location,
                       int64_t Offset) {
    T->clear_raw_data();
    T->set_data_location(onnx::TensorProto::EXTERNAL);
    auto *L = T->add_external_data();
    L->set_key("location");
    L->set_value(Location);
    auto *O = T->add_external_data();
    O->set_key("offset");
    O->set_value(std::to_string(Offset));
  }

  std::string write(const TempDir &Dir, const std::string &Name = "m.onnx") {
    std::string P = Dir.file(Name);
    std::ofstream F(P, std::ios::binary);
    M.SerializeToOstream(&F);
    return P;
  }

  onnx::ModelProto M;
  onnx::GraphProto *G;
};

std::unique_ptr<Graph> importOk(const std::string &Path,
                                const ImportOptions &Opts = {}) {
  auto G = importOnnx(Path, Opts);
  if (!G) {
    ADD_FAILURE() << toString(G.takeError());
    return nullptr;
  }
  return std::move(*G);
}

std::string importError(const std::string &Path,
                        const ImportOptions &Opts = {}) {
  auto G = importOnnx(Path, Opts);
  if (G) {
    ADD_FAILURE() << "import succeeded";
    return "";
  }
  std::string Msg = toString(G.takeError());
  EXPECT_EQ(Msg.find('\n'), std::string::npos) << "not one line: " << Msg;
  return Msg;
}

std::map<std::string, int> opHistogram(const Graph &G) {
  std::map<std::string, int> H;
  for (const Node &N : G.nodes())
    ++H[N.opName().str()];
  return H;
}

const int32_t F32 = onnx::TensorProto::FLOAT;
const int32_t I64 = onnx::TensorProto::INT64;

TEST(Import, ShapeSubgraphFoldsAway) {
  TempDir Dir;
  ModelBuilder B;
  B.input("x", F32, {2, 3, 4});
  B.node("Shape", {"x"}, {"s"}, "shape");
  B.constInts("zero", {0}, {});
  B.node("Gather", {"s", "zero"}, {"b"}, "gather");
  B.constInts("axes", {0}, {1});
  B.node("Unsqueeze", {"b", "axes"}, {"b1"}, "unsqueeze");
  B.constInts("minus1", {-1}, {1});
  auto *C = B.node("Concat", {"b1", "minus1"}, {"shape_out"}, "concat");
  ModelBuilder::attr(C, "axis", int64_t(0));
  B.node("Reshape", {"x", "shape_out"}, {"y"}, "reshape");
  B.output("y");
  auto G = importOk(B.write(Dir));
  ASSERT_TRUE(G);
  ASSERT_EQ(G->numNodes(), 1u);
  const Node &R = G->nodes().front();
  EXPECT_EQ(R.op(), OpKind::OnnxReshape);
  EXPECT_EQ(R.name(), "reshape");
  EXPECT_EQ(R.result()->type(), TensorType(DType::F32, {2, 12}));
  const Value *Shape = R.operand(1);
  ASSERT_TRUE(Shape->isConst());
  EXPECT_EQ(Shape->name(), "shape_out");
  ASSERT_TRUE(Shape->data()->isInline());
  EXPECT_EQ(Shape->data()->getInt(0), 2);
  EXPECT_EQ(Shape->data()->getInt(1), -1);
  // The intermediate constants are gone; the output keeps its ONNX name.
  EXPECT_EQ(G->consts().size(), 1u);
  ASSERT_EQ(G->outputs().size(), 1u);
  EXPECT_EQ(G->outputs()[0].Name, "y");
  EXPECT_EQ(G->name(), "test");
}

TEST(Import, ExternalDataIsReferencedNotRead) {
  TempDir Dir;
  ModelBuilder B;
  B.input("x", F32, {2, 4});
  auto *W = B.floatInit("W", {4, 4});
  ModelBuilder::external(W, "weights/w.bin", 128);
  B.node("MatMul", {"x", "W"}, {"y"}, "mm");
  B.output("y");
  std::string Path = B.write(Dir);
  auto G = importOk(Path); // weights/w.bin does not exist
  ASSERT_TRUE(G);
  ASSERT_EQ(G->params().size(), 1u);
  const Value *P = G->params()[0].get();
  EXPECT_EQ(P->name(), "W");
  const DataRef &Ref = P->data()->ref();
  EXPECT_EQ(Ref.K, DataRef::External);
  EXPECT_EQ(Ref.Path, Dir.file("weights/w.bin"));
  EXPECT_EQ(Ref.Offset, 128);
  EXPECT_EQ(Ref.Length, 64);
  EXPECT_FALSE(P->data()->isLoaded());
  // Loading fails, naming the file.
  auto Bytes = P->data()->load();
  ASSERT_FALSE(bool(Bytes));
  EXPECT_NE(toString(Bytes.takeError()).find(Dir.file("weights/w.bin")),
            std::string::npos);
}

TEST(Import, ExternalDataMayNotEscapeTheModelFolder) {
  TempDir Dir;
  for (std::string Location : {"../x.bin", "a/../../x.bin", "/etc/passwd"}) {
    ModelBuilder B;
    B.input("x", F32, {2, 4});
    auto *W = B.floatInit("W", {4, 4});
    ModelBuilder::external(W, Location, 0);
    B.node("MatMul", {"x", "W"}, {"y"}, "mm");
    B.output("y");
    std::string Path = B.write(Dir);
    std::string Msg = importError(Path);
    if (Location[0] == '/')
      EXPECT_EQ(Msg, Path +
                         ": external data location '/etc/passwd' of "
                         "initializer 'W' is an absolute path; it must be "
                         "relative to the model folder '" +
                         Dir.Path + "'");
    else
      EXPECT_EQ(Msg, Path + ": external data location '" + Location +
                         "' of initializer 'W' escapes the model folder '" +
                         Dir.Path + "'");
  }
}

TEST(Import, BadFilesGiveOneLineErrorsNamingTheFile) {
  TempDir Dir;
  std::string Missing = Dir.file("missing.onnx");
  EXPECT_EQ(importError(Missing),
            Missing + ": cannot read the model: No such file or directory");

  std::string Text = Dir.file("text.onnx");
  std::ofstream(Text) << "hello, this is not a model\n";
  EXPECT_EQ(importError(Text),
            Text + ": not an ONNX model (it does not parse as an ONNX "
                   "ModelProto)");

  std::string Empty = Dir.file("empty.onnx");
  std::ofstream(Empty).close();
  EXPECT_EQ(importError(Empty),
            Empty + ": not an ONNX model (it has no ir_version)");

  ModelBuilder B;
  B.input("x", F32, {2, 4});
  B.floatInit("W", {4, 4});
  B.node("MatMul", {"x", "W"}, {"y"}, "mm");
  B.output("y");
  std::string Full;
  B.M.SerializeToString(&Full);
  std::string Truncated = Dir.file("truncated.onnx");
  std::ofstream(Truncated, std::ios::binary) << Full.substr(0, Full.size() / 2);
  std::string Msg = importError(Truncated);
  EXPECT_EQ(Msg.rfind(Truncated + ": the file is truncated (", 0), 0u) << Msg;

  ModelBuilder NoNodes;
  NoNodes.input("x", F32, {2});
  NoNodes.output("x");
  std::string NoNodesPath = NoNodes.write(Dir, "nonodes.onnx");
  EXPECT_EQ(importError(NoNodesPath),
            NoNodesPath + ": not an ONNX model (its graph has no nodes)");
}

TEST(Import, UnsupportedOpNamesTheNode) {
  TempDir Dir;
  ModelBuilder B;
  B.input("x", F32, {1, 3, 8, 8});
  B.floatInit("k", {4, 3, 3, 3});
  B.node("Conv", {"x", "k"}, {"y"}, "stem/conv");
  B.output("y");
  std::string Path = B.write(Dir);
  std::string Msg = importError(Path);
  EXPECT_EQ(Msg.rfind(Path + ": node 'stem/conv' (Conv): unsupported op; "
                             "supported ops are Add, And, Cast, Concat, "
                             "Constant, ",
                      0),
            0u)
      << Msg;

  ModelBuilder C;
  C.input("x", F32, {2});
  auto *N = C.node("Gelu", {"x"}, {"y"});
  N->set_domain("com.microsoft");
  C.output("y");
  std::string CPath = C.write(Dir, "ms.onnx");
  EXPECT_EQ(importError(CPath),
            CPath + ": node 'Gelu_0' (Gelu): unsupported op domain "
                    "'com.microsoft'; sp supports only the default ONNX "
                    "domain");
}

TEST(Import, OpsetOutOfRange) {
  TempDir Dir;
  ModelBuilder B(11);
  B.input("x", F32, {2});
  B.node("Neg", {"x"}, {"y"});
  B.output("y");
  std::string Path = B.write(Dir);
  EXPECT_EQ(importError(Path),
            Path + ": model uses opset 11; sp supports opsets 13 to 17");
}

TEST(Import, SymbolicDimensionsMustBeBound) {
  TempDir Dir;
  ModelBuilder B;
  B.input("idx", I64, {"batch", "seq"});
  B.input("h", F32, {"batch", "seq", "hidden"});
  B.node("Neg", {"h"}, {"y"});
  B.output("y");
  std::string Path = B.write(Dir);
  EXPECT_EQ(importError(Path), Path + ": input 'idx' has symbolic dimension "
                                      "'batch' (dim 0); bind it with --batch "
                                      "N");
  ImportOptions O;
  O.Batch = 2;
  EXPECT_EQ(importError(Path, O), Path + ": input 'idx' has symbolic "
                                         "dimension 'seq' (dim 1); bind it "
                                         "with --seq N");
  O.Seq = 3;
  EXPECT_EQ(importError(Path, O), Path + ": input 'h' has symbolic dimension "
                                         "'hidden' (dim 2); bind it with "
                                         "--dim hidden=N");
  O.DimValues["hidden"] = 5;
  auto G = importOk(Path, O);
  ASSERT_TRUE(G);
  ASSERT_EQ(G->inputs().size(), 2u);
  EXPECT_EQ(G->inputs()[0]->type(), TensorType(DType::I64, {2, 3}));
  EXPECT_EQ(G->inputs()[1]->type(), TensorType(DType::F32, {2, 3, 5}));
  EXPECT_EQ(G->outputs()[0].V->type(), TensorType(DType::F32, {2, 3, 5}));

  // Names win over positions; a static size must match the flag.
  ImportOptions N;
  N.DimValues["batch"] = 4;
  N.DimValues["seq"] = 8;
  N.DimValues["hidden"] = 1;
  G = importOk(Path, N);
  ASSERT_TRUE(G);
  EXPECT_EQ(G->inputs()[0]->type(), TensorType(DType::I64, {4, 8}));

  ModelBuilder S;
  S.input("idx", I64, {4, 64});
  S.node("Neg", {"idx"}, {"y"});
  S.output("y");
  std::string SPath = S.write(Dir, "static.onnx");
  ImportOptions W;
  W.Batch = 8;
  EXPECT_EQ(importError(SPath, W),
            SPath + ": input 'idx' has static dimension 4 (dim 0), but "
                    "--batch 8 was given");
}

TEST(Import, ParametersAndConstants) {
  TempDir Dir;
  ModelBuilder B;
  B.input("idx", I64, {2, 4});
  // Listed as a graph input too, as older exporters do.
  B.input("wte", F32, {10, 4});
  B.floatInit("wte", {10, 4});
  B.node("Gather", {"wte", "idx"}, {"e"}, "embed");
  B.floatInit("ln.weight", {4});
  B.floatInit("ln.bias", {4});
  B.node("LayerNormalization", {"e", "ln.weight", "ln.bias"}, {"n"}, "ln");
  B.floatInit("fc.weight", {4, 4});
  B.node("Transpose", {"fc.weight"}, {"wt"}, "t");
  B.node("Identity", {"wt"}, {"wt2"}, "id");
  B.node("MatMul", {"n", "wt2"}, {"h"}, "fc");
  B.floatInit("fc.bias", {4});
  B.node("Add", {"fc.bias", "h"}, {"hb"}, "bias");
  B.floatInit("scale", {});
  B.node("Mul", {"hb", "scale"}, {"hs"}, "scale");
  // A float tril buffer that feeds mask logic only: a constant.
  B.floatInit("tril", {16, 16}); // large enough to stay a reference
  B.constInts("zero4", {0, 0}, {2});
  B.constInts("end4", {4, 4}, {2});
  B.node("Slice", {"tril", "zero4", "end4"}, {"tril_s"}, "slice");
  B.floatInit("zero", {});
  B.node("Equal", {"tril_s", "zero"}, {"masked"}, "eq");
  B.floatInit("neg_inf", {});
  B.node("Where", {"masked", "neg_inf", "hs"}, {"y"}, "where");
  // Shapes are constants (and inline, being small).
  auto *Shape = B.initializer("shape", I64, {2});
  Shape->add_int64_data(8);
  Shape->add_int64_data(-1);
  B.node("Reshape", {"y", "shape"}, {"out"}, "reshape");
  B.output("out");
  auto G = importOk(B.write(Dir));
  ASSERT_TRUE(G);
  std::vector<std::string> Params, Consts;
  for (const auto &V : G->params())
    Params.push_back(V->name());
  for (const auto &V : G->consts())
    Consts.push_back(V->name());
  EXPECT_EQ(Params, (std::vector<std::string>{"wte", "ln.weight", "ln.bias",
                                              "fc.weight", "fc.bias"}));
  for (StringRef C : {"scale", "tril", "zero", "neg_inf", "shape"})
    EXPECT_TRUE(is_contained(Consts, C)) << C.str();
  ASSERT_EQ(G->inputs().size(), 1u);
  EXPECT_EQ(G->inputs()[0]->name(), "idx");
  // Parameters reference the model; small constants are inline.
  const DataRef &Ref = G->params()[0]->data()->ref();
  EXPECT_EQ(Ref.K, DataRef::OnnxInitializer);
  EXPECT_EQ(Ref.Key, "wte");
  EXPECT_TRUE(G->lookup("shape")->data()->isInline());
  EXPECT_EQ(G->outputs()[0].V->type(), TensorType(DType::F32, {8, 4}));
}

TEST(Import, EmbeddedInitializersLoadLazily) {
  TempDir Dir;
  ModelBuilder B;
  B.input("x", F32, {3, 100});
  B.floatInit("w", {100});                  // raw_data
  auto *T = B.initializer("v", F32, {100}); // float_data
  for (int I = 0; I < 100; ++I)
    T->add_float_data(float(-I));
  B.node("Mul", {"x", "w"}, {"y"}, "mul");
  B.node("Add", {"y", "v"}, {"z"}, "add");
  B.output("z");
  std::string Path = B.write(Dir);
  auto G = importOk(Path);
  ASSERT_TRUE(G);
  ASSERT_EQ(G->params().size(), 2u);
  for (const auto &P : G->params()) {
    EXPECT_FALSE(P->data()->isLoaded());
    auto Bytes = P->data()->load();
    ASSERT_TRUE(bool(Bytes)) << toString(Bytes.takeError());
    EXPECT_EQ(Bytes->size(), 400u);
    float Sign = P->name() == "w" ? 1.0f : -1.0f;
    EXPECT_EQ(P->data()->getDouble(7), Sign * 7.0f);
  }
}

TEST(Import, MalformedGraphs) {
  TempDir Dir;
  ModelBuilder B;
  B.input("x", F32, {2});
  B.node("Neg", {"y"}, {"z"}, "second");
  B.node("Neg", {"x"}, {"y"}, "first");
  B.output("z");
  std::string Path = B.write(Dir);
  std::string Msg = importError(Path);
  EXPECT_NE(Msg.find("node 'second' (Neg): input 'y' is used before the node "
                     "that defines it (the graph is not topologically "
                     "sorted)"),
            std::string::npos)
      << Msg;

  ModelBuilder C(13);
  C.input("x", F32, {4, 8});
  C.constInts("starts", {0}, {1});
  C.constInts("ends", {2}, {1});
  C.constInts("steps", {1}, {1});
  C.node("Slice", {"x", "starts", "ends", "", "steps"}, {"y"}, "slice");
  C.output("y");
  std::string CPath = C.write(Dir, "empty_input.onnx");
  EXPECT_EQ(importError(CPath),
            CPath + ": node 'slice' (Slice): empty optional input 3 is not "
                    "supported");

  ModelBuilder D;
  D.input("x", F32, {4, 8});
  D.floatInit("w", {3, 8});
  D.node("MatMul", {"x", "w"}, {"y"}, "mm");
  D.output("y");
  std::string DPath = D.write(Dir, "mismatch.onnx");
  Msg = importError(DPath);
  // ONNX's shape inference or ours refuses it; either way the file is named.
  EXPECT_EQ(Msg.rfind(DPath + ": ", 0), 0u) << Msg;
}

TEST(Import, OptionalOutputsAndInputs) {
  TempDir Dir;
  ModelBuilder B(13);
  B.input("x", F32, {2, 8});
  B.floatInit("g", {8});
  // Dropout in training mode with its mask; ReduceMean with attribute axes.
  auto *R = B.node("ReduceMean", {"x"}, {"m"}, "mean");
  ModelBuilder::attr(R, "axes", std::vector<int64_t>{-1});
  B.node("Sub", {"x", "m"}, {"c"}, "sub");
  B.node("Mul", {"c", "g"}, {"s"}, "mul");
  B.node("Dropout", {"s"}, {"d", "mask"}, "drop");
  B.output("d");
  B.output("mask");
  auto G = importOk(B.write(Dir));
  ASSERT_TRUE(G);
  EXPECT_EQ(G->outputs()[1].V->type(), TensorType(DType::Bool, {2, 8}));
  EXPECT_EQ(opHistogram(*G), (std::map<std::string, int>{{"onnx.Dropout", 1},
                                                         {"onnx.Mul", 1},
                                                         {"onnx.ReduceMean", 1},
                                                         {"onnx.Sub", 1}}));
}

//===----------------------------------------------------------------------===//
// Real torch exports
//===----------------------------------------------------------------------===//

class TorchExport : public ::testing::TestWithParam<int> {};

TEST_P(TorchExport, ImportsWithoutShapeOps) {
  std::string Python = SP_PYTHON;
  std::string Script = std::string(SP_SOURCE_DIR) + "/models/export_gpt.py";
  ASSERT_TRUE(!Python.empty() && sys::fs::exists(Python))
      << "no python3 with torch found at configure time";
  TempDir Dir;
  std::string Out = Dir.file("gpt.onnx");
  std::string Opset = std::to_string(GetParam());
  std::vector<StringRef> Args{
      Python,     Script, "-o",       Out, "--opset", Opset, "--layers", "1",
      "--hidden", "32",   "--heads",  "2", "--seq",   "16",  "--vocab",  "64",
      "--batch",  "2",    "--dynamic"};
  if (GetParam() >= 14) {
    Args.push_back("--mask");
    Args.push_back("trilu");
  }
  std::string Log = Dir.file("export.log");
  Optional<StringRef> Redirects[] = {None, StringRef(Log), StringRef(Log)};
  std::string ErrMsg;
  int RC = sys::ExecuteAndWait(Python, Args, None, Redirects, 300, 0, &ErrMsg);
  ASSERT_EQ(RC, 0) << "the torch export failed (is python3-torch "
                      "installed?): "
                   << ErrMsg;
  ImportOptions O;
  O.Batch = 2;
  O.Seq = 16;
  auto G = importOk(Out, O);
  ASSERT_TRUE(G);
  auto H = opHistogram(*G);
  for (const char *Op :
       {"onnx.Shape", "onnx.Unsqueeze", "onnx.Concat", "onnx.ConstantOfShape",
        "onnx.Range", "onnx.Expand", "onnx.Trilu", "onnx.Equal"})
    EXPECT_EQ(H.count(Op), 0u) << Op << " remains:\n" << graphToString(*G);
  // Only the two embedding lookups remain of the Gathers.
  EXPECT_EQ(H["onnx.Gather"], 2);
  EXPECT_EQ(H["onnx.Dropout"], 4);
  EXPECT_EQ(G->inputs()[0]->type(), TensorType(DType::I64, {2, 16}));
  EXPECT_EQ(G->outputs()[0].V->type(), TensorType(DType::F32, {2, 16, 64}));
}

INSTANTIATE_TEST_SUITE_P(Opsets, TorchExport, ::testing::Values(13, 14, 17));

} // namespace
