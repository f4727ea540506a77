// Data parallelism's gradient exchange: after every rank has run backward over its share of a step's
// micro-batches, the trainable tensors' gradients are summed over the ranks (each rank's gradients are already
// weighted by 1 / the step's global trainable tokens, so the sum is the one-device gradient) in buckets of about
// kGradientBucketBytes, in f32. A bucket's gradients are packed side by side into one tensor on the device and
// cross to the host in one transfer; its all-reduce starts before the next bucket is packed, and the sums come
// back in one upload. The backward pass itself is not overlapped (the autodiff engine has no per-tensor
// completion hook yet).
#pragma once
#include <cstddef>
#include <vector>

#include "dist/communicator.h"
#include "train/optimizer.h"

namespace lmtune {

inline constexpr size_t kGradientBucketBytes = size_t(32) << 20;

// Sums every parameter's gradient over the ranks of `comm`, in place. A parameter without a gradient on some
// rank (its micro-batches never reached it) counts as zeros there; one without a gradient on every rank keeps
// none, as on one device. Every rank must pass the same parameters in the same order.
void all_reduce_gradients(const std::vector<NamedParam>& params, dist::Communicator& comm,
                          size_t bucket_bytes = kGradientBucketBytes);

}  // namespace lmtune
