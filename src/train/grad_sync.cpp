// Bucketed gradient all-reduce (see grad_sync.h).
#include "train/grad_sync.h"

#include <algorithm>
#include <memory>

#include "core/autodiff.h"
#include "core/ops/view.h"

namespace lmtune {
namespace {

// Consecutive parameters whose gradients are summed in one all-reduce.
struct Bucket {
  size_t first = 0, last = 0;  // [first, last) in the parameter list
  size_t floats = 0;
};

std::vector<Bucket> plan_buckets(const std::vector<NamedParam>& params, const std::vector<double>& has_grad,
                                 size_t bucket_bytes) {
  std::vector<Bucket> out;
  Bucket b;
  for (size_t i = 0; i < params.size(); ++i) {
    if (has_grad[i] == 0) continue;
    const size_t n = size_t(params[i].tensor.numel());
    if (b.floats > 0 && (b.floats + n) * sizeof(float) > bucket_bytes) {
      out.push_back(b);
      b = Bucket{i, i, 0};
    }
    if (b.floats == 0) b.first = i;
    b.last = i + 1;
    b.floats += n;
  }
  if (b.floats > 0) out.push_back(b);
  return out;
}

// Parameters without a gradient on any rank take no room in a bucket.
void stage(const std::vector<NamedParam>& params, const Bucket& b, const std::vector<double>& has_grad,
           std::vector<float>& host) {
  host.assign(b.floats, 0.0f);
  size_t at = 0;
  for (size_t i = b.first; i < b.last; ++i) {
    if (has_grad[i] == 0) continue;
    const Tensor g = params[i].tensor.grad();
    const size_t n = size_t(params[i].tensor.numel());
    if (g.defined()) {
      const std::vector<float> v = g.to_floats();
      std::copy(v.begin(), v.end(), host.begin() + int64_t(at));
    }
    at += n;
  }
}

void unstage(const std::vector<NamedParam>& params, const Bucket& b, const std::vector<float>& host,
             const std::vector<double>& has_grad) {
  NoGrad no_grad;
  size_t at = 0;
  for (size_t i = b.first; i < b.last; ++i) {
    const Tensor& p = params[i].tensor;
    if (has_grad[i] == 0) continue;  // no rank produced one: leave it undefined, as one device would
    const size_t n = size_t(p.numel());
    std::vector<float> sum(host.begin() + int64_t(at), host.begin() + int64_t(at + n));
    at += n;
    Tensor reduced = Tensor::from_floats(sum, p.shape(), DType::f32, p.device());
    if (Tensor g = p.grad(); g.defined())
      copy_into(g, reduced);
    else
      p.impl()->grad = reduced.impl_ptr();  // this rank's micro-batches never reached the parameter
  }
}

}  // namespace

void all_reduce_gradients(const std::vector<NamedParam>& params, dist::Communicator& comm, size_t bucket_bytes) {
  if (comm.size() == 1) return;
  // Which parameters have a gradient anywhere: summed flags, so every rank plans the same buckets.
  std::vector<double> has_grad(params.size());
  for (size_t i = 0; i < params.size(); ++i) has_grad[i] = params[i].tensor.grad().defined() ? 1.0 : 0.0;
  comm.all_reduce_sum(has_grad);
  const std::vector<Bucket> buckets = plan_buckets(params, has_grad, bucket_bytes);
  // Two buckets in flight: bucket k reduces while bucket k+1 is copied off the device.
  std::vector<float> host[2];
  std::unique_ptr<dist::PendingReduce> pending[2];
  for (size_t k = 0; k <= buckets.size(); ++k) {
    if (k < buckets.size()) {
      stage(params, buckets[k], has_grad, host[k % 2]);
      pending[k % 2] = comm.start_all_reduce_sum(host[k % 2]);
    }
    if (k >= 1) {
      const size_t j = (k - 1) % 2;
      pending[j]->wait();
      unstage(params, buckets[k - 1], host[j], has_grad);
    }
  }
}

}  // namespace lmtune
