//===- GraphExport.cpp - A plan's programs as ONNX graphs to look at ------===//
#include "frontend/GraphExport.h"
#include "frontend/OnnxProto.h"
#include "plan/AtomicFile.h"
#include "plan/Plan.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include "onnx/checker.h"
#include "onnx/onnx_pb.h"

using namespace llvm;

namespace sp {

namespace {

constexpr const char *Domain = "sp";
constexpr int64_t OnnxOpset = 17;

/// The ONNX op an sp op is, when it is one exactly: elementwise with numpy
/// broadcasting (add, mul, relu), softmax along the last axis. Only when
/// every operand and result has the same float type, as ONNX requires.
StringRef onnxOpOf(const Instruction &I, const Program &P) {
  StringRef Name;
  switch (I.Op) {
  case OpKind::Add:
    Name = "Add";
    break;
  case OpKind::Mul:
    Name = "Mul";
    break;
  case OpKind::Softmax:
    Name = "Softmax";
    break;
  case OpKind::Relu:
    Name = "Relu";
    break;
  default:
    return "";
  }
  if (I.Out.size() != 1)
    return "";
  DType T = P.Buffers[I.Out[0]].Type.Dtype;
  if (!isFloat(T))
    return "";
  for (int B : I.In)
    if (P.Buffers[B].Type.Dtype != T)
      return "";
  return Name;
}

/// The operands an instruction overwrites in place (its results are not in
/// Out): adamw its parameter and moments, accumulate its sum, gather_param
/// every parameter of its bucket.
SmallVector<int, 4> writtenInPlace(const Instruction &I) {
  SmallVector<int, 4> Ops;
  switch (I.Op) {
  case OpKind::AdamW:
    for (unsigned K : {0u, 2u, 3u})
      if (K < I.In.size())
        Ops.push_back(I.In[K]);
    break;
  case OpKind::Accumulate:
    if (!I.In.empty() && I.Out.empty())
      Ops.push_back(I.In[0]);
    break;
  case OpKind::GatherParam:
    if (I.Out.empty())
      Ops.append(I.In.begin(), I.In.end());
    break;
  default:
    break;
  }
  return Ops;
}

void setAttr(onnx::NodeProto &N, StringRef Name, const Attribute &A) {
  onnx::AttributeProto *P = N.add_attribute();
  P->set_name(Name.str());
  using AP = onnx::AttributeProto;
  if (auto *I = std::get_if<int64_t>(&A)) {
    P->set_type(AP::INT);
    P->set_i(*I);
  } else if (auto *F = std::get_if<double>(&A)) {
    P->set_type(AP::FLOAT);
    P->set_f(float(*F));
  } else if (auto *S = std::get_if<std::string>(&A)) {
    P->set_type(AP::STRING);
    P->set_s(*S);
  } else if (auto *Is = std::get_if<std::vector<int64_t>>(&A)) {
    P->set_type(AP::INTS);
    for (int64_t X : *Is)
      P->add_ints(X);
  } else if (auto *Fs = std::get_if<std::vector<double>>(&A)) {
    P->set_type(AP::FLOATS);
    for (double X : *Fs)
      P->add_floats(float(X));
  }
}

void setMeta(onnx::ModelProto &M, StringRef Key, const Twine &Value) {
  onnx::StringStringEntryProto *E = M.add_metadata_props();
  E->set_key(Key.str());
  E->set_value(Value.str());
}

/// Builds one program's graph. Values are named after the buffers; a
/// buffer written again gets a new version ("NAME@v2").
class GraphWriter {
public:
  GraphWriter(const Program &P, int Stage, onnx::GraphProto &G)
      : P(P), Stage(Stage), G(G), Current(P.Buffers.size()),
        Versions(P.Buffers.size(), 0) {
    // Unique base names: a buffer's own, or NAME#id when two share one.
    StringMap<int> Seen;
    for (const ProgramBuffer &B : P.Buffers)
      ++Seen[B.Name.empty() ? "%" : B.Name];
    for (size_t Id = 0; Id < P.Buffers.size(); ++Id) {
      const std::string &N = P.Buffers[Id].Name;
      Base.push_back(N.empty() || Seen[N] > 1
                         ? formatv("{0}#{1}", N.empty() ? "%" : N, Id).str()
                         : N);
      Taken.insert(Base.back());
    }
  }

  void run() {
    for (size_t K = 0; K < P.Instrs.size(); ++K)
      addNode(int(K));
    for (const auto &[Name, Id] : P.Outputs)
      if (Id >= 0 && size_t(Id) < P.Buffers.size() && Versions[Id])
        addOutput(Id, Name);
    for (int Id : Updated)
      addOutput(Id, "updated in place: " + P.Buffers[Id].Name);
  }

private:
  /// The value a read of buffer Id sees: its latest version, or a graph
  /// input when nothing wrote it yet.
  const std::string &read(int Id) {
    if (!Versions[Id]) {
      Versions[Id] = 1;
      Current[Id] = Base[Id];
      describe(*G.add_input(), Id, Current[Id]);
    }
    return Current[Id];
  }

  /// "NAME@vK" for version K of buffer Id, or with the buffer's id too
  /// should another buffer's name look like that.
  std::string versionName(int Id) {
    std::string Name = formatv("{0}@v{1}", Base[Id], Versions[Id]).str();
    if (Taken.count(Name))
      Name = formatv("{0}#{1}@v{2}", Base[Id], Id, Versions[Id]).str();
    return Name;
  }

  /// A new version of buffer Id, written by the current node.
  const std::string &write(int Id) {
    ++Versions[Id];
    Current[Id] = Versions[Id] == 1 ? Base[Id] : versionName(Id);
    describe(*G.add_value_info(), Id, Current[Id]);
    return Current[Id];
  }

  void describe(onnx::ValueInfoProto &V, int Id, const std::string &Name) {
    const ProgramBuffer &B = P.Buffers[Id];
    V.set_name(Name);
    onnx::TypeProto_Tensor *T = V.mutable_type()->mutable_tensor_type();
    T->set_elem_type(onnxio::onnxDataType(B.Type.Dtype));
    onnx::TensorShapeProto *S = T->mutable_shape();
    for (int64_t D : B.Type.Shape)
      S->add_dim()->set_dim_value(D);
    std::string Doc;
    raw_string_ostream OS(Doc);
    OS << "buffer=" << Id << " kind=" << bufferKindName(B.K);
    std::string Shard = B.Shard.K == Sharding::None ? "none" : B.Shard.str();
    OS << " sharding=" << Shard << " bytes=" << B.Bytes
       << " offset=" << B.Offset;
    if (B.Layer >= 0)
      OS << " layer=" << B.Layer;
    if (B.Role != Role::None)
      OS << " role=" << roleName(B.Role);
    if (B.Feed != InputRole::None)
      OS << " feed=" << inputRoleName(B.Feed);
    if (P.compact()) {
      OS << " scope=" << bufferScopeName(B.Scope);
      if (B.Scope == BufferScope::Slot)
        OS << " region=" << B.Region;
    }
    V.set_doc_string(OS.str());
  }

  void addOutput(int Id, const std::string &Why) {
    if (!Outputs.insert(Current[Id]).second)
      return; // a named output that is also updated in place
    onnx::ValueInfoProto *V = G.add_output();
    describe(*V, Id, Current[Id]);
    V->set_doc_string(Why + "; " + V->doc_string());
  }

  void addNode(int K) {
    const Instruction &I = P.Instrs[K];
    onnx::NodeProto &N = *G.add_node();
    N.set_name(formatv("{0}:{1}", K, I.Name.empty() ? opName(I.Op) : I.Name)
                   .str());
    StringRef Onnx = onnxOpOf(I, P);
    if (!Onnx.empty()) {
      N.set_op_type(Onnx.str());
      if (I.Op == OpKind::Softmax)
        setAttr(N, "axis", int64_t(-1));
    } else {
      N.set_op_type(opName(I.Op).str());
      N.set_domain(Domain);
      for (const auto &[Name, Value] : I.Attrs.entries())
        setAttr(N, Name, Value);
    }
    for (int B : I.In)
      N.add_input(read(B));
    SmallVector<int, 4> InPlace = writtenInPlace(I);
    for (int B : I.Out)
      N.add_output(write(B));
    for (int B : InPlace) {
      N.add_output(write(B));
      if (llvm::find(Updated, B) == Updated.end())
        Updated.push_back(B);
    }
    // The metadata, readable in Netron's node view and by scripts.
    std::vector<std::pair<std::string, std::string>> Meta;
    if (I.Layer >= 0)
      Meta.push_back({"layer", std::to_string(I.Layer)});
    if (I.Role != Role::None)
      Meta.push_back({"role", roleName(I.Role).str()});
    Meta.push_back({"phase", phaseLongName(I.Ph)});
    Meta.push_back({"stage", std::to_string(Stage)});
    if (P.compact())
      for (const ProgramTemplate &T : P.Templates)
        if (K >= T.Begin && K < T.End) {
          Meta.push_back({"template", templateKindName(T.Kind).str()});
          if (T.Chunk >= 0)
            Meta.push_back({"chunk", std::to_string(T.Chunk)});
        }
    if (I.Beside >= 0)
      Meta.push_back({"beside", std::to_string(I.Beside)});
    std::string Doc;
    for (const auto &[Key, Value] : Meta) {
      Doc += (Doc.empty() ? "" : " ") + Key + "=" + Value;
      if (Onnx.empty())
        setAttr(N, "sp." + Key, Value);
    }
    N.set_doc_string(Doc);
  }

  static std::string phaseLongName(Phase Ph) {
    switch (Ph) {
    case Phase::Forward:
      return "forward";
    case Phase::Backward:
      return "backward";
    case Phase::Recompute:
      return "recompute";
    case Phase::Optimizer:
      return "optimizer";
    }
    return "?";
  }

  const Program &P;
  int Stage;
  onnx::GraphProto &G;
  std::vector<std::string> Base, Current;
  StringSet<> Taken;   // the buffers' own names
  StringSet<> Outputs; // the graph's outputs so far
  std::vector<int> Versions;
  std::vector<int> Updated;
};

} // namespace

Expected<std::string> programToOnnx(const Plan &Pl, const Program &Prog,
                                    int Stage, int Stages) {
  onnx::ModelProto M;
  M.set_ir_version(8); // ONNX 1.12 and later read it, with opset 17
  M.set_producer_name("sp-compile");
  M.set_model_version(1);
  onnx::OperatorSetIdProto *Std = M.add_opset_import();
  Std->set_domain("");
  Std->set_version(OnnxOpset);
  onnx::OperatorSetIdProto *Sp = M.add_opset_import();
  Sp->set_domain(Domain);
  Sp->set_version(1);
  const nlohmann::json &Man = Pl.Manifest;
  std::string Source = Man.value("source", std::string("model"));
  auto Int = [&](const char *Key) {
    auto It = Man.find(Key);
    return It != Man.end() && It->is_number_integer() ? It->get<int64_t>()
                                                      : int64_t(1);
  };
  bool SP = Man.value("sp", false);
  int64_t T = Int("tp"), D = Int("dp");
  std::string Layout =
      formatv("pipeline rank {0} of {1}; run by each of its {2} tensor-"
              "parallel rank{3}{4} and {5} data-parallel replica{6}",
              Stage, Stages, T, T == 1 ? "" : "s",
              SP ? " (sequence parallel)" : "", D, D == 1 ? "" : "s")
          .str();
  M.set_doc_string(
      formatv("The lowered program of '{0}' that sp-run executes on {1}: "
              "every instruction in order, buffers written in place as new "
              "versions (NAME@v2). Node and value doc_strings hold sp's "
              "metadata.",
              Source, Layout)
          .str());
  setMeta(M, "sp.source", Source);
  setMeta(M, "sp.stage", Twine(Stage));
  setMeta(M, "sp.stages", Twine(Stages));
  setMeta(M, "sp.tensor_parallel", Twine(T));
  setMeta(M, "sp.sequence_parallel", SP ? "1" : "0");
  setMeta(M, "sp.data_parallel", Twine(D));
  setMeta(M, "sp.dtype", Man.value("dtype", std::string("f32")));
  setMeta(M, "sp.arena_bytes", Twine(Prog.ArenaBytes));
  setMeta(M, "sp.persistent_bytes", Twine(Prog.PersistentBytes));
  if (Prog.compact())
    setMeta(M, "sp.program",
            formatv("compact: {0} templates over {1} steps, {2} microbatches",
                    Prog.Templates.size(), Prog.Steps.size(),
                    Prog.Microbatches));
  onnx::GraphProto &G = *M.mutable_graph();
  G.set_name(Stages > 1 ? formatv("{0}, pipeline rank {1}",
                                  sys::path::stem(Source), Stage)
                              .str()
                        : sys::path::stem(Source).str());
  GraphWriter(Prog, Stage, G).run();
  try {
    onnx::checker::check_model(M);
  } catch (const std::exception &E) {
    return createStringError(inconvertibleErrorCode(),
                             "the ONNX graph of pipeline rank %d does not "
                             "pass onnx's checker (a bug in sp): %s",
                             Stage, E.what());
  }
  std::string Bytes;
  if (!M.SerializeToString(&Bytes))
    return createStringError(inconvertibleErrorCode(),
                             "the ONNX graph of pipeline rank %d is larger "
                             "than protobuf's 2 GB",
                             Stage);
  return Bytes;
}

Error checkGraphsOutput(StringRef Dir) {
  SmallString<256> Parent(Dir);
  sys::path::remove_filename(Parent);
  if (Parent.empty())
    Parent = ".";
  auto Refuse = [&](const Twine &Why) {
    return createStringError(inconvertibleErrorCode(), "'" + Dir + "': " + Why);
  };
  if (sys::fs::exists(Dir) && !sys::fs::is_directory(Dir))
    return Refuse("it is a file; name a folder");
  if (!sys::fs::is_directory(Parent))
    return Refuse("the folder '" + Parent + "' it goes in does not exist");
  // The folder is replaced whole: only one that holds ONNX files alone (an
  // earlier export), never a folder of the user's.
  std::error_code EC;
  for (sys::fs::directory_iterator It(Dir, EC), End; It != End && !EC;
       It.increment(EC))
    if (sys::path::extension(It->path()) != ".onnx")
      return Refuse("it holds '" + sys::path::filename(It->path()) +
                    "', which is not an ONNX file; name a new folder or an "
                    "earlier export");
  return Error::success();
}

Expected<std::vector<std::string>> exportGraphs(const Plan &P,
                                                StringRef Dir) {
  if (auto E = checkGraphsOutput(Dir))
    return E;
  int Stages = P.numStages();
  std::vector<std::string> Names;
  for (int K = 0; K < Stages; ++K)
    Names.push_back(P.Stages.empty() ? std::string("program.onnx")
                                     : formatv("program-{0}.onnx", K).str());
  if (auto E = writeDirectoryAtomically(Dir, [&](StringRef Tmp) -> Error {
        for (int K = 0; K < Stages; ++K) {
          auto Bytes = programToOnnx(P, P.stage(K), K, Stages);
          if (!Bytes)
            return Bytes.takeError();
          if (auto E = writeFileAtomically((Tmp + "/" + Names[K]).str(),
                                           [&](raw_ostream &OS) {
                                             OS << *Bytes;
                                           }))
            return E;
        }
        return Error::success();
      }))
    return E;
  return Names;
}

} // namespace sp
