//===- OnnxProto.h - Reading ONNX files, tensors and their data -*- C++ -*-===//
//
// The importer's (frontend/OnnxImporter.cpp) lower half: reading a
// ModelProto from a file with a scan of its wire format first (so that a
// truncated or hostile file is refused with one line, not a protobuf
// abort), UTF-8 checks, the tensor types and the embedded or external data
// of initializers (external locations may not leave the model's folder),
// and the loader that reads an initializer's bytes when a parameter's data
// is first needed, through a cache of parsed models. Every error is one
// line that starts with the model's path.
//
//===----------------------------------------------------------------------===//
#ifndef SP_FRONTEND_ONNXPROTO_H
#define SP_FRONTEND_ONNXPROTO_H

#include "ir/Types.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/Error.h"
#include "onnx/onnx_pb.h"
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sp::onnxio {

/// "PATH: MSG".
llvm::Error fileError(llvm::StringRef Path, const llvm::Twine &Msg);
bool isUtf8(llvm::StringRef S);
/// S for a one-line message: control and non-UTF-8 bytes escaped.
std::string escapeForMessage(llvm::StringRef S);
/// The first string field of M that is not UTF-8: its field path and value.
std::optional<std::pair<std::string, std::string>>
findInvalidUtf8(const google::protobuf::Message &M);

/// Reads and parses the model file, refusing what protobuf would abort on.
llvm::Expected<std::unique_ptr<onnx::ModelProto>>
readModel(llvm::StringRef Path);

/// The IR dtype of an ONNX element type, if sp has one.
std::optional<DType> dtypeOf(int32_t T);
/// The ONNX element type of an IR dtype (dtypeOf's inverse).
int32_t onnxDataType(DType D);
std::string onnxTypeName(int32_t T);
/// The element count fits int64 bytes.
bool sizeFits(llvm::ArrayRef<int64_t> Shape);
llvm::Expected<TensorType> tensorTypeOf(const onnx::TensorProto &T,
                                        llvm::StringRef What);
bool isExternal(const onnx::TensorProto &T);
/// A tensor stored in the model holds exactly the data its type needs.
llvm::Error checkEmbedded(const onnx::TensorProto &T, const TensorType &Ty,
                          llvm::StringRef What);
/// The bytes of a tensor stored in the model, little-endian.
llvm::Expected<std::vector<char>> embeddedBytes(const onnx::TensorProto &T,
                                                const TensorType &Ty,
                                                llvm::StringRef What);

/// Where the external data of a tensor lives.
struct ExternalLocation {
  std::string Path; // absolute
  int64_t Offset = 0;
  int64_t Length = 0;
};
/// Resolves the external-data entries of T against the model's folder Dir
/// (absolute). Refuses absolute locations and locations that escape Dir.
llvm::Expected<ExternalLocation>
externalLocation(const onnx::TensorProto &T, const TensorType &Ty,
                 llvm::StringRef Dir, llvm::StringRef What);
/// Absolute, dot-free form of Path.
std::string absolutePath(llvm::StringRef Path);

/// The TensorData loader for DataRef::OnnxInitializer.
llvm::Expected<std::vector<char>> loadInitializer(llvm::StringRef Path,
                                                  llvm::StringRef Name);
/// Forgets the parsed models the loader keeps.
void clearModelCache();

} // namespace sp::onnxio

#endif // SP_FRONTEND_ONNXPROTO_H
