//===- OnnxImporter.cpp - ONNX ModelProto to IR ---------------------------===//
//
// Imports an ONNX model in these steps:
//
//  1. Read the file and parse the ModelProto. A short wire-format walk over
//     the top-level fields first tells a truncated file (a field runs past
//     the end) from a file that is not an ONNX model at all. Every string
//     must be UTF-8, as onnx.proto says: names end up in the plan's JSON,
//     which cannot hold anything else.
//  2. Check the opset (default domain, 13 to 17) and the nodes: each one a
//     supported op of the default domain, without an empty optional input
//     in the middle, using only values defined before it (ONNX graphs are
//     topologically sorted).
//  3. Bind the symbolic dimensions of the graph inputs (ImportOptions), and
//     refuse any that remain unknown, naming the input, the dimension and the
//     flag that binds it.
//  4. Turn initializers into parameters and constants (rules below). No data
//     is read here except the bytes of small embedded constants.
//  5. Run ONNX's own shape inference (strict; without data propagation,
//     whose propagators crash on bad input in ONNX 1.12) on the bound
//     model. External initializers are declared to it as typed graph
//     inputs, since it cannot read their data.
//  6. Map the nodes in graph order: Constant nodes become constants; every
//     other node gets its onnx.* op, its attributes (ONNX names, see
//     ir/OnnxShapes.cpp for the mapping) and operands, and is typed with
//     inferTypes. A type that ONNX inferred statically must agree with ours.
//     A node whose operands are all constants with data at hand (inline or
//     already loaded; nothing is read to fold), and any Shape, is evaluated
//     with foldOp and becomes constants named after its ONNX outputs;
//     otherwise it is appended to the graph, named after the ONNX node.
//  7. Drop unused constants and run the verifier.
//
// Parameters and constants. torch writes trained parameters and buffers alike
// as initializers; the rule that tells them apart is structural and
// deterministic. An initializer is a parameter if and only if
//   - its element type is floating point, and
//   - it has more than one element, and
//   - it reaches, directly or through Transpose and Identity nodes only, a
//     data operand of a weight-consuming op: either operand of MatMul, Add or
//     Mul; any operand of Gemm; operand 0 (the table) of Gather; operand 1 or
//     2 (scale, bias) of LayerNormalization.
// Every other initializer is a constant: integer and bool tensors (shapes,
// masks), scalars, and floating-point buffers that reach those ops only
// through other nodes (e.g. a causal-mask buffer that is sliced first).
// An initializer listed among the graph inputs (older exporters do that) is
// an initializer, not an input.
//
// Data. Parameters always reference their bytes: DataRef::External (path
// resolved against the model's folder, offset, length) for external data,
// DataRef::OnnxInitializer (model path, initializer name) for data embedded
// in the model, read through the loader that registerOnnxDataLoader()
// installs. Constants are inline when embedded and at most
// MaxInlineElements elements, references otherwise. External data is never
// read at import, except the few bytes of a small constant whose value a node
// needs to be typed (e.g. the shape operand of a Reshape), and its file need
// not exist (weight-free graphs); a location that is absolute or escapes the
// model's folder is refused.
//
// Diagnostics are one line and start with the model path:
//   PATH: cannot read the model: No such file or directory
//   PATH: not an ONNX model (it does not parse as an ONNX ModelProto)
//   PATH: not an ONNX model (it has no ir_version | graph | nodes)
//   PATH: the file is truncated (field 7 needs 1234 bytes at offset 40, the
//         file ends at 512)
//   PATH: model uses opset 11; sp supports opsets 13 to 17
//   PATH: input 'idx' has symbolic dimension 'seq' (dim 1); bind it with
//         --seq N
//   PATH: external data location '../x' of initializer 'W' escapes the
//         model folder '/dir'
//   PATH: node 'NAME' (OpType): unsupported op; supported ops are ...
//   PATH: node 3 (MatMul): name 'h.0\xFF' is not valid UTF-8 (...)
//   PATH: node 'NAME' (OpType): <type error from inferTypes>
//   PATH: onnx shape inference failed: <message>
//
//===----------------------------------------------------------------------===//
#include "frontend/OnnxImporter.h"
#include "frontend/OnnxProto.h"
#include "ir/Fold.h"
#include "ir/ShapeInference.h"
#include "ir/Verifier.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SwapByteOrder.h"

#include "onnx/defs/schema.h"
#include "onnx/onnx_pb.h"
#include "onnx/shape_inference/implementation.h"
#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>

using namespace llvm;

namespace sp {

namespace {

/// Embedded constants up to this many elements are copied inline.
constexpr int64_t MaxInlineElements = 64;
constexpr int64_t MinOpset = 13, MaxOpset = 17;
using namespace onnxio;

//===----------------------------------------------------------------------===//
// Op table and attributes
//===----------------------------------------------------------------------===//

/// The op an ONNX op type in the default domain imports as: its onnx.* op,
/// or the core activation of the SP_UNARY_OP line that names it (ir/Ops.def).
std::optional<OpKind> onnxOpKind(StringRef OpType) {
#define SP_OP(Enum, Name)
#define SP_UNARY_OP(Enum, Name, OnnxName)                                      \
  if (!StringRef(OnnxName).empty() && OpType == OnnxName)                      \
    return OpKind::Enum;
#include "ir/Ops.def"
  auto K = parseOpName(("onnx." + OpType).str());
  if (!K || !isOnnxOp(*K))
    return std::nullopt;
  return K;
}

std::string supportedOps() {
  std::vector<std::string> Names{"Constant"};
#define SP_OP(Enum, Name)                                                      \
  if (StringRef(Name).startswith("onnx."))                                     \
    Names.push_back(StringRef(Name).drop_front(5).str());
#define SP_UNARY_OP(Enum, Name, OnnxName)                                      \
  if (!StringRef(OnnxName).empty())                                            \
    Names.push_back(OnnxName);
#include "ir/Ops.def"
  llvm::sort(Names);
  return join(Names, ", ");
}

Expected<Attribute> convertAttribute(const onnx::AttributeProto &A) {
  switch (A.type()) {
  case onnx::AttributeProto::INT:
    return Attribute(int64_t(A.i()));
  case onnx::AttributeProto::FLOAT:
    return Attribute(double(A.f()));
  case onnx::AttributeProto::STRING:
    // Bytes in onnx.proto, but a UTF-8 string by its comment; attributes
    // reach the plan's JSON.
    if (!isUtf8(A.s()))
      return makeError(formatv("attribute '{0}' has the value '{1}', which "
                               "is not valid UTF-8",
                               A.name(), escapeForMessage(A.s())));
    return Attribute(A.s());
  case onnx::AttributeProto::INTS:
    return Attribute(std::vector<int64_t>(A.ints().begin(), A.ints().end()));
  case onnx::AttributeProto::FLOATS:
    return Attribute(std::vector<double>(A.floats().begin(), A.floats().end()));
  default:
    return makeError(formatv(
        "attribute '{0}' of type {1} is not supported", A.name(),
        StringRef(onnx::AttributeProto_AttributeType_Name(A.type())).lower()));
  }
}

/// The name of node Index: its ONNX name, or "OpType_<index>".
std::string nodeName(const onnx::NodeProto &N, unsigned Index) {
  return N.name().empty() ? N.op_type() + "_" + std::to_string(Index)
                          : N.name();
}

/// "node 'NAME' (OpType)", for diagnostics.
std::string describeNode(const onnx::NodeProto &N, unsigned Index) {
  return "node '" + nodeName(N, Index) + "' (" + N.op_type() + ")";
}

/// True if operand Slot of an ONNX op consumes a trained weight (see the
/// parameter rule at the top of the file).
bool isWeightOperand(StringRef OpType, int Slot) {
  if (OpType == "MatMul" || OpType == "Gemm" || OpType == "Add" ||
      OpType == "Mul")
    return true;
  if (OpType == "Gather")
    return Slot == 0;
  if (OpType == "LayerNormalization")
    return Slot == 1 || Slot == 2;
  return false;
}

/// The fully static tensor type ONNX inferred, if any.
std::optional<TensorType> staticOnnxType(const onnx::TypeProto &T) {
  if (!T.has_tensor_type() || !T.tensor_type().has_shape())
    return std::nullopt;
  auto D = dtypeOf(T.tensor_type().elem_type());
  if (!D)
    return std::nullopt;
  TensorType Ty(*D, {});
  for (const onnx::TensorShapeProto::Dimension &Dim :
       T.tensor_type().shape().dim()) {
    if (!Dim.has_dim_value())
      return std::nullopt;
    Ty.Shape.push_back(Dim.dim_value());
  }
  return Ty;
}

//===----------------------------------------------------------------------===//
// The importer
//===----------------------------------------------------------------------===//

class Importer {
public:
  Importer(StringRef Path, const ImportOptions &Opts)
      : DisplayPath(Path.str()), Path(absolutePath(Path)), Opts(Opts) {
    ModelDir = std::string(sys::path::parent_path(this->Path));
  }

  Expected<std::unique_ptr<Graph>> run();

private:
  Error error(const Twine &Msg) { return fileError(DisplayPath, Msg); }

  Error checkOpset();
  Error checkUtf8();
  Error checkNodes();
  Error bindInputs();
  Error unboundDimension(StringRef Name, StringRef Param, int I, bool IsFirst);
  Error importInitializers();
  Error runOnnxShapeInference();
  Error importNode(const onnx::NodeProto &N, unsigned Index);
  Error importConstantNode(const onnx::NodeProto &N, StringRef Desc);
  Error importOutputs();
  Error checkAgainstOnnx(StringRef Desc, const onnx::NodeProto &N,
                         ArrayRef<TensorType> Types);
  void findParameters();
  Error defineValue(StringRef Name, Value *V, StringRef Desc);

  /// The path as given (for messages), its absolute form (for data
  /// references) and the absolute model folder.
  std::string DisplayPath, Path, ModelDir;
  const ImportOptions &Opts;
  std::unique_ptr<onnx::ModelProto> Model;
  std::unique_ptr<Graph> G;
  /// ONNX value name -> IR value.
  StringMap<Value *> Values;
  /// Initializer names, and those that are parameters.
  StringSet<> InitializerNames, ParamNames;
  /// Names that some node defines (to tell "not sorted" from "undefined").
  StringSet<> NodeOutputs;
  /// Types from ONNX's shape inference, by value name.
  StringMap<const onnx::TypeProto *> OnnxTypes;
  /// The default-domain opset the model imports.
  int64_t Opset = 0;
};

Expected<std::unique_ptr<Graph>> Importer::run() {
  auto M = readModel(DisplayPath);
  if (!M)
    return M.takeError();
  Model = std::move(*M);
  if (auto E = checkUtf8())
    return E;
  if (auto E = checkOpset())
    return E;

  const onnx::GraphProto &GP = Model->graph();
  std::string Name = GP.name();
  if (Name.empty())
    Name = std::string(sys::path::stem(Path));
  G = std::make_unique<Graph>(Name);

  if (GP.sparse_initializer_size())
    return error("sparse initializers are not supported");
  for (const onnx::TensorProto &T : GP.initializer())
    if (!InitializerNames.insert(T.name()).second)
      return error("initializer '" + T.name() + "' is defined twice");
  for (const onnx::NodeProto &N : GP.node())
    for (const std::string &O : N.output())
      if (!O.empty())
        NodeOutputs.insert(O);
  findParameters();

  if (auto E = checkNodes())
    return E;
  if (auto E = bindInputs())
    return E;
  if (auto E = importInitializers())
    return E;
  if (auto E = runOnnxShapeInference())
    return E;
  for (int I = 0; I < Model->graph().node_size(); ++I)
    if (auto E = importNode(Model->graph().node(I), I))
      return E;
  if (auto E = importOutputs())
    return E;

  G->removeUnusedConstants();
  if (auto E = verifyGraph(*G))
    return error("internal error: " + toString(std::move(E)));
  return std::move(G);
}

/// Every string the model holds, and the model's own path (the plan records
/// it to read the weights), must be UTF-8: they reach the plan's JSON.
Error Importer::checkUtf8() {
  if (!isUtf8(Path))
    return error("the model's path is not valid UTF-8, which a plan cannot "
                 "record; rename the file or its folder");
  auto Refuse = [&](const Twine &Where, StringRef Value) {
    return error(formatv("{0} '{1}' is not valid UTF-8 (ONNX strings are "
                         "UTF-8; fix the exporter or the file)",
                         Where.str(), escapeForMessage(Value)));
  };
  // Nodes first, to name the node and its op.
  const onnx::GraphProto &GP = Model->graph();
  for (int I = 0; I < GP.node_size(); ++I)
    if (auto Bad = findInvalidUtf8(GP.node(I)))
      return Refuse(formatv("node {0} ({1}): {2}", I,
                            escapeForMessage(GP.node(I).op_type()),
                            Bad->first),
                    Bad->second);
  // The rest of the model without copying the nodes: swap them out and back.
  onnx::GraphProto &Mutable = *Model->mutable_graph();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> Nodes;
  Nodes.Swap(Mutable.mutable_node());
  auto Bad = findInvalidUtf8(*Model);
  Nodes.Swap(Mutable.mutable_node());
  if (Bad)
    return Refuse(Bad->first, Bad->second);
  return Error::success();
}

Error Importer::checkOpset() {
  std::optional<int64_t> Version;
  for (const onnx::OperatorSetIdProto &O : Model->opset_import())
    if (O.domain().empty() || O.domain() == "ai.onnx")
      Version = O.version();
  if (!Version)
    return error("the model imports no default-domain (ai.onnx) opset");
  if (*Version < MinOpset || *Version > MaxOpset)
    return error(formatv("model uses opset {0}; sp supports opsets {1} to {2}",
                         *Version, MinOpset, MaxOpset));
  Opset = *Version;
  return Error::success();
}

void Importer::findParameters() {
  const onnx::GraphProto &GP = Model->graph();
  // Consumers of every value: (node index, operand slot).
  StringMap<SmallVector<std::pair<int, int>, 2>> Users;
  for (int I = 0; I < GP.node_size(); ++I)
    for (int S = 0; S < GP.node(I).input_size(); ++S)
      if (!GP.node(I).input(S).empty())
        Users[GP.node(I).input(S)].push_back({I, S});

  for (const onnx::TensorProto &T : GP.initializer()) {
    auto D = dtypeOf(T.data_type());
    bool MoreThanOne = !is_contained(T.dims(), 0) &&
                       any_of(T.dims(), [](int64_t Dim) { return Dim > 1; });
    if (!D || !isFloat(*D) || !MoreThanOne)
      continue;
    // Follow the value through Transpose/Identity to a weight operand.
    SmallVector<std::string, 4> Worklist{T.name()};
    StringSet<> Seen;
    bool IsParam = false;
    while (!Worklist.empty() && !IsParam) {
      std::string V = Worklist.pop_back_val();
      if (!Seen.insert(V).second)
        continue;
      auto It = Users.find(V);
      if (It == Users.end())
        continue;
      for (auto [NodeIdx, Slot] : It->second) {
        const onnx::NodeProto &N = GP.node(NodeIdx);
        if (!N.domain().empty() && N.domain() != "ai.onnx")
          continue;
        if ((N.op_type() == "Transpose" || N.op_type() == "Identity") &&
            N.output_size() > 0 && !N.output(0).empty())
          Worklist.push_back(N.output(0));
        else if (isWeightOperand(N.op_type(), Slot))
          IsParam = true;
      }
    }
    if (IsParam)
      ParamNames.insert(T.name());
  }
}

/// The flags that bind dimensions 0 and 1 of the first graph input.
const char *const PositionalFlags[2] = {"--batch", "--seq"};

/// The error for dimension I of input Name that nothing binds: symbolic
/// (named Param) or unknown (Param empty). It says which flag binds it.
Error Importer::unboundDimension(StringRef Name, StringRef Param, int I,
                                 bool IsFirst) {
  std::string What = Param.empty() ? std::string("an unknown dimension")
                                   : "symbolic dimension '" + Param.str() + "'";
  std::string Flag;
  if (Param == "batch" || Param == "seq")
    Flag = "--" + Param.str() + " N";
  else if (IsFirst && I < 2)
    Flag = std::string(PositionalFlags[I]) + " N";
  else if (!Param.empty())
    Flag = "--dim " + Param.str() + "=N";
  if (Flag.empty())
    return error(formatv("input '{0}' has {1} (dim {2}); export the model "
                         "with static or named dimensions",
                         Name, What, I));
  return error(formatv("input '{0}' has {1} (dim {2}); bind it with {3}", Name,
                       What, I, Flag));
}

Error Importer::bindInputs() {
  onnx::GraphProto &GP = *Model->mutable_graph();
  // Symbolic dimension values: by name, then (for names not given) by
  // position in the first graph input.
  StringMap<int64_t> DimValues;
  for (const auto &KV : Opts.DimValues)
    if (KV.second > 0)
      DimValues[KV.first()] = KV.second;
  const int64_t Positional[2] = {Opts.Batch, Opts.Seq};
  StringSet<> Symbolic; // the inputs' dimension names, for --dim

  bool First = true;
  for (onnx::ValueInfoProto &In : *GP.mutable_input()) {
    if (InitializerNames.count(In.name()))
      continue;
    bool IsFirst = First;
    First = false;
    const std::string &Name = In.name();
    if (!In.type().has_tensor_type())
      return error("input '" + Name + "' is not a tensor");
    onnx::TypeProto_Tensor &TT = *In.mutable_type()->mutable_tensor_type();
    auto D = dtypeOf(TT.elem_type());
    if (!D)
      return error("input '" + Name + "' has element type " +
                   onnxTypeName(TT.elem_type()) + ", which is not supported");
    if (!TT.has_shape())
      return error("input '" + Name + "' has no shape");
    TensorType Ty(*D, {});
    for (int I = 0; I < TT.shape().dim_size(); ++I) {
      onnx::TensorShapeProto::Dimension &Dim =
          *TT.mutable_shape()->mutable_dim(I);
      bool HasPositional = IsFirst && I < 2 && Positional[I] > 0;
      if (Dim.has_dim_value()) {
        if (HasPositional && Dim.dim_value() != Positional[I])
          return error(formatv("input '{0}' has static dimension {1} (dim "
                               "{2}), but {3} {4} was given",
                               Name, Dim.dim_value(), I, PositionalFlags[I],
                               Positional[I]));
        if (Dim.dim_value() < 0)
          return error(formatv("input '{0}' has a negative dimension (dim "
                               "{1})",
                               Name, I));
        Ty.Shape.push_back(Dim.dim_value());
        continue;
      }
      std::string Param = Dim.has_dim_param() ? Dim.dim_param() : "";
      if (!Param.empty())
        Symbolic.insert(Param);
      int64_t V = 0;
      if (!Param.empty() && DimValues.count(Param))
        V = DimValues.lookup(Param);
      else if (HasPositional)
        V = Positional[I];
      if (!Param.empty() && V > 0)
        DimValues.try_emplace(Param, V); // the same name elsewhere
      if (V <= 0)
        return unboundDimension(Name, Param, I, IsFirst);
      Dim.set_dim_value(V); // for ONNX's shape inference
      Ty.Shape.push_back(V);
    }
    if (!sizeFits(Ty.Shape))
      return error("input '" + Name + "' has too many elements");
    if (Values.count(Name))
      return error("input '" + Name + "' is listed twice");
    Values[Name] = G->addInput(Name, Ty);
  }
  // A --dim that binds nothing is a typo or a flag meant for another model.
  std::vector<std::string> Unused, Known;
  for (const auto &KV : Opts.DimValues)
    if (!Symbolic.count(KV.first()))
      Unused.push_back(KV.first().str());
  if (!Unused.empty()) {
    for (const auto &KV : Symbolic)
      Known.push_back(KV.first().str());
    llvm::sort(Unused);
    llvm::sort(Known);
    std::string Names;
    for (const std::string &K : Known)
      Names += (Names.empty() ? "'" : ", '") + K + "'";
    return error(formatv("--dim {0}={1}: no input has a symbolic dimension "
                         "'{0}'; {2}",
                         Unused[0], Opts.DimValues.lookup(Unused[0]),
                         Known.empty() ? "the inputs' shapes are static"
                                       : "their symbolic dimensions are " +
                                             Names));
  }
  return Error::success();
}

Error Importer::importInitializers() {
  for (const onnx::TensorProto &T : Model->graph().initializer()) {
    const std::string &Name = T.name();
    std::string What = "initializer '" + Name + "'";
    auto Ty = tensorTypeOf(T, What);
    if (!Ty)
      return error(toString(Ty.takeError()));
    bool IsParam = ParamNames.count(Name);
    std::shared_ptr<TensorData> Data;
    if (isExternal(T)) {
      auto L = externalLocation(T, *Ty, ModelDir, What);
      if (!L)
        return error(toString(L.takeError()));
      Data = TensorData::makeRef(
          *Ty, DataRef{DataRef::External, L->Path, "", L->Offset, L->Length});
    } else if (!IsParam && Ty->numElements() <= MaxInlineElements) {
      auto B = embeddedBytes(T, *Ty, What);
      if (!B)
        return error(toString(B.takeError()));
      Data = TensorData::makeInline(*Ty, std::move(*B));
    } else {
      // Checked now, so that a bad tensor is an import error rather than a
      // load error much later; nothing is copied.
      if (auto E = checkEmbedded(T, *Ty, What))
        return error(toString(std::move(E)));
      Data = TensorData::makeRef(
          *Ty, DataRef{DataRef::OnnxInitializer, Path, Name, 0, 0});
    }
    Values[Name] = IsParam ? G->addParam(Name, *Ty, std::move(Data))
                           : G->addConst(Name, *Ty, std::move(Data));
  }
  return Error::success();
}

/// Structural checks, before ONNX's shape inference sees the graph: each
/// node is a supported op, has no empty optional input in the middle, and
/// uses only values defined before it.
Error Importer::checkNodes() {
  const onnx::GraphProto &GP = Model->graph();
  StringSet<> Defined;
  for (const onnx::ValueInfoProto &In : GP.input())
    Defined.insert(In.name());
  for (const onnx::TensorProto &T : GP.initializer())
    Defined.insert(T.name());
  for (int Index = 0; Index < GP.node_size(); ++Index) {
    const onnx::NodeProto &N = GP.node(Index);
    std::string Desc = describeNode(N, Index);
    if (!N.domain().empty() && N.domain() != "ai.onnx")
      return error(formatv("{0}: unsupported op domain '{1}'; sp supports "
                           "only the default ONNX domain",
                           Desc, N.domain()));
    if (N.op_type() != "Constant" && !onnxOpKind(N.op_type()))
      return error(Desc + ": unsupported op; supported ops are " +
                   supportedOps());
    // ONNX's shape inference assumes what its checker checks, and crashes
    // on a node that does not fit its op's schema (a Constant whose
    // attribute has another name dereferences null in ONNX 1.12): check
    // the node against the schema first, as the checker would.
    const onnx::OpSchema *Schema =
        onnx::OpSchemaRegistry::Schema(N.op_type(), int(Opset));
    if (!Schema)
      return error(formatv("{0}: the op is not defined at opset {1}", Desc,
                           Opset));
    try {
      Schema->Verify(N);
    } catch (const std::exception &E) {
      // The first line says what is wrong; ONNX adds context lines.
      return error(Desc + ": " + StringRef(E.what()).split('\n').first.trim() +
                   " (the node does not fit the ONNX schema of " +
                   N.op_type() + ")");
    }
    int NumInputs = N.input_size();
    while (NumInputs > 0 && N.input(NumInputs - 1).empty())
      --NumInputs;
    for (int I = 0; I < NumInputs; ++I) {
      const std::string &In = N.input(I);
      if (In.empty())
        return error(formatv("{0}: empty optional input {1} is not "
                             "supported",
                             Desc, I));
      if (!Defined.count(In))
        return error(formatv(NodeOutputs.count(In)
                                 ? "{0}: input '{1}' is used before the node "
                                   "that defines it (the graph is not "
                                   "topologically sorted)"
                                 : "{0}: input '{1}' is not defined",
                             Desc, In));
    }
    for (const std::string &Out : N.output())
      if (!Out.empty() && !Defined.insert(Out).second)
        return error(formatv("{0}: value '{1}' is defined twice", Desc, Out));
  }
  return Error::success();
}

Error Importer::runOnnxShapeInference() {
  onnx::GraphProto &GP = *Model->mutable_graph();
  // ONNX cannot read external data; declare those initializers as typed
  // inputs instead (their values are not needed to infer types).
  StringSet<> Inputs;
  for (const onnx::ValueInfoProto &In : GP.input())
    Inputs.insert(In.name());
  auto *Inits = GP.mutable_initializer();
  int Keep = 0;
  for (int I = 0; I < Inits->size(); ++I) {
    const onnx::TensorProto &T = Inits->Get(I);
    if (!isExternal(T)) {
      Inits->SwapElements(I, Keep++);
      continue;
    }
    if (Inputs.count(T.name()))
      continue;
    onnx::ValueInfoProto *In = GP.add_input();
    In->set_name(T.name());
    auto *TT = In->mutable_type()->mutable_tensor_type();
    TT->set_elem_type(T.data_type());
    auto *Shape = TT->mutable_shape();
    for (int64_t D : T.dims())
      Shape->add_dim()->set_dim_value(D);
  }
  Inits->DeleteSubrange(Keep, Inits->size() - Keep);

  try {
    // No data propagation: ONNX 1.12's propagators trust their inputs (an
    // Unsqueeze whose constant axes are out of range dereferences null).
    // It only let ONNX type more value-dependent shapes statically, which
    // our own inference and folding compute anyway (checkAgainstOnnx
    // compares what ONNX does type).
    onnx::ShapeInferenceOptions Options(/*check_type=*/false,
                                        /*error_mode=*/1,
                                        /*enable_data_propagation=*/false);
    onnx::shape_inference::InferShapes(
        *Model, onnx::OpSchemaRegistry::Instance(), Options);
  } catch (const std::exception &E) {
    return error(Twine("onnx shape inference failed: ") + E.what());
  }
  for (const onnx::ValueInfoProto &V : Model->graph().value_info())
    OnnxTypes[V.name()] = &V.type();
  for (const onnx::ValueInfoProto &V : Model->graph().output())
    OnnxTypes[V.name()] = &V.type();
  return Error::success();
}

Error Importer::defineValue(StringRef Name, Value *V, StringRef Desc) {
  if (!Values.try_emplace(Name, V).second)
    return error(Desc + ": value '" + Name + "' is defined twice");
  return Error::success();
}

Error Importer::checkAgainstOnnx(StringRef Desc, const onnx::NodeProto &N,
                                 ArrayRef<TensorType> Types) {
  for (unsigned I = 0; I < Types.size(); ++I) {
    if (N.output(I).empty())
      continue;
    auto It = OnnxTypes.find(N.output(I));
    if (It == OnnxTypes.end())
      continue;
    std::optional<TensorType> Theirs = staticOnnxType(*It->second);
    if (Theirs && *Theirs != Types[I])
      return error(formatv("{0}: result {1} ('{2}') has type {3}, but onnx "
                           "shape inference says {4}",
                           Desc, I, N.output(I), Types[I].str(),
                           Theirs->str()));
  }
  return Error::success();
}

Error Importer::importConstantNode(const onnx::NodeProto &N, StringRef Desc) {
  if (N.output_size() != 1 || N.attribute_size() != 1)
    return error(Desc + ": expected one output and one attribute");
  const onnx::AttributeProto &A = N.attribute(0);
  const std::string &Out = N.output(0);
  TensorType Ty;
  std::vector<char> Bytes;
  auto Put = [&](auto V) {
    size_t At = Bytes.size();
    Bytes.resize(At + sizeof(V));
    std::memcpy(Bytes.data() + At, &V, sizeof(V));
  };
  auto Expect = [&](onnx::AttributeProto::AttributeType Type) {
    return A.type() == Type;
  };
  if (A.name() == "value" && Expect(onnx::AttributeProto::TENSOR)) {
    std::string What = "the value of " + Desc.str();
    auto T = tensorTypeOf(A.t(), What);
    if (!T)
      return error(toString(T.takeError()));
    Ty = *T;
    if (isExternal(A.t())) {
      auto L = externalLocation(A.t(), Ty, ModelDir, What);
      if (!L)
        return error(toString(L.takeError()));
      auto Data = TensorData::makeRef(
          Ty, DataRef{DataRef::External, L->Path, "", L->Offset, L->Length});
      return defineValue(Out, G->addConst(Out, Ty, std::move(Data)), Desc);
    }
    auto B = embeddedBytes(A.t(), Ty, What);
    if (!B)
      return error(toString(B.takeError()));
    Bytes = std::move(*B);
  } else if (A.name() == "value_float" && Expect(onnx::AttributeProto::FLOAT)) {
    Ty = TensorType(DType::F32, {});
    Put(A.f());
  } else if (A.name() == "value_floats" &&
             Expect(onnx::AttributeProto::FLOATS)) {
    Ty = TensorType(DType::F32, {int64_t(A.floats_size())});
    for (float F : A.floats())
      Put(F);
  } else if (A.name() == "value_int" && Expect(onnx::AttributeProto::INT)) {
    Ty = TensorType(DType::I64, {});
    Put(int64_t(A.i()));
  } else if (A.name() == "value_ints" && Expect(onnx::AttributeProto::INTS)) {
    Ty = TensorType(DType::I64, {int64_t(A.ints_size())});
    for (int64_t I : A.ints())
      Put(I);
  } else {
    return error(Desc + ": constant attribute '" + A.name() +
                 "' is not supported");
  }
  auto Data = TensorData::makeInline(Ty, std::move(Bytes));
  return defineValue(Out, G->addConst(Out, Ty, std::move(Data)), Desc);
}

Error Importer::importNode(const onnx::NodeProto &N, unsigned Index) {
  // checkNodes() has vetted the op, the domain and the inputs.
  std::string NodeName = nodeName(N, Index);
  std::string Desc = describeNode(N, Index);
  if (N.op_type() == "Constant")
    return importConstantNode(N, Desc);
  std::optional<OpKind> Op = onnxOpKind(N.op_type());
  assert(Op && "checkNodes() lets only supported ops through");

  // Operands: trailing empty (omitted) optional inputs are dropped.
  int NumInputs = N.input_size();
  while (NumInputs > 0 && N.input(NumInputs - 1).empty())
    --NumInputs;
  SmallVector<Value *, 4> Operands;
  for (int I = 0; I < NumInputs; ++I) {
    Value *V = Values.lookup(N.input(I));
    if (!V) // e.g. an unused output of a folded node
      return error(
          formatv("{0}: input '{1}' is not defined", Desc, N.input(I)));
    Operands.push_back(V);
  }

  AttrList Attrs;
  for (const onnx::AttributeProto &A : N.attribute()) {
    if (*Op == OpKind::OnnxConstantOfShape && A.name() == "value") {
      // Split into `dtype` and `value` (see ir/OnnxShapes.cpp).
      std::string What = "the value of " + Desc;
      auto Ty = tensorTypeOf(A.t(), What);
      if (!Ty)
        return error(toString(Ty.takeError()));
      if (Ty->numElements() != 1 || isExternal(A.t()))
        return error(Desc + ": the value must be a one-element tensor");
      auto B = embeddedBytes(A.t(), *Ty, What);
      if (!B)
        return error(toString(B.takeError()));
      auto D = TensorData::makeInline(*Ty, std::move(*B));
      Attrs.set("dtype", int64_t(A.t().data_type()));
      if (isFloat(Ty->Dtype))
        Attrs.set("value", D->getDouble(0));
      else
        Attrs.set("value", D->getInt(0));
      continue;
    }
    auto V = convertAttribute(A);
    if (!V)
      return error(Desc + ": " + toString(V.takeError()));
    Attrs.set(A.name(), std::move(*V));
  }

  // Results: up to the last named output.
  int NumResults = N.output_size();
  while (NumResults > 1 && N.output(NumResults - 1).empty())
    --NumResults;
  if (*Op == OpKind::OnnxSplit && Operands.size() < 2 &&
      !Attrs.has("num_outputs"))
    Attrs.set("num_outputs", int64_t(N.output_size()));

  auto Types = inferTypes(*Op, Operands, Attrs);
  if (!Types) {
    // A value-dependent operand may be a small constant whose data has not
    // been read yet (external data): read those and try once more.
    bool Loaded = false;
    for (Value *V : Operands)
      if (V->isConst() && V->data() && !V->data()->isLoaded() &&
          V->type().numElements() <= MaxInlineElements) {
        if (auto B = V->data()->load())
          Loaded = true;
        else
          consumeError(B.takeError());
      }
    if (Loaded) {
      consumeError(Types.takeError());
      Types = inferTypes(*Op, Operands, Attrs);
    }
    if (!Types)
      return error(Desc + ": " + toString(Types.takeError()));
  }
  if (int(Types->size()) < NumResults)
    return error(formatv("{0}: has {1} outputs, expected at most {2}", Desc,
                         NumResults, Types->size()));
  ArrayRef<TensorType> ResultTypes =
      ArrayRef<TensorType>(*Types).take_front(NumResults);
  if (auto E = checkAgainstOnnx(Desc, N, ResultTypes))
    return E;

  // Fold what can be evaluated from data at hand (no reads at import).
  bool DataAtHand =
      *Op == OpKind::OnnxShape || all_of(Operands, [](const Value *V) {
        return V->isConst() && V->data() && V->data()->isLoaded();
      });
  if (isFoldable(*Op) && DataAtHand) {
    auto Folded = foldOp(*Op, Operands, Attrs, ResultTypes);
    if (!Folded)
      return error(Desc + ": " + toString(Folded.takeError()));
    if (*Folded) {
      for (int I = 0; I < NumResults; ++I) {
        if (N.output(I).empty())
          continue;
        Value *C =
            G->addConst(N.output(I), ResultTypes[I], std::move((**Folded)[I]));
        if (auto E = defineValue(N.output(I), C, Desc))
          return E;
      }
      return Error::success();
    }
  }

  Node *Created = G->append(*Op, Operands, ResultTypes, NodeName);
  Created->attrs() = std::move(Attrs);
  for (int I = 0; I < NumResults; ++I)
    if (!N.output(I).empty())
      if (auto E = defineValue(N.output(I), Created->result(I), Desc))
        return E;
  return Error::success();
}

Error Importer::importOutputs() {
  StringSet<> Seen;
  for (const onnx::ValueInfoProto &O : Model->graph().output()) {
    Value *V = Values.lookup(O.name());
    if (!V)
      return error("graph output '" + O.name() + "' is not defined");
    if (!Seen.insert(O.name()).second)
      return error("graph output '" + O.name() + "' is listed twice");
    G->addOutput(O.name(), V);
  }
  if (G->outputs().empty())
    return error("the graph has no outputs");
  return Error::success();
}

} // namespace

void registerOnnxDataLoader() {
  static std::once_flag Once;
  std::call_once(Once,
                 [] { TensorData::setOnnxInitializerLoader(loadInitializer); });
}

void forgetOnnxModels() { clearModelCache(); }

Expected<std::unique_ptr<Graph>> importOnnx(StringRef Path,
                                            const ImportOptions &Opts) {
  registerOnnxDataLoader();
  return Importer(Path, Opts).run();
}

} // namespace sp
