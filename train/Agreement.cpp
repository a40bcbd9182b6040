//===- Agreement.cpp - Outcomes every rank of a run agrees on -------------===//
//
// See Agreement.h.
//
//===----------------------------------------------------------------------===//
#include "train/Agreement.h"

using namespace llvm;

namespace sp {

char AgreedError::ID = 0;

Error agreeOnError(Communicator *World, Error Local) {
  bool Failed = bool(Local);
  if (!World || World->size() == 1) {
    if (!Failed)
      return Error::success();
    return make_error<AgreedError>(toString(std::move(Local)));
  }
  int64_t Mine = Failed;
  std::vector<int64_t> All(World->size());
  if (auto Err = World->allGather(All.data(), &Mine, 1, CommType::I64)) {
    consumeError(std::move(Local));
    return Err;
  }
  int First = -1;
  for (int R = 0; R < World->size() && First < 0; ++R)
    if (All[R])
      First = R;
  if (First < 0)
    return Error::success(); // Local is success
  std::string Msg = Failed ? toString(std::move(Local)) : "";
  if (!Failed)
    consumeError(std::move(Local));
  if (World->rank() != First)
    Msg.clear();
  int64_t Len = Msg.size();
  if (auto Err = World->broadcast(&Len, sizeof(Len), First))
    return Err;
  Msg.resize(size_t(Len));
  if (Len)
    if (auto Err = World->broadcast(Msg.data(), Len, First))
      return Err;
  return make_error<AgreedError>(Msg);
}

Expected<std::vector<std::string>>
gatherOnRankZero(Communicator *World, std::string Mine, int Tag) {
  if (!World || World->size() == 1)
    return std::vector<std::string>{std::move(Mine)};
  if (World->rank() != 0) {
    int64_t Bytes = Mine.size();
    if (auto Err = World->send(&Bytes, sizeof Bytes, 0, Tag))
      return Err;
    if (auto Err = World->send(Mine.data(), Bytes, 0, Tag))
      return Err;
    return std::vector<std::string>{};
  }
  std::vector<std::string> All{std::move(Mine)};
  for (int R = 1; R < World->size(); ++R) {
    int64_t Bytes = 0;
    if (auto Err = World->recv(&Bytes, sizeof Bytes, R, Tag))
      return Err;
    std::string Text(size_t(Bytes), '\0');
    if (auto Err = World->recv(Text.data(), Bytes, R, Tag))
      return Err;
    All.push_back(std::move(Text));
  }
  return All;
}

} // namespace sp
