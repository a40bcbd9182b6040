//===- OnnxExport.cpp - Trained weights back into an ONNX model -----------===//
#include "frontend/OnnxExport.h"
#include "plan/AtomicFile.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include "onnx/onnx_pb.h"
#include <google/protobuf/io/coded_stream.h>

#include <bit>
#include <climits>

using namespace llvm;

namespace sp {

namespace {

/// Writes Bytes to Path through a temporary file beside it and a rename.
Error writeAtomically(StringRef Path, StringRef Bytes) {
  return writeFileAtomically(Path, [&](raw_ostream &OS) { OS << Bytes; });
}

/// Bytes per element of an ONNX data type (0: not a fixed-size type).
int64_t elementSize(int32_t T) {
  using TP = onnx::TensorProto;
  switch (T) {
  case TP::BOOL:
  case TP::INT8:
  case TP::UINT8:
    return 1;
  case TP::INT16:
  case TP::UINT16:
  case TP::FLOAT16:
  case TP::BFLOAT16:
    return 2;
  case TP::INT32:
  case TP::UINT32:
  case TP::FLOAT:
    return 4;
  case TP::INT64:
  case TP::UINT64:
  case TP::DOUBLE:
  case TP::COMPLEX64:
    return 8;
  case TP::COMPLEX128:
    return 16;
  default:
    return 0;
  }
}

int64_t numElements(const onnx::TensorProto &T) {
  int64_t N = 1;
  for (int64_t D : T.dims())
    N *= D;
  return N;
}

/// Reads the external data of T (relative to the model folder Dir) into its
/// raw_data.
Error inlineExternal(onnx::TensorProto &T, StringRef Dir, StringRef Source) {
  std::string Location;
  int64_t Offset = 0, Length = -1;
  for (const onnx::StringStringEntryProto &E : T.external_data()) {
    if (E.key() == "location")
      Location = E.value();
    else if (E.key() == "offset" || E.key() == "length")
      if (StringRef(E.value()).getAsInteger(10, E.key() == "offset" ? Offset
                                                                    : Length))
        return makeError(
            formatv("'{0}': external data {1} of initializer '{2}' is "
                    "not a number",
                    Source, E.key(), T.name()));
  }
  SmallString<128> Rel(Location);
  sys::path::remove_dots(Rel, /*remove_dot_dot=*/true);
  if (Location.empty() || sys::path::is_absolute(Location) ||
      *sys::path::begin(Rel) == "..")
    return makeError(formatv("'{0}': initializer '{1}' has an invalid external "
                             "data location '{2}'",
                             Source, T.name(), Location));
  if (Length < 0)
    Length = numElements(T) * elementSize(T.data_type());
  SmallString<256> Path(Dir);
  sys::path::append(Path, Rel);
  auto Buf = MemoryBuffer::getFileSlice(Path, Length, Offset);
  if (!Buf)
    return makeError(
        formatv("'{0}': cannot read the external data of initializer "
                "'{1}' from '{2}': {3}",
                Source, T.name(), Path, Buf.getError().message()));
  if (int64_t((*Buf)->getBufferSize()) != Length)
    return makeError(formatv("'{0}': external data file '{1}' is too short for "
                             "initializer '{2}'",
                             Source, Path, T.name()));
  T.clear_external_data();
  T.set_data_location(onnx::TensorProto::DEFAULT);
  T.set_raw_data((*Buf)->getBufferStart(), Length);
  return Error::success();
}

} // namespace

Error exportOnnxWeights(StringRef Source, StringRef Output,
                        const StringMap<ArrayRef<float>> &Weights,
                        const OnnxExportOptions &Opts) {
  auto Buf = MemoryBuffer::getFile(Source, /*IsText=*/false,
                                   /*RequiresNullTerminator=*/false);
  if (!Buf)
    return makeError(formatv("cannot read the source model '{0}': {1}", Source,
                             Buf.getError().message()));
  if ((*Buf)->getBufferSize() > size_t(INT_MAX))
    return makeError(
        formatv("the source model '{0}' is larger than 2 GB", Source));
  onnx::ModelProto Model;
  {
    google::protobuf::io::CodedInputStream In(
        reinterpret_cast<const uint8_t *>((*Buf)->getBufferStart()),
        int((*Buf)->getBufferSize()));
    In.SetTotalBytesLimit(INT_MAX);
    if (!Model.ParseFromCodedStream(&In) || !In.ConsumedEntireMessage() ||
        !Model.has_graph())
      return makeError(formatv("'{0}' is not an ONNX model", Source));
  }
  Buf->reset();
  SmallString<256> SourceDir(Source);
  sys::fs::make_absolute(SourceDir);
  sys::path::remove_filename(SourceDir);

  StringSet<> Replaced;
  for (onnx::TensorProto &T : *Model.mutable_graph()->mutable_initializer()) {
    auto It = Weights.find(T.name());
    if (It == Weights.end()) {
      if (T.data_location() == onnx::TensorProto::EXTERNAL)
        if (auto E = inlineExternal(T, SourceDir, Source))
          return E;
      continue;
    }
    ArrayRef<float> Data = It->second;
    if (T.data_type() != onnx::TensorProto::FLOAT)
      return makeError(
          formatv("'{0}': initializer '{1}' is not float32; cannot "
                  "write float32 weights into it",
                  Source, T.name()));
    if (numElements(T) != int64_t(Data.size()))
      return makeError(
          formatv("'{0}': initializer '{1}' has {2} elements, the new "
                  "weights have {3}",
                  Source, T.name(), numElements(T), Data.size()));
    std::string Raw(Data.size() * 4, '\0');
    for (size_t I = 0; I < Data.size(); ++I)
      support::endian::write32le(&Raw[4 * I], std::bit_cast<uint32_t>(Data[I]));
    T.clear_float_data();
    T.clear_external_data();
    T.set_data_location(onnx::TensorProto::DEFAULT);
    T.set_raw_data(std::move(Raw));
    Replaced.insert(T.name());
  }
  for (const auto &W : Weights)
    if (!Replaced.count(W.getKey()))
      return makeError(
          formatv("'{0}' has no initializer '{1}'", Source, W.getKey()));

  // Too big for one protobuf: move the large tensors to OUT.data.
  if (Model.ByteSizeLong() > Opts.MaxInlineBytes) {
    std::string DataName = (sys::path::filename(Output) + ".data").str();
    SmallString<256> DataPath(Output);
    sys::path::remove_filename(DataPath);
    sys::path::append(DataPath, DataName);
    std::string Data;
    for (onnx::TensorProto &T : *Model.mutable_graph()->mutable_initializer()) {
      if (!T.has_raw_data() || T.raw_data().size() < 1024)
        continue;
      Data.resize((Data.size() + 63) / 64 * 64, '\0');
      size_t Offset = Data.size();
      Data += T.raw_data();
      size_t Length = T.raw_data().size();
      T.clear_raw_data();
      T.set_data_location(onnx::TensorProto::EXTERNAL);
      auto Add = [&](const char *K, const std::string &V) {
        auto *E = T.add_external_data();
        E->set_key(K);
        E->set_value(V);
      };
      Add("location", DataName);
      Add("offset", std::to_string(Offset));
      Add("length", std::to_string(Length));
    }
    if (auto E = writeAtomically(DataPath, Data))
      return E;
  }
  if (Model.ByteSizeLong() > size_t(INT_MAX))
    return makeError(
        formatv("the model written to '{0}' would exceed 2 GB", Output));
  std::string Bytes;
  if (!Model.SerializeToString(&Bytes))
    return makeError(formatv("cannot serialize the model for '{0}'", Output));
  return writeAtomically(Output, Bytes);
}

} // namespace sp
