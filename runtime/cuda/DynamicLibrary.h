//===- DynamicLibrary.h - Libraries the backend loads when made -*- C++ -*-===//
//
// cuBLAS and cuBLASLt are not linked (their static initialisation would cost
// every process linking the backend, sp-run on the CPU too, about half a
// second): the backend opens them when the first backend that needs them is
// made. A process that defines their entry points already (the emulated
// runtime of tests/gpu) uses its own.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_CUDA_DYNAMICLIBRARY_H
#define SP_RUNTIME_CUDA_DYNAMICLIBRARY_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"
#include <dlfcn.h>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace sp::cuda {

/// The library that defines Probe, in H: the process itself if it does
/// (RTLD_DEFAULT, which is null), else the first of Names that dlopen
/// opens; false when none does, with Why set to dlopen's reason.
inline bool openLibrary(llvm::ArrayRef<const char *> Names,
                        const char *Probe, void *&H, std::string &Why) {
  H = RTLD_DEFAULT;
  if (dlsym(RTLD_DEFAULT, Probe))
    return true;
  for (const char *Name : Names) {
    if ((H = dlopen(Name, RTLD_NOW | RTLD_LOCAL)))
      return true;
    if (const char *E = dlerror())
      Why = E;
  }
  return false;
}

/// Fn = Symbol of H; when H has no Symbol, Missing names it.
template <typename Fn>
void bindSymbol(void *H, Fn &F, const char *Symbol, std::string &Missing) {
  F = reinterpret_cast<std::remove_reference_t<Fn>>(dlsym(H, Symbol));
  if (!F)
    Missing = Symbol;
}

/// A library the backend loads, and what its errors say.
struct LibrarySpec {
  std::vector<const char *> Names; // for dlopen, in order
  const char *Probe;               // a symbol that it defines
  const char *Option;              // what asked for it ("--device cuda")
  const char *Name;                // "cuBLAS"
  const char *Remedy;              // what to do when it cannot be loaded
};

/// The entry points Api of the library L, loaded once per process:
/// Bind(Api &, Get) calls Get(Field, "symbol") for each. A failure (the
/// library not found, or a symbol missing from it) is returned again by
/// every later call.
template <typename Api, typename BindFn>
llvm::Expected<const Api *> loadOnce(const LibrarySpec &L, BindFn Bind) {
  static std::mutex M;
  static std::optional<Api> Loaded;
  static std::string Failure;
  std::lock_guard<std::mutex> Lock(M);
  auto Failed = [&] {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s",
                                   Failure.c_str());
  };
  if (Loaded)
    return &*Loaded;
  if (!Failure.empty())
    return Failed();
  std::string Why, Missing;
  void *H = nullptr;
  if (!openLibrary(L.Names, L.Probe, H, Why)) {
    Failure = std::string(L.Option) + ": cannot load " + L.Name + " (" + Why +
              "); " + L.Remedy;
    return Failed();
  }
  Api A;
  Bind(A, [&](auto &Fn, const char *Symbol) {
    bindSymbol(H, Fn, Symbol, Missing);
  });
  if (!Missing.empty()) {
    Failure = std::string(L.Option) + ": the loaded " + L.Name + " has no " +
              Missing;
    return Failed();
  }
  Loaded = A;
  return &*Loaded;
}

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_DYNAMICLIBRARY_H
