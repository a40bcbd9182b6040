//===- Activations.cpp - What a program stores for its backward -----------===//
#include "analysis/Activations.h"
#include "analysis/Cost.h"
#include "lower/MemoryPlan.h"
#include <algorithm>

namespace sp {

int64_t ActivationReport::layerBytes(int Layer) const {
  auto It = Stored.find(Layer);
  if (It == Stored.end())
    return 0;
  int64_t Sum = 0;
  for (auto &[Role, Bytes] : It->second)
    Sum += Bytes;
  return Sum;
}

static bool isBackwardSide(Phase P) {
  return P == Phase::Backward || P == Phase::Recompute;
}


bool storedBy(const Instruction &Def, const Instruction &Reader) {
  return isBackwardSide(Reader.Ph) && Def.Ph == Phase::Forward &&
         Def.Op != OpKind::Cast;
}

ActivationReport analyzeActivations(const Program &P) {
  ActivationReport R;
  // The first backward-side reader of every temporary a forward
  // instruction defines.
  std::vector<int> FirstReader(P.Buffers.size(), -1);
  for (size_t I = 0; I < P.Instrs.size(); ++I) {
    const Instruction &In = P.Instrs[I];
    R.Layers = std::max(R.Layers, In.Layer + 1);
    double F = gemmFlops(P, In);
    switch (In.Ph) {
    case Phase::Forward:
      R.ForwardFlops += F;
      break;
    case Phase::Backward: {
      double Again = recomputeGemmFlops(P, In);
      R.BackwardFlops += F - Again;
      R.RecomputeFlops += Again;
      break;
    }
    case Phase::Recompute:
      R.RecomputeFlops += F;
      break;
    case Phase::Optimizer:
      break;
    }
    if (!isBackwardSide(In.Ph))
      continue;
    for (int B : In.In) {
      const ProgramBuffer &PB = P.Buffers[B];
      if (PB.isPersistent() || FirstReader[B] >= 0 ||
          !storedBy(P.Instrs[PB.Def], In))
        continue;
      FirstReader[B] = I;
    }
  }
  for (size_t B = 0; B < P.Buffers.size(); ++B) {
    if (FirstReader[B] < 0)
      continue;
    const Instruction &Reader = P.Instrs[FirstReader[B]];
    R.Stored[Reader.Layer][roleName(Reader.Role).str()] += P.Buffers[B].Bytes;
    R.StoredBytes += P.Buffers[B].Bytes;
  }
  R.LayerRecompute.assign(R.Layers, "none");
  for (const Instruction &In : P.Instrs)
    if (In.Ph == Phase::Recompute && In.Layer >= 0) {
      std::string &Kind = R.LayerRecompute[In.Layer];
      if (!isAttentionCoreRole(In.Role))
        Kind = "full";
      else if (Kind == "none")
        Kind = "selective";
    }
  R.StoredPeakBytes = peakLiveBytes(P, [&](const ProgramBuffer &B) {
    return FirstReader[&B - P.Buffers.data()] >= 0;
  });
  R.RecomputeTransientBytes = peakLiveBytes(P, [&](const ProgramBuffer &B) {
    return P.Instrs[B.Def].Ph == Phase::Recompute;
  });
  return R;
}

} // namespace sp
