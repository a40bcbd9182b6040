//===- BackendRegistry.cpp - The backends by --device name ----------------===//
//
// See BackendRegistry.h.
//
//===----------------------------------------------------------------------===//
#include "runtime/BackendRegistry.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/Twine.h"
#include <atomic>

using namespace llvm;

namespace sp {

std::string BackendContext::flag(StringRef Name, StringRef Default) const {
  auto It = Flags.find(Name.str());
  return It == Flags.end() ? Default.str() : It->second;
}

BackendRegistry &BackendRegistry::instance() {
  static BackendRegistry *R = new BackendRegistry(); // until the process ends
  // Set first: registerCpuBackend calls back in here.
  static std::atomic<bool> Started{false};
  if (!Started.exchange(true))
    registerCpuBackend();
  return *R;
}

void BackendRegistry::add(BackendEntry E) {
  for (auto &Old : Entries)
    if (Old->Name == E.Name) {
      *Old = std::move(E);
      return;
    }
  Entries.push_back(std::make_unique<BackendEntry>(std::move(E)));
}

const BackendEntry *BackendRegistry::find(StringRef Name) const {
  for (const auto &E : Entries)
    if (E->Name == Name)
      return E.get();
  return nullptr;
}

std::vector<const BackendEntry *> BackendRegistry::entries() const {
  std::vector<const BackendEntry *> All;
  for (const auto &E : Entries)
    All.push_back(E.get());
  return All;
}

const BackendEntry *BackendRegistry::ownerOfFlag(StringRef Flag) const {
  for (const auto &E : Entries)
    if (any_of(E->Flags, [&](const BackendFlag &F) { return F.Name == Flag; }))
      return E.get();
  return nullptr;
}

std::string BackendRegistry::deviceChoices() const {
  std::vector<std::string> Choices;
  for (const auto &E : Entries) {
    Choices.push_back(E->Name);
    if (!E->IndexMeaning.empty())
      Choices.push_back(E->Name + ":N");
  }
  std::string S;
  for (size_t I = 0; I < Choices.size(); ++I)
    S += (I == 0 ? "" : I + 1 == Choices.size() ? " or " : ", ") + Choices[I];
  return S;
}

std::string BackendRegistry::deviceValueDesc() const {
  std::string S;
  for (const auto &E : Entries)
    S += (S.empty() ? "" : "|") + E->Name +
         (E->IndexMeaning.empty() ? "" : "[:N]");
  return S;
}

Expected<DeviceChoice> BackendRegistry::parseDevice(StringRef Spec) const {
  auto [Name, Index] = Spec.split(':');
  DeviceChoice C;
  C.Entry = find(Name);
  bool Ok = C.Entry != nullptr;
  if (Ok && Spec.contains(':')) {
    int N = -1;
    Ok = !C.Entry->IndexMeaning.empty() && !Index.getAsInteger(10, N) &&
         N >= 0;
    C.Index = N;
  }
  if (Ok)
    return C;
  std::string Meanings;
  for (const auto &E : Entries)
    if (!E->IndexMeaning.empty())
      Meanings += (Meanings.empty() ? " (N " : "; N ") + E->IndexMeaning;
  if (!Meanings.empty())
    Meanings += ")";
  return createStringError(inconvertibleErrorCode(),
                           Twine("--device must be ") + deviceChoices() +
                               Meanings + ", got '" + Spec + "'");
}

void BackendRegistry::setThreads(int Threads) const {
  for (const auto &E : Entries)
    if (E->SetThreads)
      E->SetThreads(Threads);
}

} // namespace sp
