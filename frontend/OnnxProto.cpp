//===- OnnxProto.cpp - Reading ONNX files, tensors and their data ---------===//
#include "frontend/OnnxProto.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Chrono.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SwapByteOrder.h"
#include <climits>
#include <cstring>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <mutex>

using namespace llvm;

namespace sp::onnxio {

static_assert(sys::IsLittleEndianHost,
              "tensor bytes are stored little-endian, as in ONNX");

/// "PATH: message", on one line.
Error fileError(StringRef Path, const Twine &Msg) {
  std::string S = Msg.str();
  std::replace(S.begin(), S.end(), '\n', ' ');
  return makeError(Path + ": " + StringRef(S).trim());
}

bool isUtf8(StringRef S) {
  const auto *P = reinterpret_cast<const UTF8 *>(S.begin());
  return isLegalUTF8String(&P, reinterpret_cast<const UTF8 *>(S.end()));
}

/// S for a message: bytes that are not part of a valid UTF-8 sequence, and
/// control characters, as \xNN.
std::string escapeForMessage(StringRef S) {
  std::string R;
  const auto *P = reinterpret_cast<const UTF8 *>(S.begin());
  const auto *End = reinterpret_cast<const UTF8 *>(S.end());
  while (P < End) {
    unsigned N = getNumBytesForUTF8(*P);
    if (*P >= 0x20 && *P != 0x7f && N <= unsigned(End - P) &&
        isLegalUTF8Sequence(P, P + N)) {
      R.append(reinterpret_cast<const char *>(P), N);
      P += N;
      continue;
    }
    R += formatv("\\x{0:X-2}", unsigned(*P)).str();
    ++P;
  }
  return R;
}

/// The first string field of M, recursively, that is not valid UTF-8: its
/// path below M ("input[1]", "attribute[0].name") and its value; nullopt if
/// there is none. Doc strings, which sp never reads, are not checked;
/// attribute values are bytes in onnx.proto and are checked where they are
/// converted (convertAttribute).
std::optional<std::pair<std::string, std::string>>
findInvalidUtf8(const google::protobuf::Message &M) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection *R = M.GetReflection();
  std::vector<const FieldDescriptor *> Fields;
  R->ListFields(M, &Fields);
  for (const FieldDescriptor *F : Fields) {
    bool IsString = F->type() == FieldDescriptor::TYPE_STRING;
    if (F->name() == "doc_string" ||
        (!IsString && F->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE))
      continue; // numbers and bytes (raw_data) need no look
    bool Repeated = F->is_repeated();
    int N = Repeated ? R->FieldSize(M, F) : 1;
    auto Where = [&](int I) {
      return Repeated ? formatv("{0}[{1}]", F->name(), I).str() : F->name();
    };
    for (int I = 0; I < N; ++I) {
      if (IsString) {
        std::string Scratch;
        const std::string &S =
            Repeated ? R->GetRepeatedStringReference(M, F, I, &Scratch)
                     : R->GetStringReference(M, F, &Scratch);
        if (!isUtf8(S))
          return std::pair{Where(I), S};
      } else {
        const google::protobuf::Message &Sub =
            Repeated ? R->GetRepeatedMessage(M, F, I) : R->GetMessage(M, F);
        if (auto Bad = findInvalidUtf8(Sub))
          return std::pair{Where(I) + "." + Bad->first, Bad->second};
      }
    }
  }
  return std::nullopt;
}

//===----------------------------------------------------------------------===//
// Reading model files
//===----------------------------------------------------------------------===//

/// Result of walking the top-level fields of a serialized message.
namespace {

struct WireScan {
  enum Kind { Ok, Truncated, Malformed } K = Ok;
  std::string Detail;
};

/// Walks the top-level fields of a serialized ModelProto without parsing
/// them. A field that runs past the end of the buffer means the file was
/// truncated; an invalid tag or a known ModelProto field with the wrong wire
/// type means it is not an ONNX model.
WireScan scanModelWire(ArrayRef<uint8_t> Buf) {
  size_t Pos = 0, N = Buf.size();
  WireScan R;
  auto Truncated = [&](const Twine &What) {
    R.K = WireScan::Truncated;
    R.Detail = What.str();
    return R;
  };
  auto Malformed = [&]() {
    R.K = WireScan::Malformed;
    return R;
  };
  // Returns 0 on success, 1 if the buffer ends, 2 if malformed.
  auto ReadVarint = [&](uint64_t &V) -> int {
    V = 0;
    for (unsigned Shift = 0; Shift < 64; Shift += 7) {
      if (Pos >= N)
        return 1;
      uint8_t B = Buf[Pos++];
      V |= uint64_t(B & 0x7f) << Shift;
      if (!(B & 0x80))
        return 0;
    }
    return 2;
  };
  // Wire types of the fields of ModelProto (onnx.proto): 0 varint, 2 bytes.
  auto ExpectedWireType = [](uint64_t Field) -> int {
    switch (Field) {
    case 1: // ir_version
    case 5: // model_version
      return 0;
    case 2:
    case 3:
    case 4:
    case 6:
    case 7:
    case 8:
    case 14:
    case 20:
    case 25:
      return 2;
    default:
      return -1;
    }
  };
  while (Pos < N) {
    size_t FieldStart = Pos;
    uint64_t Tag;
    if (int E = ReadVarint(Tag))
      return E == 1 ? Truncated(formatv("a field tag at offset {0} is cut off",
                                        FieldStart))
                    : Malformed();
    uint64_t Field = Tag >> 3;
    int WireType = Tag & 7;
    if (Field == 0)
      return Malformed();
    int Want = ExpectedWireType(Field);
    if (Want >= 0 && Want != WireType)
      return Malformed();
    // What a varint of the field that ReadVarint could not read (E) means.
    auto VarintError = [&](int E) {
      return E == 1 ? Truncated(formatv("field {0} at offset {1} is cut off",
                                        Field, FieldStart))
                    : Malformed();
    };
    uint64_t Skip = 0;
    switch (WireType) {
    case 0: {
      uint64_t V;
      if (int E = ReadVarint(V))
        return VarintError(E);
      continue;
    }
    case 1:
      Skip = 8;
      break;
    case 2:
      if (int E = ReadVarint(Skip))
        return VarintError(E);
      break;
    case 5:
      Skip = 4;
      break;
    default: // groups (unused by ONNX) and invalid wire types
      return Malformed();
    }
    if (Skip > N - Pos)
      return Truncated(formatv("field {0} needs {1} bytes at offset {2}, the "
                               "file ends at {3}",
                               Field, Skip, Pos, N));
    Pos += Skip;
  }
  return R;
}

} // namespace

/// Reads and parses the model at Path, checking that it is a complete ONNX
/// model with a non-empty graph. Errors start with Path.
Expected<std::unique_ptr<onnx::ModelProto>> readModel(StringRef Path) {
  auto Buf = MemoryBuffer::getFile(Path, /*IsText=*/false,
                                   /*RequiresNullTerminator=*/false);
  if (!Buf)
    return fileError(Path,
                     "cannot read the model: " + Buf.getError().message());
  StringRef Bytes = (*Buf)->getBuffer();
  if (Bytes.size() > size_t(INT_MAX))
    return fileError(Path, "the model is larger than 2 GB, which protobuf "
                           "cannot read; store the weights as external data");
  ArrayRef<uint8_t> Data(reinterpret_cast<const uint8_t *>(Bytes.data()),
                         Bytes.size());
  WireScan Scan = scanModelWire(Data);
  if (Scan.K == WireScan::Truncated)
    return fileError(Path, "the file is truncated (" + Scan.Detail + ")");
  auto NotOnnx = [&](StringRef Why) {
    return fileError(Path, "not an ONNX model (" + Why + ")");
  };
  if (Scan.K == WireScan::Malformed)
    return NotOnnx("it does not parse as an ONNX ModelProto");

  auto Model = std::make_unique<onnx::ModelProto>();
  google::protobuf::io::CodedInputStream In(Data.data(), int(Data.size()));
  In.SetTotalBytesLimit(INT_MAX);
  if (!Model->ParseFromCodedStream(&In) || !In.ConsumedEntireMessage())
    return NotOnnx("it does not parse as an ONNX ModelProto");
  if (!Model->has_ir_version())
    return NotOnnx("it has no ir_version");
  if (!Model->has_graph())
    return NotOnnx("it has no graph");
  if (Model->graph().node_size() == 0)
    return NotOnnx("its graph has no nodes");
  return Model;
}

//===----------------------------------------------------------------------===//
// Tensors
//===----------------------------------------------------------------------===//

/// Every IR dtype and its ONNX element type, one to one.
const std::pair<int32_t, DType> ElementTypes[] = {
    {onnx::TensorProto::FLOAT, DType::F32},
    {onnx::TensorProto::FLOAT16, DType::F16},
    {onnx::TensorProto::BFLOAT16, DType::BF16},
    {onnx::TensorProto::DOUBLE, DType::F64},
    {onnx::TensorProto::INT64, DType::I64},
    {onnx::TensorProto::INT32, DType::I32},
    {onnx::TensorProto::INT8, DType::I8},
    {onnx::TensorProto::UINT8, DType::U8},
    {onnx::TensorProto::BOOL, DType::Bool},
};

std::optional<DType> dtypeOf(int32_t T) {
  for (const auto &[Onnx, D] : ElementTypes)
    if (Onnx == T)
      return D;
  return std::nullopt;
}

int32_t onnxDataType(DType D) {
  for (const auto &[Onnx, Ir] : ElementTypes)
    if (Ir == D)
      return Onnx;
  return onnx::TensorProto::UNDEFINED;
}

std::string onnxTypeName(int32_t T) {
  if (onnx::TensorProto_DataType_IsValid(T))
    return StringRef(onnx::TensorProto_DataType_Name(T)).lower();
  return "data type " + std::to_string(T);
}

/// True if a tensor of this shape has a representable size (at most 2^48
/// elements), so that element and byte counts never overflow.
bool sizeFits(ArrayRef<int64_t> Shape) {
  int64_t N = 1;
  for (int64_t D : Shape)
    if (D < 0 || __builtin_mul_overflow(N, D, &N) || N > (int64_t(1) << 48))
      return false;
  return true;
}

Expected<TensorType> tensorTypeOf(const onnx::TensorProto &T, StringRef What) {
  auto D = dtypeOf(T.data_type());
  if (!D)
    return makeError(What + " has element type " + onnxTypeName(T.data_type()) +
                     ", which is not supported");
  TensorType Ty(*D, {});
  for (int64_t Dim : T.dims()) {
    if (Dim < 0)
      return makeError(What + " has a negative dimension");
    Ty.Shape.push_back(Dim);
  }
  if (!sizeFits(Ty.Shape))
    return makeError(What + " has too many elements");
  return Ty;
}

bool isExternal(const onnx::TensorProto &T) {
  return T.data_location() == onnx::TensorProto::EXTERNAL;
}

/// Checks that a tensor stored inside the model (raw_data or the typed field
/// for its element type) holds exactly the data its type needs.
Error checkEmbedded(const onnx::TensorProto &T, const TensorType &Ty,
                    StringRef What) {
  if (T.has_raw_data()) {
    if (int64_t(T.raw_data().size()) != Ty.numBytes())
      return makeError(formatv("{0} has {1} bytes of data, {2} needs {3}",
                               What.str(), T.raw_data().size(), Ty.str(),
                               Ty.numBytes()));
    return Error::success();
  }
  int64_t Have;
  switch (Ty.Dtype) {
  case DType::F32:
    Have = T.float_data_size();
    break;
  case DType::F64:
    Have = T.double_data_size();
    break;
  case DType::I64:
    Have = T.int64_data_size();
    break;
  default: // int32_data holds i32, i8, u8, bool and the bits of f16, bf16
    Have = T.int32_data_size();
    break;
  }
  if (Have != Ty.numElements())
    return makeError(formatv("{0} has {1} elements of data, {2} needs {3}",
                             What.str(), Have, Ty.str(), Ty.numElements()));
  return Error::success();
}

/// The bytes of a tensor stored inside the model, little-endian, as
/// TensorData holds them.
Expected<std::vector<char>> embeddedBytes(const onnx::TensorProto &T,
                                          const TensorType &Ty,
                                          StringRef What) {
  if (auto E = checkEmbedded(T, Ty, What))
    return E;
  if (T.has_raw_data())
    return std::vector<char>(T.raw_data().begin(), T.raw_data().end());
  int64_t N = Ty.numElements();
  std::vector<char> B(Ty.numBytes());
  if (B.empty()) // memcpy from and to the null data of empty fields is UB
    return B;
  switch (Ty.Dtype) {
  case DType::F32:
    std::memcpy(B.data(), T.float_data().data(), B.size());
    break;
  case DType::F64:
    std::memcpy(B.data(), T.double_data().data(), B.size());
    break;
  case DType::I64:
    std::memcpy(B.data(), T.int64_data().data(), B.size());
    break;
  case DType::I32:
    std::memcpy(B.data(), T.int32_data().data(), B.size());
    break;
  case DType::F16:
  case DType::BF16:
    for (int64_t I = 0; I < N; ++I) {
      uint16_t V = uint16_t(T.int32_data(I));
      std::memcpy(B.data() + 2 * I, &V, 2);
    }
    break;
  case DType::I8:
  case DType::U8:
  case DType::Bool:
    for (int64_t I = 0; I < N; ++I)
      B[I] = char(T.int32_data(I));
    break;
  }
  return B;
}

/// Resolves the external-data entries of T against the model's folder Dir
/// (absolute). Refuses absolute locations and locations that escape Dir.
Expected<ExternalLocation> externalLocation(const onnx::TensorProto &T,
                                            const TensorType &Ty, StringRef Dir,
                                            StringRef What) {
  std::string Location;
  ExternalLocation L;
  L.Length = -1;
  for (const onnx::StringStringEntryProto &E : T.external_data()) {
    if (E.key() == "location") {
      Location = E.value();
    } else if (E.key() == "offset" || E.key() == "length") {
      int64_t V;
      if (StringRef(E.value()).getAsInteger(10, V) || V < 0)
        return makeError(formatv("external data {0} '{1}' of {2} is not a "
                                 "valid number",
                                 E.key(), E.value(), What.str()));
      (E.key() == "offset" ? L.Offset : L.Length) = V;
    }
  }
  if (Location.empty())
    return makeError(What + " has external data without a location");
  if (sys::path::is_absolute(Location, sys::path::Style::posix))
    return makeError(formatv("external data location '{0}' of {1} is an "
                             "absolute path; it must be relative to the "
                             "model folder '{2}'",
                             Location, What.str(), Dir));
  SmallString<128> Rel(Location);
  sys::path::remove_dots(Rel, /*remove_dot_dot=*/true, sys::path::Style::posix);
  if (Rel.empty() || Rel == "." || *sys::path::begin(Rel) == "..")
    return makeError(formatv("external data location '{0}' of {1} escapes "
                             "the model folder '{2}'",
                             Location, What.str(), Dir));
  SmallString<256> Full(Dir);
  sys::path::append(Full, Rel);
  L.Path = std::string(Full);
  if (L.Length < 0)
    L.Length = Ty.numBytes();
  else if (L.Length != Ty.numBytes())
    return makeError(formatv("external data of {0} has length {1}, but {2} "
                             "needs {3} bytes",
                             What.str(), L.Length, Ty.str(), Ty.numBytes()));
  return L;
}

/// Absolute, dot-free form of Path.
std::string absolutePath(StringRef Path) {
  SmallString<256> P(Path);
  sys::fs::make_absolute(P);
  sys::path::remove_dots(P, /*remove_dot_dot=*/true);
  return std::string(P);
}

//===----------------------------------------------------------------------===//
// Lazy loading of initializers embedded in model files
//===----------------------------------------------------------------------===//

/// Models parsed by the loader, by absolute path. An entry is reused while
/// the file's size and modification time are unchanged.
namespace {

class ModelCache {
public:
  struct Entry {
    uint64_t Size = 0;
    sys::TimePoint<> MTime;
    std::unique_ptr<onnx::ModelProto> Model;
    StringMap<const onnx::TensorProto *> Initializers;
  };

  static ModelCache &get() {
    static ModelCache C;
    return C;
  }

  Expected<std::shared_ptr<const Entry>> lookup(StringRef Path) {
    sys::fs::file_status Status;
    if (std::error_code EC = sys::fs::status(Path, Status))
      return fileError(Path, "cannot read the model: " + EC.message());
    std::lock_guard<std::mutex> Lock(Mutex);
    auto It = Entries.find(Path);
    if (It != Entries.end() && It->second->Size == Status.getSize() &&
        It->second->MTime == Status.getLastModificationTime())
      return It->second;
    auto Model = readModel(Path);
    if (!Model)
      return Model.takeError();
    auto E = std::make_shared<Entry>();
    E->Size = Status.getSize();
    E->MTime = Status.getLastModificationTime();
    E->Model = std::move(*Model);
    for (const onnx::TensorProto &T : E->Model->graph().initializer())
      E->Initializers.try_emplace(T.name(), &T);
    Entries[Path] = E;
    return E;
  }

  void clear() {
    std::lock_guard<std::mutex> Lock(Mutex);
    Entries.clear();
  }

private:
  std::mutex Mutex;
  StringMap<std::shared_ptr<const Entry>> Entries;
};

} // namespace

void clearModelCache() { ModelCache::get().clear(); }

/// The TensorData loader for DataRef::OnnxInitializer.
Expected<std::vector<char>> loadInitializer(StringRef Path, StringRef Name) {
  auto Entry = ModelCache::get().lookup(Path);
  if (!Entry)
    return Entry.takeError();
  auto It = (*Entry)->Initializers.find(Name);
  if (It == (*Entry)->Initializers.end())
    return fileError(Path, "the model has no initializer '" + Name + "'");
  const onnx::TensorProto &T = *It->second;
  std::string What = "initializer '" + Name.str() + "'";
  auto Ty = tensorTypeOf(T, What);
  if (!Ty)
    return fileError(Path, toString(Ty.takeError()));
  if (!isExternal(T)) {
    auto B = embeddedBytes(T, *Ty, What);
    if (!B)
      return fileError(Path, toString(B.takeError()));
    return B;
  }
  auto L = externalLocation(T, *Ty, sys::path::parent_path(Path), What);
  if (!L)
    return fileError(Path, toString(L.takeError()));
  auto Buf = MemoryBuffer::getFileSlice(L->Path, L->Length, L->Offset);
  if (!Buf)
    return makeError(formatv("cannot read external data '{0}' of {1}: {2}",
                             L->Path, What, Buf.getError().message()));
  if (int64_t((*Buf)->getBufferSize()) != L->Length)
    return makeError(formatv("external data file '{0}' is too short for {1}",
                             L->Path, What));
  return std::vector<char>((*Buf)->getBufferStart(), (*Buf)->getBufferEnd());
}


} // namespace sp::onnxio
