//===- Npy.cpp - NumPy .npy files and atomic file writes ------------------===//
#include "runtime/Npy.h"
#include "plan/AtomicFile.h"
#include "support/Diagnostics.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include <bit>
#include <cstring>

using namespace llvm;

namespace sp {

/// The .npy bytes of Data (float or double) with dtype Descr.
template <typename T>
static std::string npyBytesOf(ArrayRef<int64_t> Shape, ArrayRef<T> Data,
                              StringRef Descr) {
  std::string Dims;
  for (int64_t D : Shape)
    Dims += std::to_string(D) + ", ";
  if (Shape.size() > 1)
    Dims.resize(Dims.size() - 2); // "(2, 3)"; a 1-D shape keeps "(3, )"
  else if (Shape.size() == 1)
    Dims.pop_back(); // "(3,)"
  std::string Header = "{'descr': '" + Descr.str() +
                       "', 'fortran_order': False, 'shape': (" + Dims + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces
  // and ended by a newline so that the data starts 64-byte aligned.
  size_t Total = 10 + Header.size() + 1;
  Header.append((64 - Total % 64) % 64, ' ');
  Header += '\n';
  std::string R("\x93NUMPY\x01\x00", 8);
  R += char(Header.size() & 0xff);
  R += char(Header.size() >> 8);
  R += Header;
  size_t Start = R.size();
  R.resize(Start + Data.size() * sizeof(T));
  for (size_t I = 0; I < Data.size(); ++I) {
    if constexpr (sizeof(T) == 4)
      support::endian::write32le(&R[Start + 4 * I],
                                 std::bit_cast<uint32_t>(Data[I]));
    else
      support::endian::write64le(&R[Start + 8 * I],
                                 std::bit_cast<uint64_t>(Data[I]));
  }
  return R;
}

std::string npyBytes(ArrayRef<int64_t> Shape, ArrayRef<float> Data) {
  return npyBytesOf(Shape, Data, "<f4");
}

template <typename T>
static Error writeNpyOf(StringRef Path, ArrayRef<int64_t> Shape,
                        ArrayRef<T> Data, StringRef Descr) {
  int64_t N = 1;
  for (int64_t D : Shape)
    N *= D;
  assert(N == int64_t(Data.size()) && "npy shape and data disagree");
  (void)N;
  std::string Bytes = npyBytesOf(Shape, Data, Descr);
  return writeFileAtomically(Path, [&](raw_ostream &OS) { OS << Bytes; });
}

Error writeNpy(StringRef Path, ArrayRef<int64_t> Shape, ArrayRef<float> Data) {
  return writeNpyOf(Path, Shape, Data, "<f4");
}

Error writeNpy(StringRef Path, ArrayRef<int64_t> Shape,
               ArrayRef<double> Data) {
  return writeNpyOf(Path, Shape, Data, "<f8");
}

Expected<NpyArray> parseNpy(StringRef Bytes, StringRef What) {
  auto Bad = [&](const Twine &Why) {
    return makeError("'" + What + "' is not a float32 .npy file: " + Why);
  };
  if (Bytes.size() < 10 || !Bytes.startswith(StringRef("\x93NUMPY", 6)))
    return Bad("no .npy magic");
  if (Bytes[6] != 1 || Bytes[7] != 0)
    return Bad("version " + Twine(int(Bytes[6])) + "." + Twine(int(Bytes[7])) +
               ", expected 1.0");
  size_t HeaderLen = uint8_t(Bytes[8]) | (size_t(uint8_t(Bytes[9])) << 8);
  if (Bytes.size() < 10 + HeaderLen)
    return Bad("the header is cut off");
  StringRef Header = Bytes.substr(10, HeaderLen).trim();
  if (!Header.contains("'descr': '<f4'"))
    return Bad("dtype is not '<f4'");
  if (!Header.contains("'fortran_order': False"))
    return Bad("not in C order");
  size_t Open = Header.find("'shape': (");
  if (Open == StringRef::npos)
    return Bad("no shape");
  StringRef Dims = Header.substr(Open + 10);
  Dims = Dims.take_until([](char C) { return C == ')'; });
  NpyArray A;
  int64_t N = 1;
  SmallVector<StringRef, 4> Parts;
  Dims.split(Parts, ',', -1, /*KeepEmpty=*/false);
  for (StringRef P : Parts) {
    P = P.trim();
    if (P.empty())
      continue;
    int64_t D;
    if (P.getAsInteger(10, D) || D < 0)
      return Bad("bad dimension '" + P + "'");
    A.Shape.push_back(D);
    // The data must hold N floats, so N cannot exceed what the file holds;
    // checking that as we go keeps N from overflowing.
    if (__builtin_mul_overflow(N, D, &N) || N > int64_t(Bytes.size() / 4))
      return Bad("the shape needs more data than the file holds");
  }
  StringRef Data = Bytes.substr(10 + HeaderLen);
  if (int64_t(Data.size()) != N * 4)
    return Bad("the data has " + Twine(Data.size()) +
               " bytes, the shape needs " + Twine(N * 4));
  A.Data.resize(N);
  for (int64_t I = 0; I < N; ++I)
    A.Data[I] =
        std::bit_cast<float>(support::endian::read32le(Data.data() + 4 * I));
  return A;
}

Expected<NpyArray> readNpy(StringRef Path) {
  auto Buf = MemoryBuffer::getFile(Path, /*IsText=*/false,
                                   /*RequiresNullTerminator=*/false);
  if (!Buf)
    return createStringError(Buf.getError(), "cannot read '%s': %s",
                             Path.str().c_str(),
                             Buf.getError().message().c_str());
  return parseNpy((*Buf)->getBuffer(), Path);
}

} // namespace sp
