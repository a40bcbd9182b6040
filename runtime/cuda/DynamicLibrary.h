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

#include <dlfcn.h>
#include <initializer_list>
#include <string>
#include <type_traits>

namespace sp::cuda {

/// The library that defines Probe, in H: the process itself if it does
/// (RTLD_DEFAULT, which is null), else the first of Names that dlopen
/// opens; false when none does, with Why set to dlopen's reason.
inline bool openLibrary(std::initializer_list<const char *> Names,
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

} // namespace sp::cuda

#endif // SP_RUNTIME_CUDA_DYNAMICLIBRARY_H
