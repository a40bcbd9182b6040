//===- Sample.h - Drawing the next token from logits -----------*- C++ -*-===//
//
// sp-run --sample's draw: greedy, or softmax with a temperature over the
// top-k logits, from a uniform number the caller gives (its seeded stream),
// so that a draw is a pure function of the logits and that number.
//
//===----------------------------------------------------------------------===//
#ifndef SP_RUNTIME_SAMPLE_H
#define SP_RUNTIME_SAMPLE_H

#include "llvm/ADT/ArrayRef.h"
#include <cstdint>

namespace sp {

/// The token sampling draws from Logits (one position's, over the
/// vocabulary): ids at or above Allowed are never drawn; Temperature 0 takes
/// the first most likely id; otherwise softmax(logits / Temperature) over
/// the TopK most likely ids (0: all; ties at the K-th value are kept), in
/// double, at the uniform U in [0, 1).
int64_t sampleToken(llvm::ArrayRef<float> Logits, int64_t Allowed,
                    double Temperature, int64_t TopK, double U);

} // namespace sp

#endif // SP_RUNTIME_SAMPLE_H
