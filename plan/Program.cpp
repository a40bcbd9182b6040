//===- Program.cpp - The program's buffers, and its JSON form -------------===//
#include "plan/Program.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include <cmath>

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
static const char *const ShardNames[] = {"none", "replicated", "split",
                                         "partial"};

static json shardingToJson(const Sharding &S) {
  json J = {{"kind", ShardNames[S.K]}};
  if (S.K == Sharding::Split)
    J.update({{"dim", S.Dim}, {"parts", S.Parts}, {"blocks", S.Blocks},
              {"padded", S.Padded}});
  if (S.SumGrad)
    J["sum_grad"] = true;
  return J;
}

static Expected<Sharding> shardingFromJson(const json &J) {
  Sharding S;
  std::string Kind = J.at("kind").get<std::string>();
  auto It = find(ShardNames, Kind);
  if (It == std::end(ShardNames))
    return createStringError(inconvertibleErrorCode(),
                             "malformed program: unknown sharding '%s'",
                             Kind.c_str());
  S.K = Sharding::Kind(It - std::begin(ShardNames));
  if (S.K == Sharding::Split) {
    S.Dim = J.at("dim").get<int>();
    S.Parts = J.at("parts").get<int>();
    S.Blocks = J.at("blocks").get<int>();
    S.Padded = J.at("padded").get<int64_t>();
  }
  S.SumGrad = J.value("sum_grad", false);
  return S;
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

static Expected<AttrList> attrsFromJson(const json &J) {
  AttrList A;
  for (auto &[Name, V] : J.items()) {
    if (V.is_number_integer())
      A.set(Name, V.get<int64_t>());
    else if (V.is_string())
      A.set(Name, V.get<std::string>());
    else if (V.is_array())
      A.set(Name, V.get<std::vector<int64_t>>());
    else if (V.is_object() && V.contains("f")) {
      auto F = floatFromJson(V["f"]);
      if (!F)
        return F.takeError();
      A.set(Name, *F);
    } else if (V.is_object() && V.contains("fl")) {
      std::vector<double> L;
      for (const json &E : V["fl"]) {
        auto F = floatFromJson(E);
        if (!F)
          return F.takeError();
        L.push_back(*F);
      }
      A.set(Name, L);
    } else {
      return createStringError(inconvertibleErrorCode(),
                               "malformed attribute '%s'", Name.c_str());
    }
  }
  return A;
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
      J["role"] = B.Role;
    }
    if (B.K == ProgramBuffer::Input) {
      J["feed"] = inputRoleName(B.Feed).str();
      if (B.Microbatch >= 0)
        J["microbatch"] = B.Microbatch;
    }
    if (B.Shard.K != Sharding::None)
      J["sharding"] = shardingToJson(B.Shard);
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
    if (!I.Role.empty())
      J["role"] = I.Role;
    if (!I.Name.empty())
      J["name"] = I.Name;
    Instrs.push_back(std::move(J));
  }
  json Outputs = json::array();
  for (auto &[Name, Id] : P.Outputs)
    Outputs.push_back({{"name", Name}, {"buffer", Id}});
  return {{"persistent_bytes", P.PersistentBytes},
          {"arena_bytes", P.ArenaBytes},
          {"buffers", Buffers},
          {"instructions", Instrs},
          {"outputs", Outputs}};
}

static Error formatError(const Twine &Msg) {
  return createStringError(inconvertibleErrorCode(),
                           "malformed program: " + Msg);
}

Expected<Program> programFromJson(const json &J) {
  Program P;
  try {
    P.PersistentBytes = J.at("persistent_bytes").get<int64_t>();
    P.ArenaBytes = J.at("arena_bytes").get<int64_t>();
    for (const json &JB : J.at("buffers")) {
      ProgramBuffer B;
      B.Name = JB.at("name").get<std::string>();
      auto D = parseDType(JB.at("dtype").get<std::string>());
      if (!D)
        return formatError("buffer '" + B.Name + "' has an unknown dtype");
      B.Type = TensorType(*D, JB.at("shape").get<std::vector<int64_t>>());
      std::string Kind = JB.at("kind").get<std::string>();
      auto It = find(KindNames, Kind);
      if (It == std::end(KindNames))
        return formatError("buffer '" + B.Name + "' has an unknown kind");
      B.K = ProgramBuffer::Kind(It - std::begin(KindNames));
      B.Bytes = JB.at("bytes").get<int64_t>();
      B.Offset = JB.at("offset").get<int64_t>();
      if (B.K == ProgramBuffer::Temp) {
        B.Def = JB.at("def").get<int>();
        B.LastUse = JB.at("last_use").get<int>();
        B.Layer = JB.at("layer").get<int>();
        B.Role = JB.at("role").get<std::string>();
      }
      if (B.K == ProgramBuffer::Input) {
        auto R = parseInputRole(JB.at("feed").get<std::string>());
        if (!R)
          return formatError("input '" + B.Name + "' has an unknown feed");
        B.Feed = *R;
        B.Microbatch = JB.value("microbatch", -1);
      }
      if (JB.contains("sharding")) {
        auto S = shardingFromJson(JB["sharding"]);
        if (!S)
          return S.takeError();
        B.Shard = *S;
      }
      if (JB.contains("data")) {
        const json &JD = JB["data"];
        std::string DK = JD.at("kind").get<std::string>();
        DataRef R;
        TensorType SourceType = B.Type;
        if (JD.contains("source")) {
          auto SD = parseDType(JD["source"].at("dtype").get<std::string>());
          if (!SD)
            return formatError("buffer '" + B.Name +
                               "' has an unknown source dtype");
          SourceType = TensorType(
              *SD, JD["source"].at("shape").get<std::vector<int64_t>>());
        }
        if (DK == "inline") {
          std::string Bytes;
          if (!tryGetFromHex(JD.at("hex").get<std::string>(), Bytes) ||
              int64_t(Bytes.size()) != B.Type.numBytes())
            return formatError("buffer '" + B.Name + "' has bad inline data");
          B.Data = TensorData::makeInline(
              B.Type, std::vector<char>(Bytes.begin(), Bytes.end()));
        } else if (DK == "external") {
          R.K = DataRef::External;
          R.Path = JD.at("path").get<std::string>();
          R.Offset = JD.at("offset").get<int64_t>();
          R.Length = JD.at("length").get<int64_t>();
          B.Data = TensorData::makeRef(SourceType, R);
        } else if (DK == "onnx") {
          R.K = DataRef::OnnxInitializer;
          R.Path = JD.at("path").get<std::string>();
          R.Key = JD.at("key").get<std::string>();
          B.Data = TensorData::makeRef(SourceType, R);
        } else {
          return formatError("buffer '" + B.Name + "' has unknown data kind");
        }
      }
      P.Buffers.push_back(std::move(B));
    }
    int NumBuffers = P.Buffers.size();
    for (const json &JI : J.at("instructions")) {
      Instruction I;
      std::string Op = JI.at("op").get<std::string>();
      auto K = parseOpName(Op);
      if (!K)
        return formatError("unknown op '" + Op + "'");
      I.Op = *K;
      for (int Id : JI.at("in").get<std::vector<int>>())
        I.In.push_back(Id);
      for (int Id : JI.at("out").get<std::vector<int>>())
        I.Out.push_back(Id);
      for (int Id : concat<int>(I.In, I.Out))
        if (Id < 0 || Id >= NumBuffers)
          return formatError("instruction '" + Op + "' uses buffer " +
                             Twine(Id) + " out of range");
      auto Ph = parsePhase(JI.at("phase").get<std::string>());
      if (!Ph)
        return formatError("instruction '" + Op + "' has an unknown phase");
      I.Ph = *Ph;
      if (JI.contains("attrs")) {
        auto A = attrsFromJson(JI["attrs"]);
        if (!A)
          return A.takeError();
        I.Attrs = std::move(*A);
      }
      I.Layer = JI.value("layer", -1);
      I.Role = JI.value("role", "");
      I.Name = JI.value("name", "");
      P.Instrs.push_back(std::move(I));
    }
    for (const json &JO : J.at("outputs"))
      P.Outputs.push_back(
          {JO.at("name").get<std::string>(), JO.at("buffer").get<int>()});
  } catch (const json::exception &E) {
    return formatError(E.what());
  }
  return P;
}

} // namespace sp
