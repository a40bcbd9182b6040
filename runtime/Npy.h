//===- Npy.h - NumPy .npy files --------------------------------*- C++ -*-===//
//
// sp-run's debugging dumps are .npy files that numpy.load reads as is:
// format version 1.0, dtype '<f4' (little-endian float32), C order. The
// reader takes exactly what the writer produces (tests, tools).
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_NPY_H
#define SP_RUNTIME_NPY_H

#include "plan/AtomicFile.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include <functional>
#include <vector>

namespace sp {

/// The .npy bytes of a float32 array of the given shape (rank 0: a scalar).
std::string npyBytes(llvm::ArrayRef<int64_t> Shape, llvm::ArrayRef<float> Data);

/// Writes a .npy file atomically. Data.size() must match the shape.
llvm::Error writeNpy(llvm::StringRef Path, llvm::ArrayRef<int64_t> Shape,
                     llvm::ArrayRef<float> Data);
/// The same as float64 ('<f8'), for the dumps of a float64 run
/// (sp-run --float64).
llvm::Error writeNpy(llvm::StringRef Path, llvm::ArrayRef<int64_t> Shape,
                     llvm::ArrayRef<double> Data);

struct NpyArray {
  llvm::SmallVector<int64_t, 4> Shape;
  std::vector<float> Data;
};

/// Reads a version 1.0 '<f4' C-order .npy file; errors name the file and
/// what is wrong with it.
llvm::Expected<NpyArray> parseNpy(llvm::StringRef Bytes, llvm::StringRef What);
llvm::Expected<NpyArray> readNpy(llvm::StringRef Path);

} // namespace sp

#endif // SP_RUNTIME_NPY_H
