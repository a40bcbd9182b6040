//===- TensorData.cpp -----------------------------------------------------===//
#include "ir/TensorData.h"
#include "ir/Float16.h"
#include <mutex>
#include "llvm/Support/MemoryBuffer.h"
#include <cmath>
#include <cstring>
#include <limits>

using namespace llvm;

namespace sp {

static TensorData::OnnxLoader &onnxLoader() {
  static TensorData::OnnxLoader L;
  return L;
}

void TensorData::setOnnxInitializerLoader(OnnxLoader L) {
  onnxLoader() = std::move(L);
}

std::shared_ptr<TensorData> TensorData::makeInline(TensorType T,
                                                   std::vector<char> Bytes) {
  assert(int64_t(Bytes.size()) == T.numBytes() && "inline data size mismatch");
  auto D = std::make_shared<TensorData>();
  D->Type = std::move(T);
  D->Bytes = std::make_shared<const std::vector<char>>(std::move(Bytes));
  return D;
}

std::shared_ptr<TensorData> TensorData::makeRef(TensorType T, DataRef Ref) {
  auto D = std::make_shared<TensorData>();
  D->Type = std::move(T);
  D->Ref = std::move(Ref);
  return D;
}

Expected<ArrayRef<char>> TensorData::load() const {
  // Ranks running as threads load the same parameters at once: one loads,
  // the others wait and share its bytes.
  static std::mutex LoadMutex;
  std::lock_guard<std::mutex> Lock(LoadMutex);
  if (!Bytes) {
    int64_t Want = Type.numBytes();
    switch (Ref.K) {
    case DataRef::Inline:
      return createStringError(inconvertibleErrorCode(),
                               "inline tensor has no data");
    case DataRef::External: {
      if (Ref.Length != Want)
        return createStringError(
            inconvertibleErrorCode(),
            "external data for a %s tensor in '%s' has length %lld, "
            "expected %lld",
            Type.str().c_str(), Ref.Path.c_str(), (long long)Ref.Length,
            (long long)Want);
      auto Buf = MemoryBuffer::getFileSlice(Ref.Path, Ref.Length, Ref.Offset,
                                            /*IsVolatile=*/false);
      if (!Buf)
        return createStringError(Buf.getError(),
                                 "cannot read external data '%s': %s",
                                 Ref.Path.c_str(),
                                 Buf.getError().message().c_str());
      if (int64_t((*Buf)->getBufferSize()) != Want)
        return createStringError(
            inconvertibleErrorCode(),
            "external data file '%s' is too short: need %lld bytes at "
            "offset %lld",
            Ref.Path.c_str(), (long long)Want, (long long)Ref.Offset);
      Bytes = std::make_shared<const std::vector<char>>(
          (*Buf)->getBufferStart(), (*Buf)->getBufferEnd());
      break;
    }
    case DataRef::OnnxInitializer: {
      if (!onnxLoader())
        return createStringError(inconvertibleErrorCode(),
                                 "no ONNX loader registered to read '%s'",
                                 Ref.Key.c_str());
      auto Data = onnxLoader()(Ref.Path, Ref.Key);
      if (!Data)
        return Data.takeError();
      if (int64_t(Data->size()) != Want)
        return createStringError(
            inconvertibleErrorCode(),
            "initializer '%s' in '%s' has %zu bytes, expected %lld",
            Ref.Key.c_str(), Ref.Path.c_str(), Data->size(), (long long)Want);
      Bytes = std::make_shared<const std::vector<char>>(std::move(*Data));
      break;
    }
    }
  }
  return ArrayRef<char>(Bytes->data(), Bytes->size());
}

template <typename T> static T read(const std::vector<char> &B, int64_t I) {
  T V;
  std::memcpy(&V, B.data() + I * sizeof(T), sizeof(T));
  return V;
}

double TensorData::getDouble(int64_t I) const {
  assert(Bytes && "tensor data is not loaded");
  const std::vector<char> &B = *Bytes;
  switch (Type.Dtype) {
  case DType::F32:
    return read<float>(B, I);
  case DType::F64:
    return read<double>(B, I);
  case DType::I64:
    return double(read<int64_t>(B, I));
  case DType::I32:
    return read<int32_t>(B, I);
  case DType::I8:
    return read<int8_t>(B, I);
  case DType::U8:
  case DType::Bool:
    return read<uint8_t>(B, I);
  case DType::F16:
    return halfToFloat(read<uint16_t>(B, I));
  case DType::BF16:
    return bfloat16ToFloat(read<uint16_t>(B, I));
  }
  return 0;
}

int64_t TensorData::getInt(int64_t I) const {
  assert(Bytes && "tensor data is not loaded");
  switch (Type.Dtype) {
  case DType::I64:
    return read<int64_t>(*Bytes, I);
  case DType::I32:
    return read<int32_t>(*Bytes, I);
  default: {
    // Truncated as a C cast would, saturating where the cast is undefined
    // (NaN, out of range): shape operands come from the input file.
    double D = getDouble(I);
    if (std::isnan(D))
      return 0;
    if (D >= 0x1p63)
      return std::numeric_limits<int64_t>::max();
    if (D < -0x1p63)
      return std::numeric_limits<int64_t>::min();
    return int64_t(D);
  }
  }
}

} // namespace sp
