//===- Program.cpp - The program's buffers, and its JSON form -------------===//
#include "plan/Program.h"
#include "ir/OpDef.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include <cmath>
#include <limits>

using namespace llvm;
using json = nlohmann::json;

namespace sp {

int Program::findBuffer(StringRef Name) const {
  for (size_t I = 0; I < Buffers.size(); ++I)
    if (Buffers[I].Name == Name)
      return I;
  return -1;
}

int Program::output(StringRef Name) const {
  for (auto &[N, B] : Outputs)
    if (N == Name)
      return B;
  return -1;
}

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

static const char *const KindNames[] = {"input", "param", "state", "const",
                                        "temp"};
static const char *const ScopeNames[] = {"whole", "step", "slot",
                                         "microbatch"};
static const char *const TemplateKindNames[] = {
    "prologue", "forward", "backward", "weight_grad", "epilogue"};

StringRef bufferKindName(ProgramBuffer::Kind K) { return KindNames[K]; }

StringRef bufferScopeName(BufferScope S) { return ScopeNames[int(S)]; }

StringRef templateKindName(TemplateKind K) {
  return TemplateKindNames[int(K)];
}
static const char *const ShardNames[] = {"none", "replicated", "split",
                                         "partial"};

static json shardingToJson(const Sharding &S) {
  json J = {{"kind", ShardNames[S.K]}};
  if (S.K == Sharding::Split)
    J.update({{"dim", S.Dim}, {"parts", S.Parts}, {"blocks", S.Blocks},
              {"padded", S.Padded}});
  if (S.SumGrad)
    J["sum_grad"] = true;
  if (S.DataChunks)
    J["dp_chunks"] = S.DataChunks;
  return J;
}

static json floatToJson(double D) {
  if (std::isnan(D))
    return "nan";
  if (std::isinf(D))
    return D > 0 ? "inf" : "-inf";
  return D;
}

static Expected<double> floatFromJson(const json &J) {
  if (J.is_number())
    return J.get<double>();
  if (J == "inf")
    return HUGE_VAL;
  if (J == "-inf")
    return -HUGE_VAL;
  if (J == "nan")
    return std::nan("");
  return createStringError(inconvertibleErrorCode(), "malformed float");
}

/// Ints and strings map to JSON directly; floats and float lists are tagged
/// ({"f": x}, {"fl": [...]}) so that 1.0 stays a float.
static json attrsToJson(const AttrList &A) {
  json J = json::object();
  for (const auto &[Name, V] : A.entries()) {
    if (auto *I = std::get_if<int64_t>(&V))
      J[Name] = *I;
    else if (auto *F = std::get_if<double>(&V))
      J[Name] = {{"f", floatToJson(*F)}};
    else if (auto *S = std::get_if<std::string>(&V))
      J[Name] = *S;
    else if (auto *L = std::get_if<std::vector<int64_t>>(&V))
      J[Name] = *L;
    else if (auto *FL = std::get_if<std::vector<double>>(&V)) {
      json Arr = json::array();
      for (double D : *FL)
        Arr.push_back(floatToJson(D));
      J[Name] = {{"fl", Arr}};
    }
  }
  return J;
}

/// A reference also records the source tensor's type: a split parameter's
/// buffer holds a shard of it.
static json dataToJson(const TensorData &D) {
  const DataRef &R = D.ref();
  json Source = {{"dtype", dtypeName(D.type().Dtype).str()},
                 {"shape", std::vector<int64_t>(D.type().Shape.begin(),
                                                D.type().Shape.end())}};
  switch (R.K) {
  case DataRef::External:
    return {{"kind", "external"}, {"path", R.Path},     {"offset", R.Offset},
            {"length", R.Length}, {"source", Source}};
  case DataRef::OnnxInitializer:
    return {{"kind", "onnx"}, {"path", R.Path}, {"key", R.Key},
            {"source", Source}};
  case DataRef::Inline: {
    ArrayRef<char> B = cantFail(D.load());
    return {{"kind", "inline"},
            {"hex", toHex(StringRef(B.data(), B.size()), /*LowerCase=*/true)}};
  }
  }
  return nullptr;
}

json programToJson(const Program &P) {
  json Buffers = json::array();
  for (const ProgramBuffer &B : P.Buffers) {
    json J = {{"name", B.Name},
              {"dtype", dtypeName(B.Type.Dtype).str()},
              {"shape", std::vector<int64_t>(B.Type.Shape.begin(),
                                             B.Type.Shape.end())},
              {"kind", KindNames[B.K]},
              {"bytes", B.Bytes},
              {"offset", B.Offset}};
    if (B.K == ProgramBuffer::Temp) {
      J["def"] = B.Def;
      J["last_use"] = B.LastUse;
      J["layer"] = B.Layer;
      J["role"] = roleName(B.Role).str();
    }
    if (B.K == ProgramBuffer::Input) {
      J["feed"] = inputRoleName(B.Feed).str();
      if (B.Microbatch >= 0)
        J["microbatch"] = B.Microbatch;
    }
    if (B.Shard.K != Sharding::None)
      J["sharding"] = shardingToJson(B.Shard);
    if (B.Scope != BufferScope::Whole)
      J["scope"] = ScopeNames[int(B.Scope)];
    if (B.Scope == BufferScope::Slot)
      J["region"] = B.Region;
    if (B.Scope == BufferScope::Microbatch)
      J["stride"] = B.Stride;
    if (B.Data)
      J["data"] = dataToJson(*B.Data);
    Buffers.push_back(std::move(J));
  }
  json Instrs = json::array();
  for (const Instruction &I : P.Instrs) {
    json J = {{"op", opName(I.Op).str()},
              {"in", std::vector<int>(I.In.begin(), I.In.end())},
              {"out", std::vector<int>(I.Out.begin(), I.Out.end())},
              {"phase", phaseName(I.Ph).str()}};
    if (!I.Attrs.empty())
      J["attrs"] = attrsToJson(I.Attrs);
    if (I.Layer >= 0)
      J["layer"] = I.Layer;
    if (I.Role != Role::None)
      J["role"] = roleName(I.Role).str();
    if (!I.Name.empty())
      J["name"] = I.Name;
    if (I.Beside >= 0)
      J["beside"] = I.Beside;
    Instrs.push_back(std::move(J));
  }
  json Outputs = json::array();
  for (auto &[Name, Id] : P.Outputs)
    Outputs.push_back({{"name", Name}, {"buffer", Id}});
  json J = {{"persistent_bytes", P.PersistentBytes},
            {"arena_bytes", P.ArenaBytes},
            {"buffers", Buffers},
            {"instructions", Instrs},
            {"outputs", Outputs}};
  if (!P.compact())
    return J;
  json Templates = json::array(), Steps = json::array(),
       Slots = json::array();
  for (const ProgramTemplate &T : P.Templates)
    Templates.push_back({{"kind", templateKindName(T.Kind).str()},
                         {"chunk", T.Chunk},
                         {"begin", T.Begin},
                         {"end", T.End}});
  // [template, microbatch] per step: a 1T rank has thousands.
  for (const ProgramStep &S : P.Steps)
    Steps.push_back({S.Template, S.Microbatch});
  for (const SlotRegion &R : P.Slots)
    Slots.push_back({{"chunk", R.Chunk},
                     {"offset", R.Offset},
                     {"stride", R.Stride},
                     {"count", R.Count}});
  J["microbatches"] = P.Microbatches;
  J["tag_stride"] = P.TagStride;
  J["templates"] = std::move(Templates);
  J["steps"] = std::move(Steps);
  J["slots"] = std::move(Slots);
  return J;
}

bool isIntegerIn(const json &J, int64_t Min, int64_t Max) {
  if (J.is_number_unsigned()) {
    // Non-negative integers parse as unsigned, and may exceed int64_t.
    uint64_t U = J.get<uint64_t>();
    return Max >= 0 && U <= uint64_t(Max) && (Min <= 0 || U >= uint64_t(Min));
  }
  if (J.is_number_integer())
    return J.get<int64_t>() >= Min && J.get<int64_t>() <= Max;
  return false;
}

static Error formatError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(),
                           "malformed program: " + Msg);
}

namespace {

/// Reading a program is a walk over nested JSON; a malformed field anywhere
/// ends it with this, caught once in programFromJson.
struct MalformedProgram {
  std::string Msg;
};

[[noreturn]] void malformed(const Twine &Msg) {
  throw MalformedProgram{Msg.str()};
}

/// Typed access to the fields of one JSON object, with messages that name
/// the object (Where) and the field. json::get would convert a float to an
/// integer (undefined when out of range) and wrap large integers; these
/// refuse anything but the exact type and range.
class Fields {
public:
  Fields(const json &J, std::string Where) : J(J), Where(std::move(Where)) {
    if (!J.is_object())
      malformed(this->Where + " is not an object");
  }
  bool has(const char *Key) const { return J.contains(Key); }
  const json &at(const char *Key) const {
    auto It = J.find(Key);
    if (It == J.end())
      malformed(Where + " has no '" + Key + "'");
    return *It;
  }
  int64_t integer(const char *Key, int64_t Min, int64_t Max) const {
    return integerOf(at(Key), "'" + Twine(Key) + "'", Min, Max);
  }
  int64_t integer(const char *Key, int64_t Min, int64_t Max,
                  int64_t Default) const {
    return has(Key) ? integer(Key, Min, Max) : Default;
  }
  std::string string(const char *Key) const {
    const json &V = at(Key);
    if (!V.is_string())
      malformed(Where + ": '" + Key + "' must be a string");
    return V.get<std::string>();
  }
  std::string string(const char *Key, StringRef Default) const {
    return has(Key) ? string(Key) : Default.str();
  }
  bool boolean(const char *Key, bool Default) const {
    if (!has(Key))
      return Default;
    if (!J[Key].is_boolean())
      malformed(Where + ": '" + Key + "' must be true or false");
    return J[Key].get<bool>();
  }
  const json &array(const char *Key) const {
    const json &V = at(Key);
    if (!V.is_array())
      malformed(Where + ": '" + Key + "' must be a list");
    return V;
  }
  std::vector<int64_t> integers(const char *Key, int64_t Min,
                                int64_t Max) const {
    std::vector<int64_t> R;
    for (const json &V : array(Key))
      R.push_back(integerOf(V, "every element of '" + Twine(Key) + "'", Min,
                            Max));
    return R;
  }
  const std::string &where() const { return Where; }

private:
  int64_t integerOf(const json &V, const Twine &What, int64_t Min,
                    int64_t Max) const {
    if (!isIntegerIn(V, Min, Max))
      malformed(Where + ": " + What +
                formatv(" must be an integer in [{0}, {1}]", Min, Max));
    return V.get<int64_t>();
  }

  const json &J;
  std::string Where;
};

constexpr int64_t IntMax = std::numeric_limits<int>::max();
constexpr int64_t Int64Max = std::numeric_limits<int64_t>::max();

/// At most 2^48 elements, as the importer allows: byte counts never
/// overflow.
constexpr int64_t MaxElements = int64_t(1) << 48;

TensorType typeFromJson(const Fields &F, const char *DtypeKey,
                        const char *ShapeKey) {
  std::string Name = F.string(DtypeKey);
  auto D = parseDType(Name);
  if (!D)
    malformed(F.where() + " has an unknown dtype '" + Name + "'");
  TensorType T(*D, F.integers(ShapeKey, 0, Int64Max));
  int64_t N = 1;
  for (int64_t Dim : T.Shape)
    if (__builtin_mul_overflow(N, Dim, &N) || N > MaxElements)
      malformed(F.where() + " has more than 2^48 elements");
  return T;
}

Sharding shardingFromJson(const json &J, const TensorType &T,
                          const std::string &Where) {
  Fields F(J, Where + ": sharding");
  Sharding S;
  std::string Kind = F.string("kind");
  auto It = find(ShardNames, Kind);
  if (It == std::end(ShardNames))
    malformed(F.where() + " has an unknown kind '" + Kind + "'");
  S.K = Sharding::Kind(It - std::begin(ShardNames));
  S.DataChunks = F.integer("dp_chunks", 0, IntMax, 0);
  if (S.K == Sharding::Split && S.DataChunks) {
    // A data-parallel chunk (ZeRO): the split describes the value it is cut
    // from, which only gathers read; the chunk itself is never sliced.
    if (T.rank() != 1)
      malformed(F.where() + " is a data-parallel chunk of rank " +
                std::to_string(T.rank()) + "; chunks are flat");
    S.Dim = F.integer("dim", 0, IntMax);
    S.Parts = F.integer("parts", 1, IntMax);
    S.Blocks = F.integer("blocks", 1, IntMax);
    S.Padded = F.integer("padded", 0, MaxElements);
  } else if (S.K == Sharding::Split) {
    // The executor slices the split axis of the value.
    if (T.rank() == 0)
      malformed(F.where() + " splits a scalar");
    S.Dim = F.integer("dim", 0, T.rank() - 1);
    S.Parts = F.integer("parts", 1, IntMax);
    S.Blocks = F.integer("blocks", 1, IntMax);
    S.Padded = F.integer("padded", 0, MaxElements);
    // Each rank holds part r of every block (runtime/ExecutorParallel.cpp).
    if (T.Shape[S.Dim] % S.Blocks)
      malformed(formatv("{0}: {1} blocks do not divide axis {2} of {3}",
                        F.where(), S.Blocks, S.Dim, T.str()));
  }
  S.SumGrad = F.boolean("sum_grad", false);
  return S;
}

std::shared_ptr<TensorData> dataFromJson(const json &J, const TensorType &T,
                                         const std::string &Where) {
  Fields F(J, Where + ": data");
  std::string Kind = F.string("kind");
  if (Kind == "inline") {
    std::string Bytes;
    if (!tryGetFromHex(F.string("hex"), Bytes) ||
        int64_t(Bytes.size()) != T.numBytes())
      malformed(Where + " has bad inline data");
    return TensorData::makeInline(T,
                                  std::vector<char>(Bytes.begin(), Bytes.end()));
  }
  // A reference records the type of its whole source tensor.
  TensorType SourceType = T;
  if (F.has("source"))
    SourceType = typeFromJson(Fields(F.at("source"), Where + ": data source"),
                              "dtype", "shape");
  DataRef R;
  R.Path = F.string("path");
  if (Kind == "external") {
    R.K = DataRef::External;
    R.Offset = F.integer("offset", 0, Int64Max);
    R.Length = F.integer("length", 0, Int64Max);
  } else if (Kind == "onnx") {
    R.K = DataRef::OnnxInitializer;
    R.Key = F.string("key");
  } else {
    malformed(Where + " has an unknown data kind '" + Kind + "'");
  }
  return TensorData::makeRef(SourceType, R);
}

/// The role named Name; an unknown one is malformed (a plan from another
/// version of sp, or edited by hand).
Role role(const std::string &Name, const std::string &Where) {
  auto R = parseRole(Name);
  if (!R)
    malformed(Where + " has an unknown role '" + Name +
              "'; recompile the plan with this sp-compile");
  return *R;
}

/// A reference's data is the buffer's whole source tensor
/// (runtime/ExecutorParallel.cpp reads it): the buffer's own type, or for a
/// split buffer the same dtype and rank with the split axis Parts times as
/// long (padded: at most that long, the rest zeros), its Blocks blocks each
/// split evenly over the ranks (shardingFromJson checked the blocks).
void checkSource(const ProgramBuffer &B, const std::string &Where) {
  const TensorType &T = B.Type, &Src = B.Data->type();
  const Sharding &S = B.Shard;
  auto Bad = [&]() {
    std::string Type = T.str();
    if (S.K != Sharding::None) {
      Type += ' ';
      Type += S.str();
    }
    malformed(Where + " has type " + Type + " but its data is " + Src.str());
  };
  if (S.K != Sharding::Split) {
    if (Src != T)
      Bad();
    return;
  }
  if (Src.Dtype != T.Dtype || Src.rank() != T.rank())
    Bad();
  for (unsigned I = 0; I < T.rank(); ++I)
    if (int(I) != S.Dim && Src.Shape[I] != T.Shape[I])
      Bad();
  int64_t Local = T.Shape[S.Dim], Global;
  if (__builtin_mul_overflow(Local, S.Parts, &Global) ||
      (S.Padded ? S.Padded != Global || Src.Shape[S.Dim] > Global
                : Src.Shape[S.Dim] != Global))
    Bad();
}

AttrList attrsFromJson(const json &J, const std::string &Where) {
  if (!J.is_object())
    malformed(Where + ": 'attrs' is not an object");
  AttrList A;
  auto Float = [&](const json &V, const std::string &Name) {
    auto F = floatFromJson(V);
    if (!F) {
      consumeError(F.takeError());
      malformed(Where + ": attribute '" + Name + "' has a malformed float");
    }
    return *F;
  };
  for (auto &[Name, V] : J.items()) {
    if (V.is_number_integer()) {
      if (!isIntegerIn(V, std::numeric_limits<int64_t>::min(), Int64Max))
        malformed(Where + ": attribute '" + Name + "' is out of range");
      A.set(Name, V.get<int64_t>());
    } else if (V.is_string()) {
      A.set(Name, V.get<std::string>());
    } else if (V.is_array()) {
      std::vector<int64_t> L;
      for (const json &E : V) {
        if (!isIntegerIn(E, std::numeric_limits<int64_t>::min(), Int64Max))
          malformed(Where + ": attribute '" + Name +
                    "' must be a list of integers");
        L.push_back(E.get<int64_t>());
      }
      A.set(Name, L);
    } else if (V.is_object() && V.size() == 1 && V.contains("f")) {
      A.set(Name, Float(V["f"], Name));
    } else if (V.is_object() && V.size() == 1 && V.contains("fl") &&
               V["fl"].is_array()) {
      std::vector<double> L;
      for (const json &E : V["fl"])
        L.push_back(Float(E, Name));
      A.set(Name, L);
    } else {
      malformed(Where + ": malformed attribute '" + Name + "'");
    }
  }
  return A;
}

/// Every instruction computes its buffers' types: its results have the
/// types the op's shape rule gives its operands, as the verifier checks a
/// graph (the executor checks the attributes at load; the shape rules read
/// them with total getters). The kernels size what they read and write by
/// the operands, so an edited program with a missing operand or result, or a
/// result buffer of another type, would be read or written out of bounds.
/// Optional trailing results (a dropout mask) may be absent. Precision is
/// the plan's, not the op's: a mixed-precision plan holds activations in a
/// 16-bit type and gradients in f32, so the rules see every float buffer as
/// f32 (Executor::create checks which 16-bit type a plan may hold).
static TensorType asF32(TensorType T) {
  if (T.Dtype == DType::F16 || T.Dtype == DType::BF16)
    T.Dtype = DType::F32;
  return T;
}

void checkInstructionTypes(const Program &P) {
  Graph Scratch("program");
  std::vector<Value *> Values;
  for (const ProgramBuffer &B : P.Buffers)
    Values.push_back(
        Scratch.addInput("b" + std::to_string(Values.size()), asF32(B.Type)));
  for (size_t K = 0; K < P.Instrs.size(); ++K) {
    const Instruction &I = P.Instrs[K];
    std::string Where =
        formatv("instruction {0} ({1})", K, opName(I.Op)).str();
    if (isOnnxOp(I.Op))
      malformed(Where + " is not a runtime op");
    SmallVector<Value *, 4> Operands;
    for (int Id : I.In)
      Operands.push_back(Values[Id]);
    // The stage-to-stage messages have no shape rule: send (x), recv () -> x
    // and pipe_broadcast (x on the root stage, nothing elsewhere) -> x.
    TypeList Types;
    if (I.Op == OpKind::Send || I.Op == OpKind::Recv ||
        I.Op == OpKind::PipeBroadcast) {
      size_t Ins = I.Op == OpKind::Send ? 1 : 0;
      if (I.In.size() != Ins &&
          !(I.Op == OpKind::PipeBroadcast && I.In.size() == 1))
        malformed(formatv("{0}: expected {1} operands, got {2}", Where, Ins,
                          I.In.size()));
      if (I.Op != OpKind::Send)
        Types.push_back(!I.In.empty()    ? P.Buffers[I.In[0]].Type
                        : !I.Out.empty() ? P.Buffers[I.Out[0]].Type
                                         : TensorType());
    } else {
      auto Inferred = inferTypes(I.Op, Operands, I.Attrs);
      if (!Inferred)
        malformed(Where + ": " + toString(Inferred.takeError()));
      Types = std::move(*Inferred);
    }
    if (I.Out.size() > Types.size() || (I.Out.empty() && !Types.empty()))
      malformed(formatv("{0} has {1} results, expected {2}", Where,
                        I.Out.size(), Types.size()));
    for (size_t R = 0; R < I.Out.size(); ++R) {
      const ProgramBuffer &B = P.Buffers[I.Out[R]];
      if (asF32(B.Type) != asF32(Types[R]))
        malformed(formatv("{0}: result {1} (buffer '{2}') is {3}, the op "
                          "computes {4}",
                          Where, R, B.Name, B.Type.str(), Types[R].str()));
    }
  }
}

Program programFromJsonOrThrow(const json &J) {
  Program P;
  Fields Top(J, "the program");
  P.PersistentBytes = Top.integer("persistent_bytes", 0, Int64Max);
  P.ArenaBytes = Top.integer("arena_bytes", P.PersistentBytes, Int64Max);
  for (const json &JB : Top.array("buffers")) {
    ProgramBuffer B;
    std::string Where = formatv("buffer {0}", P.Buffers.size()).str();
    B.Name = Fields(JB, Where).string("name");
    Where += " ('" + B.Name + "')";
    Fields F(JB, Where);
    B.Type = typeFromJson(F, "dtype", "shape");
    std::string Kind = F.string("kind");
    auto It = find(KindNames, Kind);
    if (It == std::end(KindNames))
      malformed(Where + " has an unknown kind '" + Kind + "'");
    B.K = ProgramBuffer::Kind(It - std::begin(KindNames));
    // Every buffer lies inside the arena the runtime allocates.
    B.Bytes = F.integer("bytes", 0, P.ArenaBytes);
    B.Offset = F.integer("offset", 0, P.ArenaBytes - B.Bytes);
    if (B.K == ProgramBuffer::Temp) {
      B.Def = F.integer("def", 0, IntMax);
      B.LastUse = F.integer("last_use", B.Def, IntMax);
      B.Layer = F.integer("layer", -1, IntMax);
      B.Role = role(F.string("role"), Where);
    }
    if (B.K == ProgramBuffer::Input) {
      std::string Feed = F.string("feed");
      auto R = parseInputRole(Feed);
      if (!R)
        malformed(Where + " has an unknown feed '" + Feed + "'");
      B.Feed = *R;
      B.Microbatch = F.integer("microbatch", -1, IntMax, -1);
    }
    if (F.has("sharding"))
      B.Shard = shardingFromJson(F.at("sharding"), B.Type, Where);
    std::string Scope = F.string("scope", "whole");
    auto SIt = find(ScopeNames, Scope);
    if (SIt == std::end(ScopeNames))
      malformed(Where + " has an unknown scope '" + Scope + "'");
    B.Scope = BufferScope(SIt - std::begin(ScopeNames));
    if (B.Scope == BufferScope::Slot)
      B.Region = F.integer("region", 0, IntMax);
    if (B.Scope == BufferScope::Microbatch)
      B.Stride = F.integer("stride", 0, P.ArenaBytes);
    if (F.has("data")) {
      B.Data = dataFromJson(F.at("data"), B.Type, Where);
      if (!B.Data->isInline())
        checkSource(B, Where);
    }
    P.Buffers.push_back(std::move(B));
  }
  int64_t NumBuffers = P.Buffers.size();
  for (const json &JI : Top.array("instructions")) {
    Instruction I;
    std::string Where = formatv("instruction {0}", P.Instrs.size()).str();
    std::string Op = Fields(JI, Where).string("op");
    auto K = parseOpName(Op);
    if (!K)
      malformed("unknown op '" + Op + "'");
    I.Op = *K;
    Where += " (" + Op + ")";
    Fields F(JI, Where);
    for (int64_t Id : F.integers("in", 0, NumBuffers - 1))
      I.In.push_back(Id);
    for (int64_t Id : F.integers("out", 0, NumBuffers - 1))
      I.Out.push_back(Id);
    std::string Phase = F.string("phase");
    auto Ph = parsePhase(Phase);
    if (!Ph)
      malformed(Where + " has an unknown phase '" + Phase + "'");
    I.Ph = *Ph;
    if (F.has("attrs"))
      I.Attrs = attrsFromJson(F.at("attrs"), Where);
    I.Layer = F.integer("layer", -1, IntMax, -1);
    I.Role = role(F.string("role", ""), Where);
    I.Name = F.string("name", "");
    I.Beside = F.integer("beside", -1, IntMax, -1);
    P.Instrs.push_back(std::move(I));
  }
  // A collective runs beside a later GEMM.
  for (size_t K = 0; K < P.Instrs.size(); ++K) {
    const Instruction &I = P.Instrs[K];
    if (I.Beside < 0)
      continue;
    std::string Where =
        formatv("instruction {0} ({1})", K, opName(I.Op)).str();
    if (!isCollectiveOp(I.Op))
      malformed(Where + " is not a collective but runs beside another");
    if (I.Beside <= int64_t(K) || I.Beside >= int64_t(P.Instrs.size()))
      malformed(formatv("{0} runs beside instruction {1}, which is not a "
                        "later one",
                        Where, I.Beside));
    OpKind G = P.Instrs[I.Beside].Op;
    if (!isGemmOp(G))
      malformed(formatv("{0} runs beside instruction {1} ({2}), which is not "
                        "a GEMM",
                        Where, I.Beside, opName(G)));
  }
  checkInstructionTypes(P);
  // A temporary lives within the program (an output's temporary until just
  // after its end).
  for (const ProgramBuffer &B : P.Buffers)
    if (B.K == ProgramBuffer::Temp && B.LastUse > int64_t(P.Instrs.size()))
      malformed(formatv("buffer '{0}' is live until instruction {1}, after "
                        "the last one ({2})",
                        B.Name, B.LastUse, P.Instrs.size()));
  for (const json &JO : Top.array("outputs")) {
    Fields F(JO, formatv("output {0}", P.Outputs.size()).str());
    std::string Name = F.string("name");
    P.Outputs.push_back({Name, int(F.integer("buffer", 0, NumBuffers - 1))});
  }
  if (!Top.has("templates"))
    return P;
  P.Microbatches = Top.integer("microbatches", 1, IntMax);
  P.TagStride = Top.integer("tag_stride", 1, IntMax);
  int64_t NumInstrs = P.Instrs.size();
  for (const json &JT : Top.array("templates")) {
    Fields F(JT, formatv("template {0}", P.Templates.size()).str());
    ProgramTemplate T;
    std::string Kind = F.string("kind");
    auto It = find(TemplateKindNames, Kind);
    if (It == std::end(TemplateKindNames))
      malformed(F.where() + " has an unknown kind '" + Kind + "'");
    T.Kind = TemplateKind(It - std::begin(TemplateKindNames));
    T.Chunk = F.integer("chunk", -1, IntMax);
    T.Begin = F.integer("begin", 0, NumInstrs);
    T.End = F.integer("end", T.Begin, NumInstrs);
    P.Templates.push_back(T);
  }
  if (P.Templates.empty())
    malformed("a compact program without templates");
  int64_t NumTemplates = P.Templates.size();
  for (const json &JS : Top.array("steps")) {
    std::string Where = formatv("step {0}", P.Steps.size()).str();
    if (!JS.is_array() || JS.size() != 2 ||
        !isIntegerIn(JS[0], 0, NumTemplates - 1) ||
        !isIntegerIn(JS[1], -1, IntMax))
      malformed(Where + " is not [template, microbatch]");
    P.Steps.push_back({JS[0].get<int>(), JS[1].get<int>()});
  }
  for (const json &JR : Top.array("slots")) {
    Fields F(JR, formatv("slot region {0}", P.Slots.size()).str());
    SlotRegion R;
    R.Chunk = F.integer("chunk", 0, IntMax);
    R.Offset = F.integer("offset", 0, P.ArenaBytes);
    R.Stride = F.integer("stride", 0, P.ArenaBytes);
    R.Count = F.integer("count", 0, IntMax);
    P.Slots.push_back(R);
  }
  if (auto E = checkCompactProgram(P))
    malformed(toString(std::move(E)));
  if (auto A = assignSlots(P); !A)
    malformed(toString(A.takeError()));
  return P;
}

} // namespace

Expected<Program> programFromJson(const json &J) {
  try {
    return programFromJsonOrThrow(J);
  } catch (const MalformedProgram &E) {
    return formatError(E.Msg);
  } catch (const json::exception &E) {
    return formatError(E.what());
  }
}

} // namespace sp
