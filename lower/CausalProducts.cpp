//===- CausalProducts.cpp - Causal structure of the attention GEMMs -------===//
//
// The program pass causal-products; what it marks and why:
// lower/CausalProducts.h.
//
//===----------------------------------------------------------------------===//
#include "lower/CausalProducts.h"
#include "lower/Peephole.h"
#include "lower/ProgramPass.h"
#include <cmath>
#include <limits>

namespace sp {

namespace {

struct Marker : Peephole {
  using Peephole::Peephole;

  bool causal(const Instruction &I) const {
    return attrInt(I.Op, I.Attrs, "causal") != 0;
  }
  double fill(const Instruction &I) const {
    return attrFloat(I.Op, I.Attrs, "fill");
  }

  /// Whether buffer B, as instruction At reads it, is zero above its
  /// diagonal (B[.., r, c] = 0 for c > r): made in this program by an
  /// instruction that guarantees it, and not written again before At. (A
  /// compact template sees the values it hands to later steps as
  /// constants; what matters is that it writes them.)
  bool zeroAbove(int B, int At, int Depth = 0) const {
    int K = Producer[B];
    if (K < 0 || K >= At || DeadInstr[K] || writtenBetween(B, K, At))
      return false;
    const Instruction &I = P.Instrs[K];
    if (I.Out.empty() || I.Out[0] != B || I.In.empty())
      return false;
    switch (I.Op) {
    case OpKind::Softmax: // a masked probability is exp(-inf) / sum = 0
      return causal(I) && fill(I) == -std::numeric_limits<double>::infinity();
    case OpKind::SoftmaxGrad: // the masked gradient is alpha * fill
      return causal(I) && fill(I) == 0 &&
             std::isfinite(attrFloat(I.Op, I.Attrs, "alpha"));
    case OpKind::CausalMask:
      return fill(I) == 0;
    case OpKind::Dropout: { // 0 * keep / (1 - ratio) = 0
      double Ratio = attrFloat(I.Op, I.Attrs, "ratio");
      return Depth < 4 && Ratio >= 0 && Ratio < 1 &&
             zeroAbove(I.In[0], K, Depth + 1);
    }
    default:
      return false;
    }
  }

  /// Whether causal softmax_grad V reads dy (its second operand) only where
  /// it multiplies y's nonzeros: its masked outputs are the fill, and dy's
  /// masked half meets y's zeros in the row dot product.
  bool ignoresMaskedDy(int V, int Dy) const {
    const Instruction &G = P.Instrs[V];
    return G.Op == OpKind::SoftmaxGrad && causal(G) && G.In.size() == 2 &&
           G.In[1] == Dy && G.In[0] != Dy && zeroAbove(G.In[0], V);
  }

  /// Whether the only reader of R (made by instruction K) ignores R's
  /// upper triangle.
  bool onlyLowerRead(int R, int K) const {
    if (!isIntermediate(R) || Producer[R] != K)
      return false;
    int U = User[R];
    if (U <= K || DeadInstr[U] || writtenBetween(R, K, U))
      return false;
    const Instruction &I = P.Instrs[U];
    if (I.Op == OpKind::Softmax) // reads the scores j <= i only
      return causal(I) && I.In.size() == 1 && I.In[0] == R;
    if (I.Op == OpKind::SoftmaxGrad)
      return ignoresMaskedDy(U, R);
    return gradIgnoresMasked(U, R); // elementwise on dy
  }

  /// Whether instruction U is a dropout_grad reading Dy as its dy whose
  /// result's only reader ignores the masked half.
  bool gradIgnoresMasked(int U, int Dy) const {
    const Instruction &I = P.Instrs[U];
    if (I.Op != OpKind::DropoutGrad || I.In.size() != 2 || I.In[0] != Dy ||
        I.In[1] == Dy || I.Out.size() != 1)
      return false;
    int G = I.Out[0];
    return isIntermediate(G) && Producer[G] == U && User[G] > U &&
           !DeadInstr[User[G]] && !writtenBetween(G, U, User[G]) &&
           ignoresMaskedDy(User[G], G);
  }

  /// A dropout of a value zero above its diagonal whose mask is read by
  /// nothing, or only by a dropout_grad whose result's reader ignores the
  /// masked half: the mask need not be drawn there (dropout {causal}).
  int markDropout(int K) {
    Instruction &I = P.Instrs[K];
    if (attrInt(I.Op, I.Attrs, "causal") || I.In.size() != 1 || I.Out.empty() ||
        I.Out.size() > 2)
      return 0;
    if (!isWide(I.In[0]) || P.Buffers[I.In[0]].Type.rank() < 2 ||
        !zeroAbove(I.In[0], K))
      return 0;
    if (I.Out.size() == 2) {
      int Mask = I.Out[1];
      if (P.Buffers[Mask].K != ProgramBuffer::Temp || Producer[Mask] != K)
        return 0;
      if (Uses[Mask] == 1) {
        int U = User[Mask];
        if (U <= K || DeadInstr[U] || writtenBetween(Mask, K, U) ||
            P.Instrs[U].In.size() != 2 || P.Instrs[U].In[1] != Mask ||
            !gradIgnoresMasked(U, P.Instrs[U].In[0]))
          return 0;
      } else if (Uses[Mask] != 0) {
        return 0;
      }
    }
    I.Attrs.set("causal", int64_t(1));
    return 1;
  }

  int mark(int K) {
    Instruction &I = P.Instrs[K];
    if (I.In.size() != 2 || I.Out.size() != 1 || !allWide(I) ||
        I.In[0] == I.Out[0] || I.In[1] == I.Out[0])
      return 0;
    int Set = 0;
    if (!attrInt(I.Op, I.Attrs, "causal_a") && zeroAbove(I.In[0], K)) {
      I.Attrs.set("causal_a", int64_t(1));
      ++Set;
    }
    if (!causal(I) && onlyLowerRead(I.Out[0], K)) {
      I.Attrs.set("causal", int64_t(1));
      ++Set;
    }
    return Set;
  }
};

} // namespace

int markCausalProducts(Program &P) {
  Marker M(P);
  return M.forEachLive([&](int K) {
    if (P.Instrs[K].Op == OpKind::BatchMatMul)
      return M.mark(K);
    if (P.Instrs[K].Op == OpKind::Dropout)
      return M.markDropout(K);
    return 0;
  });
}

std::unique_ptr<ProgramPass> createCausalProductsPass() {
  return rewritePass("causal-products", markCausalProducts);
}

} // namespace sp
